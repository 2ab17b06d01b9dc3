"""One request's story: why it went where it went, what it hit, why it missed, where time went.

Why here: ``dualpath explain`` (a live cluster or a recording) and ``GET
/api/v1/requests/{id}`` tell the same story, so it is built once, from the request's logged
decisions (one per attempt, with their inputs: the engines' snapshots, the thresholds in
force, the prefix lookup and its miss reasons) and, when the request finished on a live
cluster, its outcome (the scheduler's timeline and what the PE and DE reported). Plain data
in, a JSON-ready dict out (the API's contract); readers take it as a
:class:`~dualpath_cli.telemetry.stories.RequestStory` (the API client,
:func:`story_from_recording`), which :func:`render_story` prints for people. Pure functions
over decisions and stories, like the diagnose rules, so the TUI and the API use them without
a service.

A request still in flight is told as far as it is known (``progress``: its phase, age, read
split, KV bytes to read and read, TTFT so far; once its first token is out, the PE's side of
the outcome). :func:`inflight_row` words one in-flight turn for ``GET
/api/v1/requests?state=inflight`` (and the TUI's requests screen).

A recording (``dualpath record``) holds the stories of the requests that finished while it
ran, exactly as ``GET /api/v1/requests/{id}`` served them, and the in-flight list of every
sample; :func:`story_from_recording` tells a story from one. A recording without them (an
older one, or a request that had not finished) gives the decision part only and marks the
outcome (reads by tier, bytes per NIC, slack, the TTFT breakdown) not available.

TTFT breakdown (seconds, summing to the TTFT on one machine, whose monotonic clock the
scheduler and engines share): ``queueing`` (the scheduler's queues until dispatch, plus the
PE's compute queue once the KV was ready), ``loading`` (dispatch until the first layer's KV
was in the PE's HBM, or every layer's without layerwise prefill; it ends where compute
starts, if earlier), ``transfer`` (compute waiting for layers' KV, streamed or copied while
earlier layers ran) and ``prefill``
(compute itself).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dualpath_cli.errors import UsageError
from dualpath_cli.telemetry.request_ids import parse_request_id
from dualpath_cli.telemetry.stories import InflightTurn, RequestStory
from dualpath_cli.telemetry.view import NA, Decision

if TYPE_CHECKING:
    from dualpath_cli.telemetry.recording import Recording

__all__ = ["RequestNotFound", "explain_request", "render_story", "side_reason", "PHASES",
           "inflight_row", "partial_outcome", "decisions_by_rid", "finished_stories",
           "story_from_recording", "progress_text", "unknown_id", "recorded_id"]

#: An in-flight turn's phases (the scheduler's ``in_flight``), in order, for people.
PHASES: dict[str, str] = {
    "queued": "queued in the scheduler's FIFO",
    "routed": "routed to a DE group, waiting for a DE",
    "placed": "placed on a DE, waiting for a PE",
    "prefill": "dispatched: loading its KV and prefilling",
    "decode": "first token out, decoding",
}


class RequestNotFound(UsageError):
    """No decision of that request is kept (never seen, or older than the decision ring)."""


def side_reason(d: Decision) -> str:
    """Why the read went where it went, in one sentence, from the decision's own numbers."""
    policy = str(d.inputs.get("read_side", "dualpath"))
    q = f"read queues PE node {d.pe_read_q} tokens, DE node {d.de_read_q} tokens"
    if not d.cached:
        return "nothing cached: no read"
    if d.side == "split":
        return (f"split read ({policy}): {q}; the PE reads {d.pe_tokens} tokens and the DE "
                f"{d.de_tokens} so both queues drain together")
    if policy == "dualpath":
        if d.side == "de":
            return f"{q}: the DE node's queue is shorter"
        if d.pe_read_q == d.de_read_q:
            return f"{q}: a tie goes to the PE side"
        return f"{q}: the PE node's queue is shorter"
    if policy == "round-robin":
        return f"round-robin: turn {d.inputs.get('ordinal', NA)} reads on the {d.side} side ({q})"
    if policy == "basic":
        return f"basic: the PE side always reads ({q})"
    return f"{policy}: {d.side} side ({q})"


