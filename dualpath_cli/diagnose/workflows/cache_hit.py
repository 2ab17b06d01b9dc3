"""Cache hits: prefix hits per turn and per layer, prefetch accuracy, and the KV waits
(bubbles) of layerwise prefill.

A pure function over :class:`~dualpath_cli.diagnose.model.Evidence` (diagnose/rules.py
runs it); thresholds are diagnose/thresholds.py's.
"""

from __future__ import annotations

import statistics
from typing import Any

from dualpath_cli.diagnose.grading import CRITICAL, OK, WARNING, mean_of, no_samples, pct, values_of
from dualpath_cli.diagnose.model import Evidence, Finding, engine_name, node_name
from dualpath_cli.diagnose.thresholds import (
    BUBBLE_LAYERS_CRIT,
    BUBBLE_TOLERANCE_S,
    KV_WAIT_WARN_S,
    PREFETCH_ACCURACY_WARN,
    PREFETCH_MIN_BLOCKS,
)
from dualpath_cli.diagnose.verdict import RULES, judge, not_enough
from dualpath_cli.telemetry.view import LayerHits

__all__ = ["cache_hit", "layer_table", "kv_waits"]


def layer_table(ev: Evidence) -> list[dict[str, Any]]:
    """Per layer over the window: blocks by tier (and shares), median and worst slack."""
    first: dict[tuple[int, int], tuple[int, int, int]] = {}
    for e in ev.samples[0].view.engines if len(ev.samples) > 1 else ():
        for h in e.layers:
            first[(e.engine_id, h.layer)] = (h.dram, h.store, h.peer)
    acc: dict[int, list[Any]] = {}
    for e in ev.last.engines:
        for h in e.layers:
            d0, s0, p0 = first.get((e.engine_id, h.layer), (0, 0, 0))
            row = acc.setdefault(h.layer, [0, 0, 0, []])
            row[0] += h.dram - d0
            row[1] += h.store - s0
            row[2] += h.peer - p0
    # slack: each engine's last prefill as seen by every sample (one prefill is noise); the
    # same prefill seen by consecutive samples counts once
    last_seen: dict[int, tuple[LayerHits, ...]] = {}
    for s in ev.samples:
        for e in s.view.engines:
            layers = e.layers
            if not layers:
                continue
            prev = last_seen.get(e.engine_id)
            last_seen[e.engine_id] = layers
            for i, h in enumerate(layers):
                if h.slack_s is None or h.layer not in acc:
                    continue
                if prev is not None and i < len(prev) and prev[i].slack_s == h.slack_s:
                    continue
                acc[h.layer][3].append(h.slack_s)
    rows = []
    for layer in sorted(acc):
        dram, store, peer, slacks = acc[layer]
        total = dram + store + peer
        rows.append({"layer": layer, "dram": dram, "store": store, "peer": peer,
                     "dram_share": dram / total if total else None,
                     "store_share": store / total if total else None,
                     "peer_share": peer / total if total else None,
                     "slack_s": statistics.median(slacks) if slacks else None,
                     "worst_slack_s": min(slacks) if slacks else None})
    return rows


