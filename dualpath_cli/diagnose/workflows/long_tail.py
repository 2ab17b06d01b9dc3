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
from dualpath_cli.diagnose.model import Evidence, Finding, engine_name, node_name
from dualpath_cli.diagnose.thresholds import (
    HOT_BLOCK_MIN_READS,
    HOT_BLOCK_SHARE,
    SLOW_ENGINE_FACTOR,
    SLOW_ENGINE_MIN_SEQ,
    SLOW_SERVICE_MIN_SAMPLES,
    TTFT_MIN_TURNS,
)
from dualpath_cli.diagnose.verdict import RULES, judge, not_enough
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
    else:
        p50 = histogram_quantile(0.5, buckets)
        p99 = histogram_quantile(0.99, buckets)
        ratio = p99 / p50 if p50 and p99 else 0.0
        v = judge(rule, ratio, int(turns), ev.previous, None, shown=f"P99/P50 {ratio:.1f}")
        if v is None:
            out.append(not_enough(rule, int(turns), f"TTFT tail ({scope})"))
        elif p50 and p99:
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
    """Rule hot-block: blocks read far more than the rest, one finding per node that reads
    them (the blocks listed), graded by the share of the store's block reads in the window
    that the busiest copy of the node's most-read block takes.

    Why the node as the subject: which of a few equally hot blocks is read most changes
    from window to window; the reader hammering them does not. Why the busiest copy: a
    block with copies is a hot spot only where one copy (its storage target) still takes the
    share; copies added by ``--fix`` lower it even while the reads keep coming."""
    x0, x1 = ev.samples[0].extras, ev.samples[-1].extras
    first, last = x0.block_reads, x1.block_reads
    if not last:
        return [Finding(wf, OK, "hot blocks: per-block read counts not available from this "
                        "cluster", evidence={"block_reads": None})]
    # a block that entered the exported top only later counts whole (an upper bound)
    windowed = len(ev.samples) > 1
    reads = {k: v - first.get(k, 0) for k, v in last.items()} if windowed else dict(last)
    reads = {k: v for k, v in reads.items() if v > 0}
    if not reads:
        return []
    total = None
    if x1.store_block_reads is not None:
        total = x1.store_block_reads - (x0.store_block_reads or 0 if windowed else 0)
        total = total if total > 0 else None
    denom = total if total is not None else sum(reads.values())
    basis = (f"the store's {total} block reads" if total is not None else
             f"the {denom} reads of the reported blocks")
    rule = RULES["hot-block"]
    spread = _copy_spread(ev, reads)
    # reads before the readers found the copies count against the busiest copy (an upper
    # bound)
    load = {k: spread[k][0] if k in spread else v for k, v in reads.items()}
    by_subject: dict[str, list[str]] = {}
    for k in reads:
        if reads[k] >= rule.minimum:
            by_subject.setdefault(_reader_subject(ev, k), []).append(k)
    out: list[Finding] = []
    roots = _roots_serving_copies(ev)
    for reader, keys in sorted(by_subject.items()):
        top = max(keys, key=lambda k: (load[k], k))
        subject = reader or f"block {top}"  # who read them not known: the hottest block
        share = load[top] / denom
        v = judge(rule, share, reads[top], ev.previous, subject,
                  shown=f"{pct(share)} of {basis} on its busiest copy")
        if v is None:  # never: each of keys was read the rule's minimum times
            continue
        # copied blocks under the hot share say how their reads spread (even beside a block
        # of the node still hot)
        out.extend(_cooled(ev, wf, [k for k in keys if load[k] / denom < rule.warn or
                                    not v.severity], reads, spread, load, denom, basis))
        if not v.severity:
            continue
        hot = sorted((k for k in keys if load[k] / denom >= rule.warn), key=lambda k: (
            -load[k], k))[:5] or [top]
        floor = rule.warn * denom
        # copies that would leave each one under half the hot share (what --fix asks for)
        needed = {k: max(2, math.ceil(reads[k] / max(floor / 2, 1))) for k in hot}
        have = {k: len(spread[k][1]) for k in hot if k in spread}
        copied = (f"; {have[top]} copies, {spread[top][0]} reads on the busiest"
                  if top in have else "")
        who = f"{reader} reads" if reader else "a reader (not reported) reads"
        # every hot block already read from each root seen serving copies: another copy
        # needs another root (a --fix would copy nothing)
        on_every_root = len(roots) >= 2 and all(
            roots <= set(x1.block_copy_reads.get(k, {})) for k in hot)
        action = (f"add a replica root: the {len(hot)} hot blocks already have a copy on "
                  f"each of the {len(roots)} roots serving copies, so --fix has nothing to "
                  "copy (launch --replica-root DIR, repeatable; dualpath storage inspect "
                  "<root> --top 20 lists the hot blocks)" if on_every_root else
                  f"dualpath diagnose long-tail --fix   (copies the {len(hot)} hot blocks "
                  f"to every replica root, at least {max(needed.values())} copies each; a "
                  "store without them: launch --replica-root DIR; dualpath storage inspect "
                  "<root> --top 20 lists the hot blocks)")
        out.append(Finding(
            wf, v.severity, f"{who} {len(hot)} hot blocks: block {top[:12]} read "
            f"{reads[top]} times in {ev.window_s:.0f} s, {pct(share)} of {basis} on its "
            f"busiest copy{copied}", subject=subject,
            evidence={"hot_blocks": {k: reads[k] for k in hot}, "hot_share": round(share, 4),
                      "busiest_copy_reads": load[top], "mean_reads": sum(reads.values())
                      / len(reads), "store_block_reads": total, "copies_needed": needed,
                      "copies": have, "roots_serving_copies": len(roots),
                      "on_every_root": on_every_root},
            cause=f"storage hot spot: {reader or 'one reader, or many turns,'} reads these "
                  "blocks far more than any other",
            action=action, rule=rule.name, why=v.why))
    if not out:
        return [Finding(wf, OK, f"no hot block: the most-read block read "
                        f"{max(reads.values())} times in {ev.window_s:.0f} s (hot: >= "
                        f"{HOT_BLOCK_MIN_READS} reads and >= {pct(HOT_BLOCK_SHARE)} of "
                        f"{basis} on its busiest copy)",
                        evidence={"blocks": len(reads), "store_block_reads": total})]
    return out