def _node_name(d: Decision, role: str, node: Any) -> str | None:
    """The operator's name of the chosen ``role`` engine's node (``--node D0``; ``P0``/``D1``
    in a launch), as the decision kept it; a decision logged before names were kept (an
    older recording) gets the index name diagnose and top use (``D1``)."""
    kept = d.inputs.get(f"{role}_node_name")
    if kept:
        return str(kept)
    if node is None:
        return None
    return f"{role[0].upper()}{node}"


def _engine(d: Decision, role: str) -> dict[str, Any]:
    """The chosen engine's snapshot before the decision (PE from the fetch, DE from its
    placement), with its node's name (``node_name``)."""
    if role == "pe":
        snaps = d.inputs.get("pe_engines", ())
        snap: dict[str, Any] = next((e for e in snaps if e.get("id") == d.pe), {})
        return {"engine": d.pe, "class": d.pe_class, **{k: snap.get(k) for k in
                                                         ("node", "seq", "tok", "read_q")},
                "node_name": _node_name(d, "pe", snap.get("node"))}
    snap = d.inputs.get("de_engine", {}) or {}
    return {"engine": d.de, "group": d.de_group, "class": d.de_class, "z": d.z,
            **{k: snap.get(k) for k in ("node", "seq", "tok", "read_q", "hbm_free")},
            "node_name": _node_name(d, "de", snap.get("node"))}


def _node_of(part: Mapping[str, Any], letter: str) -> str:
    """A story's PE/DE node for people: its name, else (a story served before names were
    kept) the index name, else n/a."""
    name = part.get("node_name")
    if name:
        return str(name)
    node = part.get("node")
    return NA if node is None else f"{letter}{node}"


def _split(outcome: dict[str, Any]) -> dict[str, float | None]:
    """TTFT into queueing, loading, transfer and prefill (module doc); ``None`` parts when
    the PE's facts are missing."""
    none: dict[str, float | None] = dict.fromkeys(("queueing_s", "loading_s", "transfer_s",
                                                   "prefill_s"))
    pe, sub, disp = outcome.get("pe"), outcome.get("submitted"), outcome.get("dispatched")
    first = outcome.get("first_at")
    if not pe or sub is None or disp is None or first is None:
        return none
    arrived, ready = float(pe["arrived"]), float(pe["kv_ready"])
    compute, bubble = float(pe["compute"]), float(pe.get("kv_bubble_s", 0.0))
    ready = max(ready, arrived)
    # layerwise compute may start before layer 0 is loaded: its wait is in the bubble, so
    # loading ends where compute starts (else the wait would count twice)
    return {"queueing_s": max(0.0, disp - sub) + max(0.0, compute - ready),
            "loading_s": max(0.0, min(ready, compute) - disp),
            "transfer_s": bubble,
            "prefill_s": max(0.0, first - compute - bubble)}


def decisions_by_rid(decisions: Iterable[Decision], rids: Iterable[int]
                     ) -> dict[int, list[Decision]]:
    """``rids``' turn decisions in one pass over the log (oldest first per request)."""
    want = set(rids)
    out: dict[int, list[Decision]] = {}
    for d in decisions:
        if d.rid in want and d.kind == "turn":
            out.setdefault(d.rid, []).append(d)
    return out


def _side_of(cached: int, pe_tokens: int) -> str:
    if not cached:
        return "none"
    return "pe" if pe_tokens >= cached else "de" if pe_tokens <= 0 else "split"