def cache_hit(ev: Evidence, by_layer: bool = False) -> list[Finding]:
    """Prefix hits of follow-up turns, layers whose KV arrives after compute starts,
    prefetch accuracy; ``by_layer`` adds the per-layer table to the evidence."""
    wf = "cache-hit"
    if not ev.samples:
        return [no_samples(wf)]
    out: list[Finding] = []
    follow = [d for d in ev.decisions if d.turn > 0 and d.attempt == 0]
    rule = RULES["prefix-hit"]
    prompt = sum(d.length for d in follow)
    cached = sum(d.cached for d in follow)
    ratio = cached / prompt if prompt else 0.0
    v = judge(rule, ratio, len(follow), ev.previous, None, shown=f"{pct(ratio)} cached")
    if v is None:
        out.append(not_enough(rule, len(follow), "prefix hits of follow-up turns"))
    else:
        out.append(Finding(
            wf, v.severity,
            f"follow-up turns found {pct(ratio)} of their prompt tokens cached "
            f"({len(follow)} turns)", evidence={"prefix_hit_ratio": round(ratio, 4),
                                                "turns": len(follow)},
            cause=("the prefix store lost blocks (evicted, gc, capacity) or sessions are not "
                   "kept on their chain") if v.severity else None,
            action="dualpath storage verify <store>; dualpath-monitor --metric cache_hit "
                   "--by-layer" if v.severity else None, rule=rule.name, why=v.why))
    rows = layer_table(ev)
    judged = [r for r in rows if r["layer"] > 0]  # layer 0 has no layer to overlap with
    late = [r for r in judged
            if r["slack_s"] is not None and r["slack_s"] < -BUBBLE_TOLERANCE_S]
    if judged:
        sev = (CRITICAL if len(late) >= max(1, BUBBLE_LAYERS_CRIT * len(judged)) else
               WARNING if late else OK)
        text = (f"{len(late)} of {len(judged)} layers load after compute starts (worst slack "
                f"{min(r['slack_s'] for r in late) * 1e3:.1f} ms, layers "
                f"{', '.join(str(r['layer']) for r in late[:8])})" if late else
                f"layers 1..{len(rows) - 1} loaded ahead of compute (median slack >= "
                f"-{BUBBLE_TOLERANCE_S * 1e3:g} ms)")
        evidence: dict[str, Any] = {"late_layers": [r["layer"] for r in late]}
        if by_layer:
            evidence["layers"] = rows
        out.append(Finding(wf, sev, text, evidence=evidence,
                           cause="storage reads slower than layer compute (a slow storage "
                                 "NIC, or too little read-ahead)" if late else None,
                           action="dualpath diagnose snic-imbalance --window 60s"
                           if late else None))
    out.extend(_kv_wait(ev, wf))
    last = ev.samples[-1].extras
    acc = {n: a for n, a in last.prefetch_accuracy.items()
           if last.prefetched_blocks.get(n, 0) >= PREFETCH_MIN_BLOCKS}
    if acc:
        low = {n: a for n, a in acc.items() if a < PREFETCH_ACCURACY_WARN}
        out.append(Finding(
            wf, WARNING if low else OK,
            f"prefetch accuracy {min(acc.values()):.2f}..{max(acc.values()):.2f} over "
            f"{len(acc)} nodes", evidence={"prefetch_accuracy": acc},
            cause="prefetch reads blocks no turn uses" if low else None,
            action="dualpath-monitor --metric prefetch_accuracy --by-node" if low else None))
    return out


def kv_waits(ev: Evidence) -> dict[int, float]:
    """Each prefill engine's mean wait for its cached KV (seconds) over the samples that
    measured one (engines that served no prefill of a cached prefix are left out)."""
    out = {}
    for eid, series in ev.engine_series("kv_wait_s").items():
        vals = values_of(series)
        if vals:
            out[eid] = sum(vals) / len(vals)
    return out


def _kv_wait(ev: Evidence, wf: str) -> list[Finding]:
    """Prefills that wait for their whole hit to load before computing: the bubble the
    per-layer slack cannot show (it is measured after the load)."""
    waits = kv_waits(ev)
    if not waits:
        return []
    out = []
    rule = RULES["kv-wait"]
    counts = {eid: len(values_of(s)) for eid, s in ev.engine_series("kv_wait_s").items()}
    for eid, mean in sorted(waits.items()):
        e = ev.engines[eid]
        v = judge(rule, mean, counts.get(eid, 0), ev.previous, f"node {node_name(e)}",
                  shown=f"{mean * 1e3:.1f} ms mean KV wait")
        if v is None or not v.severity:
            continue
        svc = mean_of(ev.engine_series("service_time_s").get(eid, ()))
        vs = f" (its compute per request {svc * 1e3:.1f} ms)" if svc else ""
        out.append(Finding(
            wf, v.severity,
            f"{engine_name(e)}: prefills of a cached prefix wait {mean * 1e3:.1f} ms on "
            f"average for their KV before computing{vs}", subject=f"node {node_name(e)}",
            evidence={"engine": eid, "node": node_name(e), "mean_kv_wait_s": round(mean, 6),
                      "service_time_s": svc, "samples": counts[eid]},
            cause=f"slow store reads on node {node_name(e)} (read latency, a slow or throttled "
                  "storage NIC): the prefill cannot start until its hit is loaded",
            action="dualpath diagnose snic-imbalance --window 60s; dualpath storage bench "
                   "--root <store>", rule=rule.name, why=v.why))
    if not out:
        worst = max(waits.values())
        out.append(Finding(wf, OK, f"prefills wait at most {worst * 1e3:.1f} ms on average for "
                           f"their cached KV ({len(waits)} engines; < "
                           f"{KV_WAIT_WARN_S * 1e3:g} ms)",
                           evidence={"kv_wait_s": {str(k): round(v, 6)
                                                   for k, v in waits.items()}}))
    return out