def _reader_subject(ev: Evidence, key: str) -> str:
    """The node that read ``key`` most in the window (``node D1``), else "" (a cluster or
    recording that does not say which node read it)."""
    x0, x1 = ev.samples[0].extras, ev.samples[-1].extras
    now = x1.block_readers.get(key, {})
    before = x0.block_readers.get(key, {}) if len(ev.samples) > 1 else {}
    counts = {n: c - before.get(n, 0) for n, c in now.items()}
    nodes = ev.nodes
    counts = {n: c for n, c in counts.items() if c > 0 and n in nodes}
    if not counts:
        return ""
    node = max(counts, key=lambda n: (counts[n], -n))
    return f"node {node_name(nodes[node])}"


def _roots_serving_copies(ev: Evidence) -> set[str]:
    """The store roots seen serving a replicated block's reads since start (the root and
    its replica roots; a root no copy was read from is not seen)."""
    return {r for per_root in ev.samples[-1].extras.block_copy_reads.values()
            for r, n in per_root.items() if n > 0}


def _cooled(ev: Evidence, wf: str, keys: list[str], reads: dict[str, int],
            spread: dict[str, tuple[int, dict[str, int]]], load: dict[str, int], denom: int,
            basis: str) -> list[Finding]:
    """Copied blocks read often enough to have been hot: how their reads spread, whatever
    share they still take (the operator asks "did my copies take the reads?")."""
    out = []
    for k in sorted((k for k in keys if k in spread), key=lambda k: -reads[k])[:5]:
        busiest, per_root = spread[k]
        out.append(Finding(
            wf, OK, f"block {k[:12]} read {reads[k]} times in {ev.window_s:.0f} s, spread over "
            f"{len(per_root)} copies (at most {busiest} from one root, {pct(load[k] / denom)} "
            f"of {basis}: under the hot share)",
            evidence={"block": k, "reads": reads[k], "copy_reads": per_root,
                      "busiest_copy_reads": busiest}))
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
            share = sum(over) / len(over) if over else 0.0
            v = judge(ob, share, len(over), ev.previous, f"engine {eid}",
                      shown=f"{pct(share)} of samples over beta")
            if v is not None and v.severity:
                out.append(Finding(
                    wf, v.severity, f"{engine_name(e)} over beta {tok_text(beta[-1])} tok in "
                    f"{pct(share)} of samples", subject=f"engine {eid}",
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
            behind_share = behind / len(mine) if mine else 0.0
            v = judge(se, behind_share, len(mine), ev.previous, f"engine {eid}",
                      shown=f"{pct(behind_share)} of samples behind")
            if v is not None and v.severity:
                util = mean_of(ev.engine_series("gpu_utilization").get(eid, ()))
                out.append(Finding(
                    wf, v.severity, f"{engine_name(e)} holds {mean_of(mine):.1f} unfinished "
                    f"requests on average, >= {SLOW_ENGINE_FACTOR:g}x its {role} peers, in "
                    f"{pct(behind_share)} of samples",
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
            v = judge(rule, mean / med, n, ev.previous, f"engine {eid}",
                      shown=f"{mean / med:.1f}x its peers")
            if v is None or not v.severity:
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
