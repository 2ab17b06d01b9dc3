"""Recordings: a window of a live cluster (views, extras, decisions, served turns) in one file.

Why one reader: the monitor, diagnose (and later the TUI) take ``--from FILE`` as well as
``--url``; they all read a recording through :func:`read_recording`, so a run from last night
and a live cluster look the same to them (a sequence of :class:`Sample` plus the decision
log).

File: JSON Lines, optionally compressed by suffix (``.gz`` gzip; ``.zst`` zstd when the
``zstandard`` module is importable). Lines, each an object with a ``kind``:

- ``header``: ``{"format": "dualpath-recording", "version": 1, "source", "interval_s", ...}``
- ``sample``: ``{"at", "view", "extras"[, "inflight"]}`` every interval; ``view`` is the
  ClusterView with
  its engines and nodes as columns (:func:`encode_view`; ``ClusterView.to_dict``'s form
  reads too);
  ``extras`` holds the facts only ``/metrics`` serves (TTFT histogram, host NIC errors and
  drops, prefetch accuracy, per-block read counts when the runtime reports them);
  ``inflight`` is ``GET /api/v1/requests?state=inflight``'s answer then (``total`` and the
  oldest :data:`INFLIGHT_PER_SAMPLE` turns; absent from older recordings and servers).
- ``decision``: one logged decision (``Decision`` fields).
- ``trace``: one line of the served turns as a dualpath trace (header first), see
  :func:`trace_from_decisions`.
- ``outcome``: ``{"rid", "story"}``, one finished request's story as ``GET
  /api/v1/requests/{id}`` served it (``dualpath explain --from``); the newest
  :data:`MAX_OUTCOMES` of the window. Readers that do not know a kind skip it, so older
  readers read newer files and a file without outcomes still reads.
- ``audit``: ``{"entries": [{"seq", "at", "token_id", "action", "old", "new"}, ...],
  "alpha_s_per_token"}``, once, after the window: the cluster's audit log
  (``/api/v1/status``) from the reach of a change before the first sample (one window
  length, at least ``diagnose.rules.CHANGE_REACH_MIN_S``) to the last sample, and alpha's
  seconds of reading per token then (status' ``alpha_s`` over ``alpha_tokens``; ``null``
  where the NICs have no rate), so a recorded change of alpha is named by its audit entry
  in the config's units. Absent from older recordings (and where the status could not be
  read): changes are then read off the samples' thresholds.
- ``end``: counts, written last (a file without it was cut short; it is still readable).
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import math
import re
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

import orjson

from dualpath_cli.errors import DualPathError, UsageError
from dualpath_cli.telemetry.view import (
    AuditEntry,
    ClusterView,
    Decision,
    EngineView,
    LayerHits,
    NodeView,
    decision_from_dict,
    view_from_dict,
)

__all__ = ["FORMAT", "VERSION", "MAX_OUTCOMES", "INFLIGHT_PER_SAMPLE", "Extras", "Sample",
           "Recording", "RecordedAudit", "RecordingError",
           "ViewSource", "open_text", "open_binary", "read_recording", "write_recording", "collect",
           "extras_from_metrics_text", "trace_from_decisions", "shared_links", "sample_line",
           "decision_line", "encode_view",
           "decode_view"]


def _loads(raw: bytes | str) -> Any:
    """One JSON line of a recording. orjson parses the 1,152-engine samples about three
    times as fast as the standard library (diagnose over a 10-minute recording spent a
    third of its time in ``json.loads``); it raises ``json.JSONDecodeError`` subclasses."""
    return orjson.loads(raw)

FORMAT = "dualpath-recording"
VERSION = 1
#: Finished requests' stories a recording keeps (the newest; the decision ring's default).
MAX_OUTCOMES = 10_000
#: In-flight turns kept per sample (the oldest: the ones an incident is about).
INFLIGHT_PER_SAMPLE = 100


class RecordingError(UsageError):
    """An unreadable recording (names the file, the line and the reason)."""


@dataclass(frozen=True, slots=True)
class Extras:
    """Facts of one sample that only ``/metrics`` serves (``None``/empty: not available).

    Args:
        ttft_buckets: the TTFT histogram as ``(upper bound, cumulative count)`` pairs.
        ttft_count / ttft_sum: its count and sum (turns since start, seconds).
        nic_errors / nic_drops: host NIC errors and drops since boot, all devices.
        prefetch_accuracy: by node (0..1).
        block_reads: store reads per block key since start, summed over nodes (hot-spot
            evidence); the runtime reports each engine's most-read blocks only.
        store_block_reads: Full Blocks read from the store since start, all nodes (what a
            block's reads are a share of); ``None`` when not reported.
        block_copy_reads: reads of a replicated block by the store root that served them
            (block key -> root -> reads since start, summed over nodes).
        cache_hit_ratio: hits over lookups by ``"<node>/<tier>"`` (the seed's cache_hit_ratio).
        prefetched_blocks: blocks read ahead by node since start (accuracy means nothing
            where it is 0).
        warm_blocks_remaining: blocks a warm-up has still to read, by node (empty: no
            engine has run one).
    """

    ttft_buckets: tuple[tuple[float, int], ...] = ()
    ttft_count: int | None = None
    ttft_sum: float | None = None
    nic_errors: int | None = None
    nic_drops: int | None = None
    prefetch_accuracy: dict[int, float] = field(default_factory=dict)
    block_reads: dict[str, int] = field(default_factory=dict)
    cache_hit_ratio: dict[str, float] = field(default_factory=dict)
    prefetched_blocks: dict[int, int] = field(default_factory=dict)
    store_block_reads: int | None = None
    block_copy_reads: dict[str, dict[str, int]] = field(default_factory=dict)
    warm_blocks_remaining: dict[int, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (inf bucket bound written as the string ``"+Inf"``)."""
        d = dataclasses.asdict(self)
        d["ttft_buckets"] = [["+Inf" if math.isinf(le) else le, c]
                             for le, c in self.ttft_buckets]
        return d


def extras_from_dict(data: dict[str, Any]) -> Extras:
    """:class:`Extras` from its JSON form."""
    return Extras(
        ttft_buckets=tuple((math.inf if le == "+Inf" else float(le), int(c))
                           for le, c in data.get("ttft_buckets", ())),
        ttft_count=data.get("ttft_count"), ttft_sum=data.get("ttft_sum"),
        nic_errors=data.get("nic_errors"), nic_drops=data.get("nic_drops"),
        prefetch_accuracy={int(k): float(v)
                           for k, v in (data.get("prefetch_accuracy") or {}).items()},
        block_reads={str(k): int(v) for k, v in (data.get("block_reads") or {}).items()},
        cache_hit_ratio={str(k): float(v)
                         for k, v in (data.get("cache_hit_ratio") or {}).items()},
        prefetched_blocks={int(k): int(v)
                           for k, v in (data.get("prefetched_blocks") or {}).items()},
        store_block_reads=data.get("store_block_reads"),
        block_copy_reads={str(k): {str(r): int(n) for r, n in v.items()}
                          for k, v in (data.get("block_copy_reads") or {}).items()},
        warm_blocks_remaining={int(k): int(v) for k, v in
                               (data.get("warm_blocks_remaining") or {}).items()})


@dataclass(frozen=True, slots=True)
class Sample:
    """One look at the cluster: the view, and the extras from ``/metrics``."""

    at: float
    view: ClusterView
    extras: Extras = Extras()
    inflight: dict[str, Any] | None = None  # the in-flight listing then (None: not known)


@dataclass(frozen=True)
class Recording:
    """A window of a cluster: samples (oldest first), decisions (by seq), served turns."""

    header: dict[str, Any]
    samples: tuple[Sample, ...]
    decisions: tuple[Decision, ...]
    trace_lines: tuple[dict[str, Any], ...] = ()
    complete: bool = True
    stories: dict[int, dict[str, Any]] = field(default_factory=dict)  # rid -> finished story
    #: the audit entries in reach of the window (None: not recorded, an older recording)
    audit: tuple[AuditEntry, ...] | None = None
    #: alpha's seconds of reading per token (None: not recorded, or the NICs have no rate)
    alpha_s_per_token: float | None = None

    @property
    def window_s(self) -> float:
        """Seconds from the first to the last sample (0 with fewer than two)."""
        return self.samples[-1].at - self.samples[0].at if len(self.samples) > 1 else 0.0


@dataclass(frozen=True)
class RecordedAudit:
    """What a recording keeps of the cluster's audit log (the ``audit`` line).

    Args:
        entries: the audit entries in reach of the window, oldest first.
        alpha_s_per_token: seconds of reading per alpha token (``None``: unknown).
    """

    entries: tuple[AuditEntry, ...]
    alpha_s_per_token: float | None = None

    def to_line(self) -> dict[str, Any]:
        """The ``audit`` line's object."""
        return {"kind": "audit", "entries": [dataclasses.asdict(a) for a in self.entries],
                "alpha_s_per_token": self.alpha_s_per_token}

    @classmethod
    def from_line(cls, obj: dict[str, Any]) -> RecordedAudit:
        """From an ``audit`` line's object."""
        per = obj.get("alpha_s_per_token")
        return cls(tuple(AuditEntry(int(a["seq"]), float(a["at"]), str(a.get("token_id", "")),
                                    str(a["action"]), dict(a.get("old") or {}),
                                    dict(a.get("new") or {}))
                         for a in obj.get("entries") or ()),
                   float(per) if isinstance(per, int | float) and per > 0 else None)


class ViewSource(Protocol):
    """What :func:`collect` needs from a client (DualPathClient and FakeClient both fit)."""

    def view(self) -> ClusterView: ...

    def decisions(self, since: int = -1) -> list[Decision]: ...

    def metrics_text(self) -> str: ...


# --- files -----------------------------------------------------------------------------------
def _zstd() -> Any:
    try:
        import zstandard
    except ImportError:
        raise UsageError("a .zst recording needs the 'zstandard' module, which is not "
                         "installed (pip install zstandard); use .jsonl.gz or .jsonl") from None
    return zstandard


def open_text(path: Path, mode: str) -> IO[str]:
    """``path`` opened as text for ``"r"`` or ``"w"``, compressed by its suffix."""
    name = path.name.lower()
    if name.endswith(".gz"):
        return gzip.open(path, mode + "t", encoding="utf-8",  # type: ignore[return-value]
                         compresslevel=6)
    if name.endswith(".zst"):
        zstd = _zstd()
        raw = path.open(mode + "b")
        stream = (zstd.ZstdDecompressor().stream_reader(raw, closefd=True) if mode == "r"
                  else zstd.ZstdCompressor(level=6).stream_writer(raw, closefd=True))
        return io.TextIOWrapper(stream, encoding="utf-8")
    return path.open(mode, encoding="utf-8")


def open_binary(path: Path) -> IO[bytes]:
    """``path`` opened for reading as bytes, decompressed by its suffix.

    Why bytes: a reader that skips most sample lines (a long window of a big cluster) need
    not decode them as text first; ``json.loads`` takes the bytes of the lines it keeps.
    """
    name = path.name.lower()
    if name.endswith(".gz"):
        return gzip.open(path, "rb")  # type: ignore[return-value]
    if name.endswith(".zst"):
        zstd = _zstd()
        return io.BufferedReader(zstd.ZstdDecompressor().stream_reader(path.open("rb"),
                                                                        closefd=True))
    return path.open("rb", buffering=1 << 20)


def _line(obj: dict[str, Any]) -> str:
    return json.dumps(obj, separators=(",", ":"), allow_nan=False) + "\n"


_ENGINE_COLS = tuple(f.name for f in dataclasses.fields(EngineView))
_NODE_COLS = tuple(f.name for f in dataclasses.fields(NodeView))
_LAYERS_AT = _ENGINE_COLS.index("layers")
_ENGINE_FIELDS = frozenset(_ENGINE_COLS)
_NODE_FIELDS = frozenset(_NODE_COLS)


def encode_view(view: ClusterView) -> dict[str, Any]:
    """A view as stored in a recording: ``ClusterView.to_dict`` with the engines and nodes
    as columns (``{"cols": [...], "rows": [[...], ...]}``; a layer is ``[layer, dram, store,
    peer, slack_s]``).

    Why: 1,152 engines repeat the same 18 keys in every sample; as rows the file is about
    half the size and decodes positionally, several times faster.
    """
    engines = []
    for e in view.engines:
        row = [getattr(e, c) for c in _ENGINE_COLS]
        row[_LAYERS_AT] = [[h.layer, h.dram, h.store, h.peer, h.slack_s] for h in e.layers]
        engines.append(row)
    nodes = [[getattr(n, c) for c in _NODE_COLS] for n in view.nodes]
    for row in nodes:
        row[2] = list(row[2])
    sched = dataclasses.asdict(view.scheduler)
    return {"at": view.at, "state": view.state, "pd": view.pd, "model": view.model,
            "uptime_s": view.uptime_s, "scheduler": sched,
            "engines": {"cols": list(_ENGINE_COLS), "rows": engines},
            "nodes": {"cols": list(_NODE_COLS), "rows": nodes}}


def decode_view(data: dict[str, Any]) -> ClusterView:
    """A view from :func:`encode_view`'s form, or from ``ClusterView.to_dict``'s."""
    engines_in, nodes_in = data["engines"], data["nodes"]
    if not isinstance(engines_in, dict):
        return _fast_view(data)
    if tuple(engines_in["cols"]) == _ENGINE_COLS:
        engines = []
        for row in engines_in["rows"]:
            row[_LAYERS_AT] = tuple([LayerHits(*x) for x in row[_LAYERS_AT]])
            engines.append(EngineView(*row))
    else:  # another writer's columns (an older or newer version): by name, once per view
        cols = engines_in["cols"]
        known = [(i, c) for i, c in enumerate(cols) if c in _ENGINE_FIELDS]
        engines = []
        for row in engines_in["rows"]:
            kw = {c: row[i] for i, c in known}
            if "layers" in kw:
                kw["layers"] = tuple([LayerHits(*x[:5]) for x in kw["layers"]])
            engines.append(EngineView(**kw))
    if tuple(nodes_in["cols"]) == _NODE_COLS:
        nodes = []
        for row in nodes_in["rows"]:
            row[2] = tuple(row[2])
            nodes.append(NodeView(*row))
    else:
        known = [(i, c) for i, c in enumerate(nodes_in["cols"]) if c in _NODE_FIELDS]
        nodes = []
        for row in nodes_in["rows"]:
            kw = {c: row[i] for i, c in known}
            kw["engines"] = tuple(kw.get("engines", ()))
            nodes.append(NodeView(**kw))
    slim = view_from_dict({**data, "engines": [], "nodes": []})
    return dataclasses.replace(slim, engines=tuple(engines), nodes=tuple(nodes))


def sample_line(sample: Sample) -> str:
    """One ``sample`` line of a recording."""
    line = {"kind": "sample", "at": sample.at, "view": encode_view(sample.view),
            "extras": sample.extras.to_dict()}
    if sample.inflight is not None:
        line["inflight"] = sample.inflight
    return _line(line)


def decision_line(d: Decision) -> str:
    """One ``decision`` line (the decision's own ``kind``, turn or control, is stored as
    ``decision_kind``: ``kind`` names the line)."""
    rec = dataclasses.asdict(d)
    kind = rec.pop("kind", None)
    if kind is not None:
        rec["decision_kind"] = kind
    return _line({"kind": "decision", **rec})


def write_recording(path: Path, header: dict[str, Any], samples: Iterable[Sample],
                    decisions: Sequence[Decision],
                    stories: Iterable[dict[str, Any]] = (),
                    audit: RecordedAudit | Callable[[float, float], RecordedAudit | None]
                    | None = None) -> dict[str, int]:
    """Write a whole recording to ``path`` (via a temporary file, renamed at the end).

    ``samples`` may be a generator (the live sampler): each sample is written as it comes,
    so a long window never sits in memory. ``stories``: finished requests' stories (read
    after the samples, so the sampler may fill them as it goes). ``audit``: the ``audit``
    line, or a call made after the samples with the first and the last sample's time that
    returns it (the live recorder reads the audit log then; ``None``: none is written).
    Returns the counts written (``audit``: the entries written, absent without the line).
    """
    tmp = path.with_name(f".part-{path.name}")  # same suffix: same compression
    counts = {"samples": 0, "decisions": 0, "trace": 0, "outcomes": 0}
    first: float | None = None
    last: float | None = None
    try:
        with open_text(tmp, "w") as out:
            out.write(_line({"kind": "header", "format": FORMAT, "version": VERSION,
                             **header}))
            for sample in samples:
                out.write(sample_line(sample))
                counts["samples"] += 1
                first = sample.at if first is None else first
                last = sample.at
            for d in decisions:
                out.write(decision_line(d))
                counts["decisions"] += 1
            kept = audit
            if callable(audit):
                kept = audit(first, last) if first is not None and last is not None else None
            if isinstance(kept, RecordedAudit):
                out.write(_line(kept.to_line()))
                counts["audit"] = len(kept.entries)
            for rec in _trace_records(decisions):
                out.write(_line({"kind": "trace", "record": rec}))
                counts["trace"] += 1
            for story in stories:
                out.write(_line({"kind": "outcome", "rid": story["rid"], "story": story}))
                counts["outcomes"] += 1
            out.write(_line({"kind": "end", **counts}))
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return counts


def _fast_view(data: dict[str, Any]) -> ClusterView:
    """``view_from_dict`` without the per-field filtering when the keys are exactly ours.

    Why: a recording of 1,152 engines over 10 minutes holds ~700K engine records; building
    them through the generic filter costs seconds. Any mismatch falls back to the tolerant
    decoder, so a newer writer's extra keys still read.
    """
    try:
        engines = tuple(
            EngineView(**{**e, "layers": tuple(LayerHits(**x) for x in e["layers"])})
            for e in data["engines"])
        nodes = tuple(NodeView(**{**n, "engines": tuple(n["engines"])})
                      for n in data["nodes"])
    except TypeError:
        return view_from_dict(data)
    slim = {**data, "engines": [], "nodes": []}
    view = view_from_dict(slim)
    return dataclasses.replace(view, engines=engines, nodes=nodes)


def read_recording(path: str | Path, max_samples: int | None = None,
                   max_engine_samples: int | None = None) -> Recording:
    """Read a recording written by ``dualpath record`` (or :func:`write_recording`).

    ``max_samples`` / ``max_engine_samples``: decode at most about this many samples (or
    samples x engines, known from the first sample), evenly spaced, always the first and
    the last; the others are skipped without being parsed. Diagnose over a long window of a
    big cluster uses it (its rules judge shares of samples and first-to-last deltas, which
    an even stride keeps); ``header["samples_in_file"]`` then says how many there were.

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
    try:
        with open_binary(path) as src:
            for number, raw in enumerate(src, start=1):
                if header is not None and raw.startswith(b'{"kind":"sample"'):
                    keep = seen % stride == 0
                    seen += 1
                    if not keep:
                        pending = (number, raw)
                        continue
                    pending = None
                elif pending is not None and raw.startswith(b'{"kind":"'):
                    samples.append(_sample(_loads(pending[1])))
                    pending = None
                if not raw.strip():
                    continue
                obj = _loads(raw)
                kind = obj.get("kind") if isinstance(obj, dict) else None
                if header is None:
                    if kind != "header" or obj.get("format") != FORMAT:
                        raise RecordingError(f"{path}:{number}: not a dualpath recording "
                                             f"(the first line must be a {FORMAT!r} header)")
                    if obj.get("version") != VERSION:
                        raise RecordingError(f"{path}:{number}: recording version "
                                             f"{obj.get('version')!r} is not {VERSION}")
                    header = obj
                    stride = _stride(obj, max_samples)
                elif kind == "sample":
                    samples.append(_sample(obj))
                    if len(samples) == 1 and max_engine_samples:
                        per = max(2, max_engine_samples // max(1, len(samples[0].view.engines)))
                        cap = per if not max_samples else min(per, max_samples)
                        stride = max(stride, _stride(header, cap))
                elif kind == "decision":
                    obj.pop("kind")
                    if "decision_kind" in obj:
                        obj["kind"] = obj.pop("decision_kind")
                    decisions.append(_decision(obj))
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
                samples.append(_sample(_loads(pending[1])))
    except RecordingError:
        raise
    except (ValueError, KeyError, TypeError, IndexError) as err:
        raise RecordingError(f"{path}:{number}: bad recording line: "
                             f"{type(err).__name__}: {err}") from None
    except (OSError, EOFError) as err:
        raise RecordingError(f"{path}: cannot read: {err}") from None
    if header is None:
        raise RecordingError(f"{path}: empty file, not a dualpath recording")
    header = {**header, "samples_in_file": seen, "sample_stride": stride}
    return Recording(header, tuple(samples), tuple(decisions), tuple(trace), complete,
                     stories, None if audit is None else audit.entries,
                     None if audit is None else audit.alpha_s_per_token)


def _decision(obj: dict[str, Any]) -> Decision:
    """A decision line: its fields straight into :class:`Decision` when they are exactly
    ours (12,000 decisions through the tolerant decoder cost a second), else by name."""
    try:
        return Decision(**obj)
    except TypeError:
        return decision_from_dict(obj)


def _sample(obj: dict[str, Any]) -> Sample:
    inflight = obj.get("inflight")
    return Sample(float(obj["at"]), decode_view(obj["view"]),
                  extras_from_dict(obj.get("extras") or {}),
                  inflight if isinstance(inflight, dict) else None)


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
    requests = _requests_of(client) if stories_out is not None or inflight else None
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
        if requests is not None:
            try:
                if inflight:
                    listing = requests("inflight", INFLIGHT_PER_SAMPLE)
                    listing.pop("state", None)
                if stories_out is not None:
                    after = _more_stories(requests, after, stories_out,
                                          view.at - interval_s if i == 0 else None)
            except DualPathError as err:  # the client's ApiError, with the HTTP status
                if getattr(err, "status", None) not in (404, 405, 422):
                    raise
                requests = None  # an older server: no listing to record
                listing = None
        yield Sample(view.at, view, extras, listing)


def _requests_of(client: Any) -> Callable[..., dict[str, Any]] | None:
    """The client's ``requests`` call (``GET /api/v1/requests``), if it has one."""
    call = getattr(client, "requests", None)
    return call if callable(call) else None


def _more_stories(requests: Callable[..., dict[str, Any]], after: int | None,
                  out: dict[int, dict[str, Any]], since: float | None = None) -> int | None:
    """Fetch the stories of requests that finished since ``after`` (the newest page on the
    first call), a few pages at most per sample; returns the cursor. ``since`` (the first
    call's window start, the decisions' clock): a story of a turn that arrived before it
    is not this window's evidence and is left out (the cursor still moves past it)."""
    for _ in range(10):
        page = requests("finished", _PAGE, after)
        stories = page.get("requests") or []
        for story in stories:
            after = int(story["rid"])
            arrival = story.get("arrival")
            if since is not None and arrival is not None and arrival < since:
                continue
            out[after] = story
        while len(out) > MAX_OUTCOMES:
            del out[next(iter(out))]
        if len(stories) < _PAGE:
            break
    return after


_PAGE = 1000  # stories per GET /api/v1/requests?state=finished (the API's most)


# --- /metrics extras -------------------------------------------------------------------------
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def _labels(text: str | None) -> dict[str, str]:
    return dict(_LABEL.findall(text or ""))


def extras_from_metrics_text(text: str) -> Extras:
    """The :class:`Extras` in a Prometheus exposition (families absent: not available)."""
    buckets: dict[float, int] = {}
    count: int | None = None
    total: float | None = None
    errors: int | None = None
    drops: int | None = None
    prefetch: dict[int, float] = {}
    blocks: dict[str, int] = {}
    hits: dict[str, float] = {}
    prefetched: dict[int, int] = {}
    store_reads: int | None = None
    copy_reads: dict[str, dict[str, int]] = {}  # block -> root -> reads
    warm: dict[int, int] = {}  # node -> blocks a warm-up has still to read
    for line in text.splitlines():
        if not line.startswith("dualpath_"):
            continue
        m = _SAMPLE.match(line)
        if m is None:
            continue
        name, labels, raw = m.group(1), m.group(2), m.group(3)
        try:
            value = float(raw)
        except ValueError:
            continue
        if name == "dualpath_ttft_seconds_bucket":
            le = _labels(labels).get("le", "+Inf")
            buckets[math.inf if le == "+Inf" else float(le)] = int(value)
        elif name == "dualpath_ttft_seconds_count":
            count = int(value)
        elif name == "dualpath_ttft_seconds_sum":
            total = value
        elif name == "dualpath_host_nic_errors_total":
            errors = (errors or 0) + int(value)
        elif name == "dualpath_host_nic_drops_total":
            drops = (drops or 0) + int(value)
        elif name == "dualpath_prefetch_accuracy_ratio" and math.isfinite(value):
            node = _labels(labels).get("node")
            if node is not None and node.lstrip("-").isdigit():
                prefetch[int(node)] = value
        elif name == "dualpath_storage_cache_hit_ratio" and math.isfinite(value):
            lab = _labels(labels)
            hits[f"{lab.get('node', '?')}/{lab.get('tier', '?')}"] = value
        elif name == "dualpath_storage_prefetched_blocks_total":
            node = _labels(labels).get("node")
            if node is not None and node.lstrip("-").isdigit():
                prefetched[int(node)] = int(value)
        elif name == "dualpath_storage_block_reads_total":
            key = _labels(labels).get("block")
            if key:  # one series per node that reads the block
                blocks[key] = blocks.get(key, 0) + int(value)
        elif name == "dualpath_storage_read_blocks_total":
            store_reads = (store_reads or 0) + int(value)
        elif name == "dualpath_storage_warm_blocks_remaining":
            node = _labels(labels).get("node")
            if node is not None and node.lstrip("-").isdigit():
                warm[int(node)] = warm.get(int(node), 0) + int(value)
        elif name == "dualpath_storage_block_copy_reads_total":
            lab = _labels(labels)
            per_root = copy_reads.setdefault(lab.get("block", "?"), {})
            root = lab.get("root", "?")
            per_root[root] = per_root.get(root, 0) + int(value)
    return Extras(tuple(sorted(buckets.items())), count, total, errors, drops, prefetch,
                  blocks, hits, prefetched, store_reads, copy_reads, warm)


# --- served turns as a trace -----------------------------------------------------------------
def _trace_records(decisions: Sequence[Decision]) -> Iterator[dict[str, Any]]:
    trace = trace_from_decisions(decisions)
    if trace is None:
        return
    from dualpath_cli.workload.trace_format import encode_lines

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
    firsts: dict[int, Decision] = {}
    for d in decisions:
        if getattr(d, "kind", "turn") != "turn":
            continue
        turns_of.setdefault(d.agent, {}).setdefault(d.turn, (d.length, d.gen))
        if d.turn == 0:
            firsts.setdefault(d.agent, d)
    if not turns_of:
        return None
    shared = shared_links(firsts.values())
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
        trajectories.append(Trajectory(agent_id=agent, turns=tuple(turns), token_seed=agent,
                                       shared=seg))
    note = ("1 per turn where the server did not record it; those generated tokens folded "
            "into the next turn's append" if folded else "as generated")
    header = TraceHeader(max_len=longest, generator={"from": "dualpath record", "gen": note})
    return Trace(header, tuple(trajectories))


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
