"""Recordings on disk: open, compress, write and read them; sample a live cluster into one.

Why here: the file work (gzip/zstd by suffix, written as it comes and readable however
the writer ended -- services/recording_stream.py --, a reader that skips the samples it need
not decode) and the live sampler talk to files and clients.
What a recording *is* -- its lines and the types they decode to (:class:`Sample`,
:class:`Recording`, ...) -- is plain data beside the view model, in telemetry/recording.py,
so the TUI and diagnose read it without importing a service. The monitor, diagnose, the TUI
and the twin take ``--from FILE`` as well as ``--url``; they all read a recording through
:func:`read_recording`, so a run from last night and a live cluster look the same to them.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any, Protocol

import orjson

from dualpath_cli.errors import DualPathError
from dualpath_cli.services.recording_stream import (
    FLUSH_EVERY_S,
    LineWriter,
    Tail,
    complete_lines,
)
from dualpath_cli.telemetry.recording import (
    FORMAT,
    VERSION,
    Extras,
    RecordedAudit,
    Recording,
    RecordingError,
    Sample,
    decision_from_line,
    decision_line,
    extras_from_metrics_text,
    json_line,
    sample_from_line,
    sample_line,
)
from dualpath_cli.telemetry.stories import RequestListing
from dualpath_cli.telemetry.view import ClusterView, Decision
from dualpath_cli.termination import deferred

__all__ = ["MAX_OUTCOMES", "INFLIGHT_PER_SAMPLE", "ViewSource", "read_recording",
           "write_recording", "collect", "trace_from_decisions", "shared_links"]


def _loads(raw: bytes | str) -> Any:
    """One JSON line of a recording. orjson parses the 1,152-engine samples about three
    times as fast as the standard library (diagnose over a 10-minute recording spent a
    third of its time in ``json.loads``); it raises ``json.JSONDecodeError`` subclasses."""
    return orjson.loads(raw)


#: Finished requests' stories a recording keeps (the newest; the decision ring's default).
MAX_OUTCOMES = 10_000
#: In-flight turns kept per sample (the oldest: the ones an incident is about).
INFLIGHT_PER_SAMPLE = 100


class ViewSource(Protocol):
    """What :func:`collect` needs from a client: a structural subset of the API's
    ``ClusterClient`` (api/protocol.py; services cannot import the API), so
    DualPathClient and FakeClient both fit."""

    def view(self) -> ClusterView: ...

    def decisions(self, since: int = -1) -> list[Decision]: ...

    def metrics_text(self) -> str: ...

    def requests(self, state: str = "inflight", limit: int = 100,
                 after: int | None = None) -> RequestListing: ...


# --- files -----------------------------------------------------------------------------------
def write_recording(path: Path | IO[bytes], header: dict[str, Any], samples: Iterable[Sample],
                    decisions: Sequence[Decision],
                    stories: Iterable[dict[str, Any]] = (),
                    audit: RecordedAudit | Callable[[float, float], RecordedAudit | None]
                    | None = None, *, counts: dict[str, int] | None = None,
                    flush_every_s: float = FLUSH_EVERY_S,
                    clock: Callable[[], float] = time.monotonic) -> dict[str, int]:
    """Write a recording to ``path`` as it comes (the final name from the first line on),
    or as plain lines to an open binary stream (``record -o -``: standard output).

    ``samples`` may be a generator (the live sampler): each sample is written as it comes,
    so a long window never sits in memory, followed by the decisions and ``stories``
    (finished requests' stories, by ``rid``) that appeared meanwhile; every
    ``flush_every_s`` the file is flushed (recording_stream.py), so a killed recorder loses
    seconds.
    ``decisions`` and ``stories`` may grow while the samples come (the sampler fills them).
    ``audit``: the ``audit`` line, or a call made after the samples with the first and the
    last sample's time that returns it (the live recorder reads the audit log then;
    ``None``: none is written). When the samples stop with an exception (Ctrl-C, SIGTERM,
    the cluster went away) the file is still finished (the rest, the trace and the ``end``
    line) before the exception goes on. ``counts`` (filled as it goes, so a caller whose
    run was interrupted knows them) is returned: lines of each kind written (``audit``: the
    entries written, absent without the line).
    """
    counts = {} if counts is None else counts
    counts.update({"samples": 0, "decisions": 0, "trace": 0, "outcomes": 0})
    first: float | None = None
    last: float | None = None
    written: set[int] = set()  # rids of the stories written

    def more(out: LineWriter) -> None:
        for d in decisions[counts["decisions"]:]:
            out.write(decision_line(d))
            counts["decisions"] += 1
        for story in list(stories):
            if story["rid"] not in written:
                written.add(story["rid"])
                out.write(json_line({"kind": "outcome", "rid": story["rid"], "story": story}))
                counts["outcomes"] += 1

    with LineWriter(path) as out:
        out.write(json_line({"kind": "header", "format": FORMAT, "version": VERSION,
                             **header}))
        out.flush()
        flushed = clock()
        stopped: BaseException | None = None
        try:
            for sample in samples:
                out.write(sample_line(sample))
                counts["samples"] += 1
                first = sample.at if first is None else first
                last = sample.at
                more(out)  # what the sampler fetched with it
                if clock() - flushed >= flush_every_s:
                    out.flush()
                    flushed = clock()
        except BaseException as err:  # noqa: BLE001 - the file is finished, then it goes on
            stopped = err
        with deferred():  # a second signal waits for the end line
            more(out)
            kept = audit
            if callable(audit):
                kept = audit(first, last) if first is not None and last is not None else None
            if isinstance(kept, RecordedAudit):
                out.write(json_line(kept.to_line()))
                counts["audit"] = len(kept.entries)
            for rec in _trace_records(decisions):
                out.write(json_line({"kind": "trace", "record": rec}))
                counts["trace"] += 1
            out.write(json_line({"kind": "end", **counts}))
    if stopped is not None:
        raise stopped
    return counts


def read_recording(path: str | Path, max_samples: int | None = None,
                   max_engine_samples: int | None = None,
                   on_cut: Callable[[str], None] | None = None) -> Recording:
    """Read a recording written by ``dualpath record`` (or :func:`write_recording`).

    ``max_samples`` / ``max_engine_samples``: decode at most about this many samples (or
    samples x engines, known from the first sample), evenly spaced, always the first and
    the last; the others are skipped without being parsed. Diagnose over a long window of a
    big cluster uses it (its rules judge shares of samples and first-to-last deltas, which
    an even stride keeps); ``header["samples_in_file"]`` then says how many there were.

    A recording whose writer was killed reads up to its last flush: the incomplete tail is
    dropped (``header["dropped_bytes"]``) and ``on_cut`` is called once with a line that
    says so; its served turns are rebuilt from its decisions (a clean end writes them).

    Raises:
        RecordingError: missing file, not a recording, or a bad line (``FILE:LINE: why``).
    """
    path = Path(path)
    if not path.is_file():
        raise RecordingError(f"{path}: no such recording")
    header: dict[str, Any] | None = None
    samples: list[Sample] = []
    decisions: list[Decision] = []
    trace: list[dict[str, Any]] = []
    stories: dict[int, dict[str, Any]] = {}
    audit: RecordedAudit | None = None
    complete = False
    number = 0
    stride = 1
    seen = 0
    pending: tuple[int, bytes] | None = None  # the last sample skipped (kept if it ends up last)
    tail = Tail()
    try:
        for number, raw in enumerate(complete_lines(path, tail), start=1):
            if header is not None and raw.startswith(b'{"kind":"sample"'):
                keep = seen % stride == 0
                seen += 1
                if not keep:
                    pending = (number, raw)
                    continue
                pending = None
            elif pending is not None and raw.startswith(b'{"kind":"'):
                samples.append(sample_from_line(_loads(pending[1])))
                pending = None
            if not raw.strip():
                continue
            obj = _loads(raw)
            kind = obj.get("kind") if isinstance(obj, dict) else None
            if header is None:
                if isinstance(obj, dict) and obj.get("format") == "dualpath-trace":  # ours
                    raise RecordingError(f"{path}: a dualpath trace, not a recording (a "
                                         "trace has no view of the cluster; `dualpath sim "
                                         "compare --trace` replays one)")
                if kind != "header" or obj.get("format") != FORMAT:
                    raise RecordingError(f"{path}:{number}: not a dualpath recording "
                                         f"(the first line must be a {FORMAT!r} header)")
                if obj.get("version") != VERSION:
                    raise RecordingError(f"{path}:{number}: recording version "
                                         f"{obj.get('version')!r} is not {VERSION}")
                header = obj
                stride = _stride(obj, max_samples)
            elif kind == "sample":
                samples.append(sample_from_line(obj))
                if len(samples) == 1 and max_engine_samples:
                    per = max(2, max_engine_samples // max(1, len(samples[0].view.engines)))
                    cap = per if not max_samples else min(per, max_samples)
                    stride = max(stride, _stride(header, cap))
            elif kind == "decision":
                obj.pop("kind")
                if "decision_kind" in obj:
                    obj["kind"] = obj.pop("decision_kind")
                decisions.append(decision_from_line(obj))
            elif kind == "trace":
                trace.append(obj["record"])
            elif kind == "outcome":
                stories[int(obj["rid"])] = dict(obj["story"])
            elif kind == "audit":
                audit = RecordedAudit.from_line(obj)
            elif kind == "end":
                complete = True
        if pending is not None:
            number = pending[0]
            samples.append(sample_from_line(_loads(pending[1])))
    except RecordingError:
        raise
    except (ValueError, KeyError, TypeError, IndexError) as err:
        raise RecordingError(f"{path}:{number}: bad recording line: "
                             f"{type(err).__name__}: {err}") from None
    except (OSError, EOFError) as err:
        raise RecordingError(f"{path}: cannot read: {err}") from None
    if header is None:
        raise RecordingError(f"{path}: empty file, not a dualpath recording")
    if tail.cut and on_cut is not None:
        on_cut(f"{path}: cut short (its recorder did not end cleanly): read up to its last "
               f"complete line, dropped the last {tail.dropped} bytes")
    if not trace and decisions:  # a recorder killed before its end wrote no trace lines
        trace = list(_trace_records(decisions))
    while len(stories) > MAX_OUTCOMES:  # the newest, as the recorder keeps them
        del stories[next(iter(stories))]
    header = {**header, "samples_in_file": seen, "sample_stride": stride,
              "dropped_bytes": tail.dropped}
    return Recording(header, tuple(samples), tuple(decisions), tuple(trace), complete,
                     stories, None if audit is None else audit.entries,
                     None if audit is None else audit.alpha_s_per_token)

def _stride(header: dict[str, Any], max_samples: int | None) -> int:
    """Every how many samples to decode so about ``max_samples`` are (from the header's
    window and interval; 1 when unknown)."""
    if not max_samples:
        return 1
    try:
        expected = float(header["window_s"]) / float(header["interval_s"]) + 1
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return 1
    return max(1, math.ceil(expected / max_samples))


# --- live collection -------------------------------------------------------------------------
def collect(client: ViewSource, window_s: float, interval_s: float, *,
            with_metrics: bool = True, clock: Callable[[], float] = time.monotonic,
            sleep: Callable[[float], None] = time.sleep,
            decisions_out: list[Decision] | None = None,
            stories_out: dict[int, dict[str, Any]] | None = None,
            inflight: bool = False) -> Iterator[Sample]:
    """Sample ``client`` every ``interval_s`` for ``window_s`` (at least two samples).

    Yields each :class:`Sample` as taken (so a writer streams it); decisions logged during
    the window are appended to ``decisions_out`` (fetched incrementally by seq, so the
    server's bounded ring is read before it wraps). With ``stories_out``, the stories of
    requests that finished are kept there by rid (fetched incrementally in finish order,
    the newest :data:`MAX_OUTCOMES`); with ``inflight``, each sample holds the in-flight
    listing. A server without ``GET /api/v1/requests`` (an older one) records neither.
    """
    count = max(2, int(round(window_s / interval_s)) + 1)
    since = -1
    listed = stories_out is not None or inflight  # False once the server lacks the listing
    after: int | None = None
    start = clock()
    for i in range(count):
        due = start + i * interval_s
        wait = due - clock()
        if wait > 0:
            sleep(wait)
        view = client.view()
        extras = extras_from_metrics_text(client.metrics_text()) if with_metrics else Extras()
        if decisions_out is not None:
            new = client.decisions(since)
            if i == 0:  # only what happens inside the window is evidence
                new = [d for d in new if d.at >= view.at - interval_s]
            decisions_out.extend(new)
            if new:
                since = max(since, max(d.seq for d in new))
            elif i == 0 and view.scheduler.last_decision_seq is not None:
                since = view.scheduler.last_decision_seq
        listing: dict[str, Any] | None = None
        if listed:
            try:
                if inflight:  # kept without its state (always inflight here)
                    listing = client.requests("inflight", INFLIGHT_PER_SAMPLE).to_dict()
                    listing.pop("state", None)
                if stories_out is not None:
                    after = _more_stories(client, after, stories_out,
                                          view.at - interval_s if i == 0 else None)
            except DualPathError as err:  # the client's ApiError, with the HTTP status
                if getattr(err, "status", None) not in (404, 405, 422):
                    raise
                listed = False  # an older server: no listing to record
                listing = None
        yield Sample(view.at, view, extras, listing)


def _more_stories(client: ViewSource, after: int | None, out: dict[int, dict[str, Any]],
                  since: float | None = None) -> int | None:
    """Fetch the stories of requests that finished since ``after`` (the newest page on the
    first call), a few pages at most per sample; returns the cursor. ``since`` (the first
    call's window start, the decisions' clock): a story of a turn that arrived before it
    is not this window's evidence and is left out (the cursor still moves past it)."""
    for _ in range(10):
        stories = client.requests("finished", _PAGE, after).stories
        for story in stories:
            after = int(story.rid)
            arrival = story.arrival
            if since is not None and arrival is not None and arrival < since:
                continue
            out[after] = story.to_dict()  # as served: the recording keeps the JSON
        while len(out) > MAX_OUTCOMES:
            del out[next(iter(out))]
        if len(stories) < _PAGE:
            break
    return after


_PAGE = 1000  # stories per GET /api/v1/requests?state=finished (the API's most)


# --- served turns as a trace -----------------------------------------------------------------
def _trace_records(decisions: Sequence[Decision]) -> Iterator[dict[str, Any]]:
    """The ``trace`` lines: the served turns without their block chains (a turn's chain
    repeats its conversation's so far; the decisions hold them once, as deltas, and
    services/recording_trace.py ``recorded_trace`` rebuilds them from there)."""
    trace = trace_from_decisions(decisions)
    if trace is None:
        return
    from dataclasses import replace

    from dualpath_cli.workload.trace_format import TraceHeader, encode_lines

    if trace.header.outputs_stored:
        generator = {k: v for k, v in trace.header.generator.items() if k != "blocks"}
        trace = replace(trace, header=TraceHeader(trace.header.max_len, generator),
                        trajectories=tuple(replace(t, blocks=())
                                           for t in trace.trajectories))

    for line in encode_lines(trace):
        yield json.loads(line)


def trace_from_decisions(decisions: Sequence[Decision]) -> Any:
    """The served turns as a dualpath :class:`~dualpath_cli.workload.trace_format.Trace`.

    Each turn's ``gen`` is the tokens it generated (a decision records it; the runtime
    decodes exactly that many) and its ``append`` is its prompt length minus the previous
    turn's prompt and generated tokens, so replaying the trace reproduces every prompt
    length, prefix chain and generated length. A decision from a server that did not record
    ``gen`` gets 1, its generated tokens folded into the next turn's append (prompt lengths
    and chains still replay). Requeued attempts count once; control decisions (a dynamic
    controller's moves) are not turns. ``None`` when no turn was served.

    Shared prefixes (a system prompt other conversations send too) become the trace's
    ``shared`` segments, linked from the first turns' lookups (:func:`shared_links`), so a
    replay hits them across conversations as the cluster did.
    """
    from dualpath_cli.workload.trace_format import Trace, TraceHeader
    from dualpath_cli.workload.trajectory import Trajectory, Turn

    turns_of: dict[int, dict[int, tuple[int, int | None]]] = {}
    looks: dict[int, dict[int, dict[str, Any]]] = {}  # agent -> turn -> first lookup
    firsts: dict[int, Decision] = {}
    for d in decisions:
        if d.kind != "turn":
            continue
        turns_of.setdefault(d.agent, {}).setdefault(d.turn, (d.length, d.gen))
        looks.setdefault(d.agent, {}).setdefault(d.turn, (d.inputs or {}).get("lookup") or {})
        if d.turn == 0:
            firsts.setdefault(d.agent, d)
    if not turns_of:
        return None
    shared = shared_links(firsts.values())
    block_tokens = _chain_block_tokens(looks)
    trajectories = []
    longest = 1
    folded = False
    for agent in sorted(turns_of):
        turns = []
        ctx = 0  # tokens of the trajectory so far (appends and generated)
        for _turn, (length, gen) in sorted(turns_of[agent].items()):
            if gen is None or gen < 1:
                gen, folded = 1, True
            append = max(1, length - ctx)
            turns.append(Turn(append, gen))
            ctx += append + gen
        longest = max(longest, sum(t.append + t.gen for t in turns))
        seg = shared.get(agent, ())
        if seg and seg[0][1] > turns[0].append - 1:
            seg = ()  # the replayed first turn is shorter than the prefix (a folded gen)
        chains = (_chains(looks[agent], sorted(turns_of[agent]), block_tokens)
                  if block_tokens else ())
        trajectories.append(Trajectory(agent_id=agent, turns=tuple(turns), token_seed=agent,
                                       shared=seg, blocks=chains))
    note = ("1 per turn where the server did not record it; those generated tokens folded "
            "into the next turn's append" if folded else "as generated")
    generator = {"from": "dualpath record", "gen": note}
    if block_tokens:
        generator["blocks"] = ("the runtime's block keys (first 8 bytes, 63 bits); "
                               "a turn's generated blocks are stored when it ends")
        header = TraceHeader(max_len=longest, generator=generator, block_tokens=block_tokens,
                             outputs_stored=True)
    else:
        header = TraceHeader(max_len=longest, generator=generator)
    return Trace(header, tuple(trajectories))


def _chain_block_tokens(looks: dict[int, dict[int, dict[str, Any]]]) -> int | None:
    """The block size the recorded chains are in (``None``: no turn's lookup kept its
    chain: an older server's recording)."""
    for by_turn in looks.values():
        for look in by_turn.values():
            bt = look.get("block_tokens")
            if isinstance(bt, int) and bt > 0 and isinstance(look.get("chain"), list):
                return bt
    return None


def _chains(looks: dict[int, dict[str, Any]], turns: list[int], block_tokens: int
            ) -> tuple[tuple[int, ...], ...]:
    """One agent's prompt chains, turn by turn, from its lookups' deltas (the ledger's
    ``chain_base`` ids of the previous turn's chain, then ``chain``); empty when one cannot
    be rebuilt (a turn without a chain, or one whose previous turn is not in the window):
    that agent then replays hitting its own context, as a trace without chains does."""
    out: list[tuple[int, ...]] = []
    prev: tuple[int, ...] = ()
    for i, turn in enumerate(turns):
        look = looks.get(turn) or {}
        ids, base = look.get("chain"), look.get("chain_base", 0)
        if (not isinstance(ids, list) or not isinstance(base, int)
                or look.get("block_tokens") != block_tokens
                or (base and (i == 0 or turns[i - 1] != turn - 1 or base > len(prev)))):
            return ()
        prev = (*prev[:base], *ids)
        out.append(prev)
    return tuple(out)


def shared_links(firsts: Iterable[Decision]) -> dict[int, tuple[tuple[int, int], ...]]:
    """Agent -> the shared-prefix segment its first turn opens with, from the first turns'
    decisions (their ``lookup``: ``cross_blocks``, ``cross_key``, ``lead``; the runtime's
    ledger logs them).

    The linking rule: a first turn that hit ``c`` blocks another conversation stored opens
    with the segment those blocks are, keyed by the last one's key (block keys are chained:
    an equal key is an equal prefix) and ``c`` blocks long. A first turn that hit none but
    opens with the same first block (``lead``) as such a turn stored what they hit, or
    could have: it opens with that segment too (the one hit most often in its lead group
    that fits its prompt, leaving one token to prefill). One segment per turn: nested
    prefixes (a system prompt, then a shared tool list) are linked as the longest prefix
    each turn hit, not as a chain. Turns from a server that does not log these keys link
    nothing.
    """
    hitters: dict[int, tuple[str, str, int]] = {}  # agent -> (lead, cross key, tokens)
    others: dict[int, tuple[str, int]] = {}        # agent -> (lead, prompt tokens)
    for d in firsts:
        look = d.inputs.get("lookup") or {}
        lead, key, cross = look.get("lead"), look.get("cross_key"), look.get("cross_blocks")
        if not isinstance(lead, str):
            continue
        hit_blocks = look.get("hit_blocks") or 0
        if isinstance(key, str) and isinstance(cross, int) and cross > 0 and hit_blocks:
            block = d.cached // hit_blocks
            hitters[d.agent] = (lead, key, cross * block)
        else:
            others[d.agent] = (lead, d.length)
    out: dict[int, tuple[tuple[int, int], ...]] = {}
    by_lead: dict[str, dict[tuple[str, int], int]] = {}
    for agent, (lead, key, tokens) in hitters.items():
        out[agent] = ((_segment_seed(key), tokens),)
        group = by_lead.setdefault(lead, {})
        group[(key, tokens)] = group.get((key, tokens), 0) + 1
    for agent, (lead, length) in others.items():
        fits = [(n, tokens, key) for (key, tokens), n in by_lead.get(lead, {}).items()
                if tokens < length]
        if fits:
            _, tokens, key = max(fits)
            out[agent] = ((_segment_seed(key), tokens),)
    return out


def _segment_seed(key: str) -> int:
    """A shared segment's seed from its block key (hex): below the trace format's
    ``MAX_SEED`` (2**63 - 1)."""
    return int(key, 16) >> 1