def inflight_row(raw: Mapping[str, Any], decision: Decision | None, now: float, wall: float,
                 kv_bytes_per_token: int) -> dict[str, Any]:
    """One in-flight turn (the scheduler's ``in_flight`` row) as the API serves it.

    Args:
        raw: the scheduler's row (monotonic ``submitted``/``first_at``, the PE's facts once
            the first token is out).
        decision: the request's newest decision (``None``: not placed yet); used only when
            it is of the current attempt.
        now / wall: the monotonic and wall-clock time of the snapshot.
        kv_bytes_per_token: KV bytes of one token over all layers.

    ``bytes_to_read``/``bytes_read`` count KV bytes (cached tokens x KV bytes per token).
    ``bytes_read`` is what is known: 0 before dispatch, every cached token's KV once the
    first token is out (a prefill cannot finish without it), ``None`` while it loads (the
    engines report a request's reads with its first token, not before). Once it is out,
    ``pe_snic_bytes`` is what the PE's storage NIC read (block files: headers and alignment
    included) and ``de_to_pe_bytes`` what the DE streamed to it.
    """
    sub, first = float(raw["submitted"]), raw.get("first_at")
    phase = str(raw["phase"])
    d = decision if decision is not None and decision.attempt == raw["attempt"] else None
    placed = phase in ("prefill", "decode")
    cached = int(raw["cached"])
    pe_tokens = int(raw["pe_tokens"]) if placed else None
    to_read = cached * kv_bytes_per_token
    facts = raw.get("pe_facts") or {}
    side = None
    if placed:
        side = d.side if d is not None else _side_of(cached, pe_tokens or 0)
    return {
        "rid": raw["rid"], "agent": raw["agent"], "turn": raw["turn"],
        "attempt": raw["attempt"], "phase": phase, "arrived_at": wall - (now - sub),
        "age_s": max(0.0, now - sub),
        "pe": raw["pe"] if placed else None,
        "de": raw["de"] if raw["de"] >= 0 else None,
        "de_group": raw["de_group"] if raw["de_group"] >= 0 else None,
        "side": side, "prompt_tokens": raw["prompt_tokens"], "gen": raw.get("gen"),
        "cached_tokens": cached, "pe_tokens": pe_tokens,
        "de_tokens": cached - pe_tokens if pe_tokens is not None else None,
        "bytes_to_read": to_read,
        "bytes_read": to_read if phase == "decode" else None if phase == "prefill" else 0,
        "pe_snic_bytes": facts.get("pe_snic_bytes"),
        "de_to_pe_bytes": facts.get("peer_bytes", 0) if facts else None,
        "ttft_s": first - sub if first is not None else None,
        "waited_s": max(0.0, now - sub) if first is None else None,
        "decision_seq": d.seq if d is not None else None,
        "pe_class": d.pe_class if d is not None else None,
        "de_class": d.de_class if d is not None else None,
        # the lookup less the prompt's block ids (a replay's evidence, not the story's)
        "lookup": {k: v for k, v in (raw.get("lookup") or {}).items()
                   if k not in ("chain", "chain_base")},
    }


def partial_outcome(raw: Mapping[str, Any]) -> dict[str, Any] | None:
    """An in-flight turn's outcome so far (the PE's side, once its first token is out),
    in the form :func:`explain_request` reads; ``None`` before that."""
    if not raw.get("pe_facts") or raw.get("first_at") is None:
        return None
    return {"submitted": raw["submitted"], "dispatched": raw.get("dispatched"),
            "first_at": raw["first_at"], "pe": raw["pe_facts"]}


def finished_stories(done: Sequence[tuple[int, dict[str, Any]]],
                     decisions: Iterable[Decision], block_tokens: int | None = None,
                     aliases: Callable[[int], Sequence[str]] | None = None
                     ) -> list[dict[str, Any]]:
    """The stories of finished requests (``(rid, outcome)`` in finish order); a request
    whose decisions the ring no longer holds is left out. ``aliases``: a request's other
    ids (the OpenAI body's id, a client's ``x-request-id``)."""
    by_rid = decisions_by_rid(decisions, (rid for rid, _ in done))
    return [explain_request(rid, by_rid[rid], outcome, block_tokens=block_tokens,
                            aliases=aliases(rid) if aliases is not None else ())
            for rid, outcome in done if rid in by_rid]


def unknown_id(request_id: int | str) -> str:
    """The one line that says nothing is known of ``request_id``."""
    return (f"request {request_id}: unknown id (not an integer request id, a chatcmpl-/cmpl- "
            "id or a client's x-request-id known here)")


def _pending(rid: int, progress: Mapping[str, Any],
             block_tokens: int | None, aliases: Sequence[str]) -> dict[str, Any]:
    """The story of a turn not placed yet: what it is waiting for, its lookup."""
    look = dict(progress.get("lookup") or {})
    return {
        "rid": rid, "aliases": list(aliases), "agent": progress.get("agent"),
        "turn": progress.get("turn"),
        "state": f"in flight: {progress.get('phase')}", "attempts": [], "decided_at": None,
        "prompt_tokens": progress.get("prompt_tokens"),
        "cached_tokens": progress.get("cached_tokens"), "block_tokens": block_tokens,
        "pe": None, "de": None, "thresholds": None, "read": None,
        "lookup": {"blocks": look.get("blocks"), "hit_blocks": look.get("hit_blocks"),
                   "misses": look.get("misses", {}), "evicted_age_s": look.get("evicted_age_s"),
                   "misses_all_attempts": look.get("misses", {})},
        "hits": None, "dram_misses": None, "nic_bytes": None, "layer_slack_s": None,
        "ttft_s": None, "ttft_split": None, "tpot_s": None,
        "arrival": progress.get("arrived_at"), "progress": dict(progress),
    }


