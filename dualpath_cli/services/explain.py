"""One request's story: why it went where it went, what it hit, why it missed, where time went.

Why here: ``dualpath explain`` (a live cluster or a recording) and ``GET
/api/v1/requests/{id}`` tell the same story, so it is built once, from the request's logged
decisions (one per attempt, with their inputs: the engines' snapshots, the thresholds in
force, the prefix lookup and its miss reasons) and, when the request finished on a live
cluster, its outcome (the scheduler's timeline and what the PE and DE reported). Plain data
in, a JSON-ready dict out; :func:`render_story` prints it for people.

A recording holds the decisions only, so a story from one says what was decided and why, and
marks the outcome (reads by tier, bytes per NIC, slack, the TTFT breakdown) not available.

TTFT breakdown (seconds, summing to the TTFT on one machine, whose monotonic clock the
scheduler and engines share): ``queueing`` (the scheduler's queues until dispatch, plus the
PE's compute queue once the KV was ready), ``loading`` (dispatch until the first layer's KV
was in the PE's HBM, or every layer's without layerwise prefill), ``transfer`` (compute
waiting for later layers' KV, streamed or copied while earlier layers ran) and ``prefill``
(compute itself).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dualpath_cli.errors import UsageError
from dualpath_cli.telemetry.view import NA, Decision

__all__ = ["RequestNotFound", "explain_request", "render_story", "side_reason"]


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


def _engine(d: Decision, role: str) -> dict[str, Any]:
    """The chosen engine's snapshot before the decision (PE from the fetch, DE from its
    placement)."""
    if role == "pe":
        snaps = d.inputs.get("pe_engines", ())
        snap: dict[str, Any] = next((e for e in snaps if e.get("id") == d.pe), {})
        return {"engine": d.pe, "class": d.pe_class, **{k: snap.get(k) for k in
                                                         ("node", "seq", "tok", "read_q")}}
    snap = d.inputs.get("de_engine", {}) or {}
    return {"engine": d.de, "group": d.de_group, "class": d.de_class, "z": d.z,
            **{k: snap.get(k) for k in ("node", "seq", "tok", "read_q", "hbm_free")}}


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
    return {"queueing_s": max(0.0, disp - sub) + max(0.0, compute - ready),
            "loading_s": max(0.0, ready - disp),
            "transfer_s": bubble,
            "prefill_s": max(0.0, first - compute - bubble)}


def explain_request(rid: int, decisions: Sequence[Decision],
                    outcome: dict[str, Any] | None = None, *,
                    block_tokens: int | None = None) -> dict[str, Any]:
    """The story of request ``rid`` as a JSON-ready dict.

    Args:
        rid: the request id (the decision log's ``rid``).
        decisions: every kept decision (only ``rid``'s turn decisions are used).
        outcome: the scheduler's timeline of the finished request (``None``: running, or a
            recording).
        block_tokens: tokens per block, to turn the lookup's blocks into tokens (default:
            from the decision).

    Raises:
        RequestNotFound: no decision of ``rid`` is kept.
    """
    mine = [d for d in decisions if d.rid == rid and getattr(d, "kind", "turn") == "turn"]
    if not mine:
        raise RequestNotFound(f"request {rid}: no decision kept for it (unknown id, or "
                              "older than the decision ring)")
    mine.sort(key=lambda d: d.seq)
    d = mine[-1]
    look = d.inputs.get("lookup") or {}
    lookups = [x.inputs.get("lookup") or {} for x in mine]
    bt = block_tokens or (d.cached // look["hit_blocks"] if look.get("hit_blocks") else None)
    story: dict[str, Any] = {
        "rid": rid, "agent": d.agent, "turn": d.turn,
        "state": "finished" if outcome is not None else "running or not recorded",
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
        "ttft_split": None, "tpot_s": None, "arrival": None,
    }
    if outcome is None:
        return story
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
                            "de": de.get("de_dram_misses") or {}}
    story["nic_bytes"] = {"pe_snic_read": pe.get("pe_snic_bytes", 0),
                          "de_snic_read": de.get("de_snic_bytes", 0),
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


def render_story(story: dict[str, Any]) -> list[str]:
    """The story as lines of plain text, in the order it happened."""
    pe, de, rd, lk, th = (story["pe"], story["de"], story["read"], story["lookup"],
                          story["thresholds"])
    src = th.get("sources") or {}
    lines = [f"request {story['rid']} (agent {story['agent']}, turn {story['turn']}): "
             f"{story['state']}, {len(story['attempts'])} attempt(s)",
             f"  prompt {story['prompt_tokens']} tokens, cached {story['cached_tokens']} "
             f"tokens ({lk.get('hit_blocks', NA)} of {lk.get('blocks', NA)} blocks)"]
    if lk.get("misses"):
        parts = ", ".join(f"{n} {why}" for why, n in sorted(lk["misses"].items()))
        age = lk.get("evicted_age_s")
        parts += f" (oldest evicted {age:.1f} s old)" if age is not None else ""
        lines.append(f"  missed blocks: {parts}")
    lines += [
        f"  PE {pe['engine']} (class {pe['class'] or NA}; node {pe.get('node', NA)}, "
        f"{pe.get('seq', NA)} requests / {pe.get('tok', NA)} tokens before)",
        f"  DE {de['engine']} in group {de['group']} (class {de['class'] or NA}, "
        f"Z {de['z'] if de['z'] is not None else NA}; {de.get('seq', NA)} requests / "
        f"{de.get('tok', NA)} tokens, {de.get('hbm_free', NA)} HBM tokens free before)",
        f"  thresholds: alpha {th.get('alpha', NA)} ({src.get('alpha', NA)}), beta "
        f"{th.get('beta', NA)} ({src.get('beta', NA)}), Z {th.get('z_factor', NA)}, quota "
        f"{th.get('quota_s', NA)} s, read side {th.get('read_side', NA)}",
        f"  read side: {rd['side']} (PE {rd['pe_tokens']} tokens, DE {rd['de_tokens']} "
        f"tokens): {rd['why']}",
    ]
    hits = story.get("hits")
    if hits is None:
        lines.append("  outcome: not available (still running, or a recording)")
        return lines
    lines.append(f"  blocks hit: PE side dram {hits['pe']['dram'] or 0}, store "
                 f"{hits['pe']['store'] or 0}; DE side dram {hits['de']['dram'] or 0}, store "
                 f"{hits['de']['store'] or 0}; streamed DE->PE {hits['peer_blocks'] or 0}")
    for side, missed in (story.get("dram_misses") or {}).items():
        if missed:
            lines.append(f"  {side.upper()} DRAM buffer missed: " + ", ".join(
                f"{n} {why}" for why, n in sorted(missed.items())))
    nb = story["nic_bytes"]
    lines.append(f"  bytes: PE SNIC read {nb['pe_snic_read']}, DE SNIC read "
                 f"{nb['de_snic_read']}, DE CNIC->PE {nb['de_cnic_tx_to_pe']}, PE CNIC->DE "
                 f"{nb['pe_cnic_tx_to_de'] if nb['pe_cnic_tx_to_de'] is not None else NA}")
    slack = story.get("layer_slack_s") or []
    if slack:
        lines.append("  load-ahead slack per layer: " + ", ".join(
            f"L{i} {_s(v)}" for i, v in enumerate(slack)))
    split = story.get("ttft_split") or {}
    lines.append(f"  TTFT {_s(story.get('ttft_s'))} = queueing {_s(split.get('queueing_s'))}"
                 f" + loading {_s(split.get('loading_s'))} + transfer "
                 f"{_s(split.get('transfer_s'))} + prefill {_s(split.get('prefill_s'))}; "
                 f"TPOT {_s(story.get('tpot_s'))}")
    return lines
