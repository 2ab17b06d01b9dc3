"""6.2 Long tail: the TTFT tail against its median, hot blocks, slow engines and slow
service, with the HBM fragmentation that a tail often comes from.

A pure function over :class:`~dualpath_cli.diagnose.model.Evidence` (diagnose/rules.py
runs it); thresholds are diagnose/thresholds.py's.
"""

from __future__ import annotations

import math
import statistics

from dualpath_cli.diagnose.grading import (
    CRITICAL,
    OK,
    WARNING,
    dataclass_replace,
    histogram_quantile,
    mean_of,
    no_samples,
    pct,
    role_engines,
    tok_text,
    values_of,
)
from dualpath_cli.diagnose.model import Evidence, Finding, engine_name
from dualpath_cli.diagnose.thresholds import (
    HOT_BLOCK_FACTOR,
    HOT_BLOCK_MIN_READS,
    HOT_BLOCK_SHARE,
    SLOW_ENGINE_FACTOR,
    SLOW_ENGINE_MIN_SEQ,
    SLOW_SERVICE_MIN_SAMPLES,
    TTFT_MIN_TURNS,
)
from dualpath_cli.diagnose.verdict import RULES, grade, not_enough, previous_of
from dualpath_cli.diagnose.workflows.hbm_frag import hbm_frag

__all__ = ["long_tail"]


def _ttft_window(ev: Evidence) -> tuple[list[tuple[float, float]], str]:
    first, last = ev.samples[0].extras, ev.samples[-1].extras
    if not last.ttft_buckets:
        return [], "not available"
    if first.ttft_buckets and len(first.ttft_buckets) == len(last.ttft_buckets):
        delta = [(le, float(c - c0)) for (le, c), (_, c0)
                 in zip(last.ttft_buckets, first.ttft_buckets, strict=True)]
        if delta and delta[-1][1] >= TTFT_MIN_TURNS:
            return delta, "window"
    return [(le, float(c)) for le, c in last.ttft_buckets], "since start"


def long_tail(ev: Evidence) -> list[Finding]:
    """TTFT P99/P50, hot blocks, engines persistently over beta or far behind their peers,
    fragmented HBM (seed 6.2)."""
    wf = "long-tail"
    if not ev.samples:
        return [no_samples(wf)]
    out: list[Finding] = []
    buckets, scope = _ttft_window(ev)
    turns = buckets[-1][1] if buckets else 0
    rule = RULES["ttft-tail"]
    if not buckets:
        out.append(Finding(wf, OK, "TTFT tail: histogram not available",
                           evidence={"turns": 0}))
    elif turns < rule.minimum:
        out.append(not_enough(rule, int(turns), f"TTFT tail ({scope})"))
    else:
        p50 = histogram_quantile(0.5, buckets)
        p99 = histogram_quantile(0.99, buckets)
        if p50 and p99:
            ratio = p99 / p50
            v = grade(rule, ratio, int(turns), previous_of(ev.previous, rule, None),
                      shown=f"P99/P50 {ratio:.1f}")
            sev, why = v.severity, v.why
            if scope != "window" and sev > WARNING:  # since start mixes in warm-up and old
                sev, why = WARNING, why + "; capped at WARNING: histogram since start"
            out.append(Finding(
                wf, sev, f"TTFT P99/P50 {ratio:.1f} (P50 {p50 * 1e3:.0f} ms, P99 "
                f"{p99 * 1e3:.0f} ms, {turns:.0f} turns {scope})",
                evidence={"p50_s": p50, "p99_s": p99, "ratio": round(ratio, 3),
                          "turns": turns, "scope": scope},
                cause="see the hot-block, engine and HBM findings" if sev else None,
                action="dualpath tune set quota=150ms" if sev else None,
                rule=rule.name, why=why))
    out.extend(_hot_blocks(ev, wf))
    out.extend(_slow_engines(ev, wf))
    out.extend(_slow_service(ev, wf))
    out.extend(f for f in ev.memo("hbm-frag", lambda: hbm_frag(ev))
               if f.severity in (WARNING, CRITICAL))
    return [dataclass_replace(f, workflow=wf) for f in out]