def explain_request(rid: int, decisions: Sequence[Decision],
                    outcome: dict[str, Any] | None = None, *,
                    block_tokens: int | None = None,
                    progress: Mapping[str, Any] | None = None,
                    aliases: Sequence[str] = ()) -> dict[str, Any]:
    """The story of request ``rid`` as a JSON-ready dict.

    Args:
        rid: the request id (the decision log's ``rid``).
        decisions: every kept decision (only ``rid``'s turn decisions are used).
        outcome: the scheduler's timeline of the finished request (``None``: running, or a
            recording); with ``progress``, the in-flight turn's outcome so far
            (:func:`partial_outcome`: the DE's side is not known yet).
        block_tokens: tokens per block, to turn the lookup's blocks into tokens (default:
            from the decision).
        progress: the turn's :func:`inflight_row` while it is in flight (``None``: finished,
            or not known to be running).
        aliases: the request's other ids (``aliases``: the OpenAI body's id, a client's
            ``x-request-id``), so a recording of the story finds it by them too.

    Raises:
        RequestNotFound: no decision of ``rid`` is kept and it is not in flight.
    """
    mine = [d for d in decisions if d.rid == rid and d.kind == "turn"]
    if not mine and progress is not None:
        return _pending(rid, progress, block_tokens, aliases)
    if not mine:
        raise RequestNotFound(f"request {rid}: no decision kept for it (unknown id, or "
                              "older than the decision ring)")
    mine.sort(key=lambda d: d.seq)
    d = mine[-1]
    look = d.inputs.get("lookup") or {}
    lookups = [x.inputs.get("lookup") or {} for x in mine]
    bt = block_tokens or (d.cached // look["hit_blocks"] if look.get("hit_blocks") else None)
    story: dict[str, Any] = {
        "rid": rid, "aliases": list(aliases), "agent": d.agent, "turn": d.turn,
        "state": (f"in flight: {progress.get('phase')}" if progress is not None
                  else "finished" if outcome is not None else "running or not recorded"),
        "attempts": [{"seq": x.seq, "attempt": x.attempt, "at": x.at, "pe": x.pe, "de": x.de,
                      "side": x.side, "cached": x.cached,
                      "misses": (x.inputs.get("lookup") or {}).get("misses", {})}
                     for x in mine],
        "decided_at": d.at, "prompt_tokens": d.length, "cached_tokens": d.cached,
        "block_tokens": bt,
        "pe": _engine(d, "pe"), "de": _engine(d, "de"),
        "thresholds": {k: d.inputs.get(k) for k in ("alpha", "beta", "z_factor", "quota_s",
                                                     "read_side")}
        | {"sources": d.inputs.get("sources", {})},
        "read": {"side": d.side, "pe_tokens": d.pe_tokens, "de_tokens": d.de_tokens,
                 "pe_read_q": d.pe_read_q, "de_read_q": d.de_read_q,
                 "why": side_reason(d)},
        "lookup": {"blocks": look.get("blocks"), "hit_blocks": look.get("hit_blocks"),
                   "misses": look.get("misses", {}),
                   "evicted_age_s": look.get("evicted_age_s"),
                   "misses_all_attempts": _sum([x.get("misses", {}) for x in lookups])},
        "hits": None, "dram_misses": None, "nic_bytes": None, "layer_slack_s": None, "ttft_s": None,
        "ttft_split": None, "tpot_s": None,
        "arrival": progress.get("arrived_at") if progress is not None else None,
        "progress": dict(progress) if progress is not None else None,
    }
    if outcome is None:
        return story
    running = progress is not None  # the DE's side is not reported before the turn ends
    pe = outcome.get("pe") or {}
    de = outcome.get("de") or {}
    sub, first, done = outcome.get("submitted"), outcome.get("first_at"), outcome.get("done_at")
    disp = outcome.get("dispatched")
    if sub is not None and disp is not None:
        story["arrival"] = d.at - (disp - sub)  # wall clock: decided at, less its queueing
    peer = pe.get("de_tokens", 0) // bt if bt else None
    story["hits"] = {"pe": {"dram": pe.get("pe_dram_blocks"), "store": pe.get("pe_store_blocks")},
                     "de": {"dram": de.get("de_dram_blocks"), "store": de.get("de_store_blocks")},
                     "peer_blocks": peer}
    story["dram_misses"] = {"pe": pe.get("pe_dram_misses") or {},
                            "de": None if running else de.get("de_dram_misses") or {}}
    story["nic_bytes"] = {"pe_snic_read": pe.get("pe_snic_bytes", 0),
                          "de_snic_read": None if running else de.get("de_snic_bytes", 0),
                          "de_cnic_tx_to_pe": pe.get("peer_bytes", 0),
                          "pe_cnic_tx_to_de": outcome.get("rx_from_pe")}
    story["layer_slack_s"] = pe.get("slack_s")
    if sub is not None and first is not None:
        story["ttft_s"] = first - sub
        story["ttft_split"] = _split(outcome)
    n = outcome.get("tokens_out") or 0
    if first is not None and done is not None and n > 1:
        story["tpot_s"] = (done - first) / (n - 1)
    return story


def recorded_id(rec: Recording, request_id: int | str) -> int | None:
    """The integer id ``request_id`` names in a recording: digits or a body id by
    themselves, else the request whose recorded story lists it as an alias."""
    if isinstance(request_id, str) and not request_id.isdigit():
        for rid, story in rec.stories.items():
            if request_id in (story.get("aliases") or ()):
                return rid
    return parse_request_id(request_id)


def story_from_recording(rec: Recording, request_id: int | str,
                         at: float | None = None) -> RequestStory:
    """A request's story from a recording (``request_id``: the integer id, the OpenAI
    body's id or a client's ``x-request-id``, found among the recorded stories' aliases).

    ``at``: a replay cursor's time: a request in flight at the sample there is told as it
    was then (decisions up to ``at``, the sample's in-flight row). Otherwise the story the
    recording holds for it (served by the cluster when it finished: the whole story), else
    the decision part only.

    Raises:
        RequestNotFound: the recording holds nothing of it.
    """
    rid = recorded_id(rec, request_id)
    if rid is None:
        raise RequestNotFound(unknown_id(request_id))
    decisions: Sequence[Decision] = rec.decisions
    bt = rec.header.get("block_tokens")
    if at is not None:
        decisions = [d for d in decisions if d.at <= at]
        before = [s for s in rec.samples if s.at <= at]
        inflight = before[-1].inflight if before else None
        row = next((r for r in (inflight or {}).get("requests", ()) if r.get("rid") == rid),
                   None)
        if row is not None:
            return RequestStory.from_dict(explain_request(rid, decisions, None,
                                                          block_tokens=bt, progress=row))
    story = rec.stories.get(rid)
    if story is not None:
        return RequestStory.from_dict(story)
    return RequestStory.from_dict(explain_request(rid, decisions, block_tokens=bt))


def _sum(maps: list[dict[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for m in maps:
        for k, v in m.items():
            out[k] = out.get(k, 0) + int(v)
    return out


def _s(value: float | None, unit: str = "s") -> str:
    if value is None:
        return NA
    return f"{value * 1000:.1f} ms" if unit == "s" else f"{value}{unit}"


def _b(value: int | None) -> str:
    from dualpath_cli.units import format_bytes

    return NA if value is None else format_bytes(value)


def _na(value: Any) -> str:
    return NA if value is None else str(value)


def progress_text(p: InflightTurn) -> str:
    """An in-flight turn's progress in one line (the TUI's detail, ``explain``)."""
    phase = str(p.phase)
    ttft = (f"TTFT {_s(p.ttft_s)}" if p.ttft_s is not None
            else f"no first token yet after {_s(p.waited_s)}")
    read = "loading" if p.bytes_read is None and phase == "prefill" else _b(p.bytes_read)
    attempt = p.attempt if p.attempt is not None else 0
    return (f"  in flight: {PHASES.get(phase, phase)} (attempt {attempt}, "
            f"{_s(p.age_s)} since arrival); {ttft}; KV read {read} of "
            f"{_b(p.bytes_to_read)}")


def render_story(story: RequestStory) -> list[str]:
    """The story as lines of plain text, in the order it happened."""
    pe, de, rd, lk, th = story.pe, story.de, story.read, story.lookup, story.thresholds
    progress = story.progress
    lines = [f"request {story.rid} (agent {story.agent}, turn {story.turn}): "
             f"{story.state}, {len(story.attempts)} attempt(s) placed",
             f"  prompt {story.prompt_tokens} tokens, cached {story.cached_tokens} "
             f"tokens ({_na(lk.get('hit_blocks'))} of {_na(lk.get('blocks'))} blocks)"]
    if story.aliases:
        lines.insert(1, f"  also known as: {', '.join(story.aliases)}")
    if progress:
        lines.append(progress_text(progress))
    if lk.get("misses"):
        parts = ", ".join(f"{n} {why}" for why, n in sorted(lk["misses"].items()))
        age = lk.get("evicted_age_s")
        parts += f" (oldest evicted {age:.1f} s old)" if age is not None else ""
        lines.append(f"  missed blocks: {parts}")
    if pe is None or de is None or rd is None or th is None:
        lines.append("  not placed yet: no decision logged for it (PE, DE and the read side "
                     "come with its placement)")
        return lines
    src = th.get("sources") or {}
    z_text = NA if de["z"] is None else f"{de['z']:.2f}"  # not 906.1500000000001
    lines += [
        f"  PE {pe['engine']} (class {pe['class'] or NA}; node {_node_of(pe, 'P')}, "
        f"{pe.get('seq', NA)} requests / {pe.get('tok', NA)} tokens before)",
        f"  DE {de['engine']} on node {_node_of(de, 'D')} in group {de['group']} (class "
        f"{de['class'] or NA}, "
        f"Z {z_text}; {de.get('seq', NA)} requests / "
        f"{de.get('tok', NA)} tokens, {de.get('hbm_free', NA)} HBM tokens free before)",
        f"  thresholds: alpha {th.get('alpha', NA)} ({src.get('alpha', NA)}), beta "
        f"{th.get('beta', NA)} ({src.get('beta', NA)}), Z {th.get('z_factor', NA)}, quota "
        f"{th.get('quota_s', NA)} s, read side {th.get('read_side', NA)}",
        f"  read side: {rd['side']} (PE {rd['pe_tokens']} tokens, DE {rd['de_tokens']} "
        f"tokens): {rd['why']}",
    ]
    hits = story.hits
    if hits is None:
        if not progress:
            lines.append("  outcome: not available (still running, or a recording without it)")
        elif progress.phase == "decode":
            lines.append("  outcome so far: the PE's report of it is not available here")
        else:
            lines.append("  outcome so far: none (reads by tier, bytes per NIC, slack and the "
                         "TTFT breakdown come with its first token)")
        return lines
    de_hits = ("pending (the DE reports with the last token)" if progress else
               f"dram {hits['de']['dram'] or 0}, store {hits['de']['store'] or 0}")
    lines.append(f"  blocks hit: PE side dram {hits['pe']['dram'] or 0}, store "
                 f"{hits['pe']['store'] or 0}; DE side {de_hits}; streamed DE->PE "
                 f"{hits['peer_blocks'] or 0}")
    for side, missed in (story.dram_misses or {}).items():
        if missed:
            lines.append(f"  {side.upper()} DRAM buffer missed: " + ", ".join(
                f"{n} {why}" for why, n in sorted(missed.items())))
    nb = story.nic_bytes or {}
    lines.append(f"  bytes: PE SNIC read {nb['pe_snic_read']}, DE SNIC read "
                 f"{NA if nb['de_snic_read'] is None else nb['de_snic_read']}, DE CNIC->PE "
                 f"{nb['de_cnic_tx_to_pe']}, PE CNIC->DE "
                 f"{nb['pe_cnic_tx_to_de'] if nb['pe_cnic_tx_to_de'] is not None else NA}")
    slack = story.layer_slack_s or ()
    if slack:
        lines.append("  load-ahead slack per layer: " + ", ".join(
            f"L{i} {_s(v)}" for i, v in enumerate(slack)))
    split = story.ttft_split or {}
    lines.append(f"  TTFT {_s(story.ttft_s)} = queueing {_s(split.get('queueing_s'))}"
                 f" + loading {_s(split.get('loading_s'))} + transfer "
                 f"{_s(split.get('transfer_s'))} + prefill {_s(split.get('prefill_s'))}; "
                 f"TPOT {_s(story.tpot_s)}")
    return lines