def _hot_blocks(ev: Evidence, wf: str) -> list[Finding]:
    """Blocks read far more than the rest: a share of the store's reads in the window (the
    runtime exports each engine's most-read blocks only), else against the reported mean."""
    x0, x1 = ev.samples[0].extras, ev.samples[-1].extras
    first, last = x0.block_reads, x1.block_reads
    if not last:
        return [Finding(wf, OK, "hot blocks: per-block read counts not available from this "
                        "cluster", evidence={"block_reads": None})]
    # a block that entered the exported top only later counts whole (an upper bound)
    reads = {k: v - first.get(k, 0) for k, v in last.items()} if len(ev.samples) > 1 else last
    reads = {k: v for k, v in reads.items() if v > 0}
    if not reads:
        return []
    total = None
    if x1.store_block_reads is not None:
        total = x1.store_block_reads - (x0.store_block_reads or 0 if len(ev.samples) > 1
                                        else 0)
        total = total if total > 0 else None
    mean = sum(reads.values()) / len(reads)
    if total is not None:
        floor, basis = HOT_BLOCK_SHARE * total, (f"{pct(HOT_BLOCK_SHARE)} of the store's "
                                                 f"{total} block reads")
    else:
        floor, basis = HOT_BLOCK_FACTOR * mean, f"{HOT_BLOCK_FACTOR:g}x the mean {mean:.1f}"
    spread = _copy_spread(ev, reads)
    # a block with copies is a hot spot only where one copy still takes the hot share: the
    # storage target holding that copy is what saturates (reads before the readers found
    # the copies count against the busiest copy: an upper bound)
    load = {k: spread[k][0] if k in spread else v for k, v in reads.items()}
    hot = sorted(((v, k) for k, v in reads.items()
                  if v >= HOT_BLOCK_MIN_READS and load[k] >= floor), reverse=True)
    # a copied block read often enough to have been hot says how its reads spread, whatever
    # share of the window's reads it still takes (a workload's contexts grow: the hot block's
    # share of all reads falls while it is read as often, and the operator asks "did my
    # copies take the reads?")
    cooled = sorted(((v, k) for k, v in reads.items()
                     if k in spread and v >= HOT_BLOCK_MIN_READS and load[k] < floor),
                    reverse=True)
    out: list[Finding] = []
    for v, k in cooled[:5]:
        busiest, per_root = spread[k]
        out.append(Finding(
            wf, OK, f"block {k[:12]} read {v} times in {ev.window_s:.0f} s, spread over "
            f"{len(per_root)} copies (at most {busiest} from one root: under the hot "
            f"share, {basis})", evidence={"block": k, "reads": v, "copy_reads": per_root,
                                         "busiest_copy_reads": busiest}))
    if not hot:
        if out:
            return out
        return [Finding(wf, OK, f"no hot block: the most-read block read "
                        f"{max(reads.values())} times in {ev.window_s:.0f} s (hot: >= "
                        f"{HOT_BLOCK_MIN_READS} and >= {basis})",
                        evidence={"blocks": len(reads), "store_block_reads": total})]
    names = [k for _, k in hot[:5]]
    top_v, top_k = hot[0]
    share = f", {pct(top_v / total)} of the store's block reads" if total else ""
    # copies that would leave each one under half the hot share (what --fix asks for)
    needed = {k: max(2, math.ceil(reads[k] / max(floor / 2, 1))) for k in names}
    have = {k: len(spread[k][1]) for k in names if k in spread}
    copied = (f"; {have[top_k]} copies, {spread[top_k][0]} reads on the busiest"
              if top_k in have else "")
    out.append(Finding(
        wf, WARNING, f"block {top_k[:12]} read {top_v} times in {ev.window_s:.0f} s (hot"
        f"{share}; {len(hot)} hot blocks{copied})",
        subject=f"block {top_k}",
        evidence={"hot_blocks": {k: reads[k] for k in names}, "mean_reads": mean,
                  "store_block_reads": total, "copies_needed": needed,
                  "copies": have},
        cause="storage hot spot: many turns (or one reader) hammer these blocks",
        action=f"dualpath diagnose long-tail --fix   (copies the {len(names)} hot blocks "
               f"to every replica root, at least {max(needed.values())} copies each; a store "
               "without them: launch --replica-root DIR; dualpath storage inspect <root> "
               "--top 20 lists the hot blocks)",
        why=f"hot block: {top_v} reads in the window, >= {HOT_BLOCK_MIN_READS} and >= "
            f"{basis} on its busiest copy: WARNING (no band: a count)"))
    return out


def _copy_spread(ev: Evidence, reads: dict[str, int]) -> dict[str, tuple[int, dict[str,
                                                                                  int]]]:
    """For each block with copies serving it in the window: the reads of its busiest copy
    (the reads not attributed to a copy added to it) and the window's reads per root."""
    x0, x1 = ev.samples[0].extras, ev.samples[-1].extras
    out: dict[str, tuple[int, dict[str, int]]] = {}
    for k, per_root in x1.block_copy_reads.items():
        before = x0.block_copy_reads.get(k, {}) if len(ev.samples) > 1 else {}
        window = {r: n - before.get(r, 0) for r, n in per_root.items()}
        counted = sum(max(0, n) for n in window.values())
        if k not in reads or len(window) < 2 or counted <= 0:
            continue
        busiest = max(window.values()) + max(0, reads[k] - counted)
        out[k] = (busiest, window)
    return out


def _slow_engines(ev: Evidence, wf: str) -> list[Finding]:
    seq = ev.engine_series("seq")
    tokens = ev.engine_series("tokens")
    beta = ev.beta_series
    out = []
    # each sample's median per role: a peer group's typical load (one slow engine among
    # many barely moves it; with two engines it is their mean)
    medians: dict[str, list[float | None]] = {}
    for role, ids in role_engines(ev).items():
        medians[role] = []
        for i in range(len(ev.samples)):
            vals = [seq[p][i] for p in ids if i < len(seq.get(p, ()))]
            medians[role].append(statistics.median(vals) if vals else None)
    for role, ids in sorted(role_engines(ev).items()):
        for eid in ids:
            e = ev.engines[eid]
            over = [t > b for t, b in zip(tokens.get(eid, ()), beta, strict=False)]
            ob = RULES["over-beta"]
            v = (grade(ob, sum(over) / len(over), len(over),
                       previous_of(ev.previous, ob, f"engine {eid}"),
                       shown=f"{pct(sum(over) / len(over))} of samples over beta")
                 if len(over) >= ob.minimum else None)
            if v is not None and v.severity:
                out.append(Finding(
                    wf, v.severity, f"{engine_name(e)} over beta {tok_text(beta[-1])} tok in "
                    f"{pct(sum(over) / len(over))} of samples", subject=f"engine {eid}",
                    evidence={"engine": eid, "mean_tokens": mean_of(tokens[eid]),
                              "beta_tokens": beta[-1], "samples": len(over)},
                    cause="the scheduler keeps this engine overloaded",
                    action=f"dualpath tune set beta={tok_text(max(1, beta[-1] * 3 // 4))}",
                    rule=ob.name, why=v.why))
                continue
            if len(ids) < 2:
                continue
            mine = seq.get(eid, [])
            behind = 0
            for i, v in enumerate(mine):
                if v < SLOW_ENGINE_MIN_SEQ:
                    continue
                if len(ids) <= 3:  # a small group: the others alone are the yardstick
                    others = [seq[p][i] for p in ids if p != eid and i < len(seq[p])]
                    med = statistics.median(others) if others else None
                else:
                    med = medians[role][i] if i < len(medians[role]) else None
                if med is not None and v >= SLOW_ENGINE_FACTOR * max(med, 0.5):
                    behind += 1
            se = RULES["slow-engine"]
            if len(mine) < se.minimum:
                continue
            v = grade(se, behind / len(mine), len(mine),
                      previous_of(ev.previous, se, f"engine {eid}"),
                      shown=f"{pct(behind / len(mine))} of samples behind")
            if v.severity:
                util = mean_of(ev.engine_series("gpu_utilization").get(eid, ()))
                out.append(Finding(
                    wf, v.severity, f"{engine_name(e)} holds {mean_of(mine):.1f} unfinished "
                    f"requests on average, >= {SLOW_ENGINE_FACTOR:g}x its {role} peers, in "
                    f"{pct(behind / len(mine))} of samples",
                    subject=f"engine {eid}",
                    evidence={"engine": eid, "mean_seq": mean_of(mine),
                              "peers_median_seq": mean_of(medians[role]),
                              "gpu_utilization": util},
                    cause="a slow engine (throttled GPU, noisy neighbour) finishing its "
                          "turns late", action="dualpath stop && dualpath launch   (restart; "
                          "or drain the node) ; dynamic quota: dualpath tune set quota=150ms",
                    rule=se.name, why=v.why))
    return out


def _slow_service(ev: Evidence, wf: str) -> list[Finding]:
    """Engines whose service time (busy seconds per batched request, windowed) is far above
    their role peers' over the window (a throttled GPU, a noisy neighbour).

    Means over the samples that measured one, not sample by sample: engines of a role take
    turns at having work, so two of them are often not measured in the same second.
    """
    svc = ev.engine_series("service_time_s")
    out = []
    for role, ids in sorted(role_engines(ev).items()):
        means = {}
        for eid in ids:
            vals = values_of(svc.get(eid, ()))
            if len(vals) >= SLOW_SERVICE_MIN_SAMPLES:
                means[eid] = (sum(vals) / len(vals), len(vals))
        if len(means) < 2:
            continue
        # a big role's median barely moves for one slow engine; a small one judges each
        # engine by the others alone
        role_med = statistics.median(m for m, _ in means.values())
        rule = RULES["slow-service"]
        for eid, (mean, n) in sorted(means.items()):
            med = (statistics.median(m for p, (m, _) in means.items() if p != eid)
                   if len(means) <= 3 else role_med)
            if med <= 0:
                continue
            v = grade(rule, mean / med, n, previous_of(ev.previous, rule, f"engine {eid}"),
                      shown=f"{mean / med:.1f}x its peers")
            if not v.severity:
                continue
            e = ev.engines[eid]
            out.append(Finding(
                wf, v.severity, f"{engine_name(e)} serves a request in {mean * 1e3:.1f} ms of "
                f"compute, {mean / med:.1f}x its {role} peers' {med * 1e3:.1f} ms ({n} "
                "samples)", subject=f"engine {eid}",
                evidence={"engine": eid, "mean_service_time_s": mean,
                          "peers_service_time_s": med, "ratio_to_peers": round(mean / med, 3),
                          "samples": n},
                cause="a slow engine (throttled GPU, noisy neighbour): its turns finish late",
                action="drain and restart it: dualpath stop && dualpath launch ; meanwhile "
                       "dynamic quota: dualpath tune set quota=150ms", rule=rule.name,
                why=v.why))
    return out
