"""Scheduler decision time at 48P96D scale: how many requests one core can schedule.

Usage::

    python bench/scheduler.py [--json] [--requests 30000] [--policy dualpath] [--cpu 0]

What is timed (``time.perf_counter_ns`` around each call, on one pinned core): every call the
scheduler makes, at fetch granularity, exactly as a runtime would make them:

* ``pe_fetch``: a PE group's fetch over the global queue (paper Algorithm 1), incl. copies;
* ``de_route``: DE phase 1, draining the global DE queue to groups (heap of group loads);
* ``de_place``: DE phase 2 for the fetching group (set R, Z, placement) plus refreshing that
  group's phase-1 load;
* ``read_plan``: the read side for each request once its PE and DE are both known, plus
  charging the chosen node's read queue.

Reported per request (``median_us``/``p99_us``): each call's time divided evenly among the
requests it decided, summed over the four stages, so every request gets its amortised cost.
``mean_us`` is the total timed time (including fetches that found nothing to do) divided by
the requests decided; ``decisions_per_s`` is its inverse. Per-fetch times are reported per
stage. ``single_*`` times :func:`dualpath_cli.core.policies.decide` on one request at a time
(fetches of size one: the worst case for copying overhead).

What is *not* timed: the stand-in cluster dynamics that keep the snapshots realistic. PEs
prefill FIFO at the ds660b FLOP model on hopper GPUs; DEs hold a request's KV for its decode
(generated tokens x 39 ms TPOT); node read queues drain at the storage-NIC rate. Requests
arrive Poisson at the paper's 48P96D rate (~2,400 turns/s) with 64K-trace-like lengths
(context uniform 1K..64K-append, mean ~32.6K; append exponential, mean 429; gen mean 176).
This is a timing harness, not the simulator.
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import platform
import random
import statistics
import sys
import time
from collections import deque
from dataclasses import dataclass, field

from dualpath_cli.core.de_schedule import GroupLoads, de_place, de_route
from dualpath_cli.core.pe_fetch import pe_fetch
from dualpath_cli.core.policies import SchedParams, decide, get_policy
from dualpath_cli.core.profiles import HARDWARE_PROFILES, MODEL_PROFILES
from dualpath_cli.core.thresholds import tokens_readable
from dualpath_cli.core.types import EngineSnapshot, Request, Role
from dualpath_cli.errors import NoAvailableEngine

MODEL = MODEL_PROFILES["ds660b"]
HW = HARDWARE_PROFILES["hopper"]
TPOT = 0.039
KV_HBM_FRACTION = 0.6  # share of HBM left for KV after weights and activations
STAGES = ("pe_fetch", "de_route", "de_place", "read_plan")


@dataclass
class Arrival:
    request: Request
    gen: int
    t: float


@dataclass
class Cluster:
    """Snapshots plus the untimed dynamics behind them."""

    pe: list[list[EngineSnapshot]]
    de: list[list[EngineSnapshot]]
    node_q: list[float]
    node_t: list[float]
    pe_busy: dict[int, float] = field(default_factory=dict)
    pe_work: dict[int, deque[tuple[float, int]]] = field(default_factory=dict)
    de_work: dict[int, list[tuple[float, int]]] = field(default_factory=dict)


def build(pe_nodes: int, de_nodes: int, gpus: int, hbm_tokens: int) -> Cluster:
    pe, de = [], []
    eid = 0
    for n in range(pe_nodes):
        pe.append([EngineSnapshot(eid + i, n, n, Role.PREFILL) for i in range(gpus)])
        eid += gpus
    for j in range(de_nodes):
        n = pe_nodes + j
        de.append([EngineSnapshot(eid + i, n, j, Role.DECODE, hbm_free=hbm_tokens)
                   for i in range(gpus)])
        eid += gpus
    total = pe_nodes + de_nodes
    c = Cluster(pe, de, [0.0] * total, [0.0] * total)
    for g in pe:
        for e in g:
            c.pe_busy[e.engine_id] = 0.0
            c.pe_work[e.engine_id] = deque()
    for g in de:
        for e in g:
            c.de_work[e.engine_id] = []
    return c


def gen_requests(n: int, rate: float, max_len: int, seed: int) -> list[Arrival]:
    rng = random.Random(seed)
    out, t = [], 0.0
    for i in range(n):
        t += rng.expovariate(rate)
        append = max(1, min(8_000, int(rng.expovariate(1 / 429))))
        context = int(rng.uniform(1_000, max_len - append)) // 64 * 64
        gen = max(1, int(rng.expovariate(1 / 176)))
        out.append(Arrival(Request(i, context + append, context), gen, t))
    return out


def drain_node(c: Cluster, node: int, t: float, rate: float) -> int:
    q = max(0.0, c.node_q[node] - rate * (t - c.node_t[node]))
    c.node_q[node], c.node_t[node] = q, t
    return int(q)


def refresh_pe(c: Cluster, g: int, t: float, rate: float) -> None:
    for e in c.pe[g]:
        work = c.pe_work[e.engine_id]
        while work and work[0][0] <= t:
            _, length = work.popleft()
            e.tok -= length
            e.seq -= 1
        e.read_q = drain_node(c, e.node, t, rate)


def refresh_de(c: Cluster, g: int, t: float, rate: float) -> None:
    for e in c.de[g]:
        work = c.de_work[e.engine_id]
        while work and work[0][0] <= t:
            _, length = heapq.heappop(work)
            e.tok -= length
            e.seq -= 1
            e.hbm_free += length
        e.read_q = drain_node(c, e.node, t, rate)


def pct(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(p / 100 * len(s)))]


def run(args: argparse.Namespace) -> dict[str, object]:
    gpus = args.gpus_per_node
    kv_tok = MODEL.kv_bytes_per_token
    snic_rate = HW.snic_bandwidth * HW.snics_per_node / kv_tok  # tokens/s per node
    hbm_tokens = int(HW.hbm_bytes * KV_HBM_FRACTION / kv_tok)
    mean_len = 32_600 + 429
    prefill_s = MODEL.prefill_flops(32_600, 429) / HW.gpu_flops
    params = SchedParams(alpha=tokens_readable(HW.snic_bandwidth, kv_tok, 3.0),
                         beta=int(5.0 * mean_len / prefill_s), seed=args.seed,
                         pe_read_rate=snic_rate, de_read_rate=snic_rate)
    policy = get_policy(args.policy)
    c = build(args.pe_nodes, args.de_nodes, gpus, hbm_tokens)
    arrivals = gen_requests(args.requests + args.single, args.rate, args.max_len, args.seed)
    main, extra = arrivals[:args.requests], arrivals[args.requests:]
    by_id = {a.request.request_id: a for a in main}

    # fetch events: every group fetches once per period, groups evenly staggered
    period = args.fetch_period
    events: list[tuple[float, int, int]] = []  # (time, kind 0=PE 1=DE, group)
    for g in range(args.pe_nodes):
        events.append((period * g / args.pe_nodes, 0, g))
    for g in range(args.de_nodes):
        events.append((period * g / args.de_nodes, 1, g))
    heapq.heapify(events)

    loads = GroupLoads({g: 0 for g in range(args.de_nodes)})
    private: list[list[Request]] = [[] for _ in range(args.de_nodes)]
    pe_queue: list[Request] = []
    de_queue: list[Request] = []
    pe_of: dict[int, int] = {}  # request id -> engine id
    de_of: dict[int, int] = {}
    pe_index = {e.engine_id: e for g in c.pe for e in g}
    de_index = {e.engine_id: e for g in c.de for e in g}
    cost: dict[int, float] = {}  # amortised ns per request
    calls: dict[str, list[tuple[int, int]]] = {s: [] for s in STAGES}  # (ns, requests)
    decided = 0
    ordinal = 0
    sides = {"pe": 0, "de": 0}
    stops: dict[str, int] = {}
    nxt = 0
    clock = time.perf_counter_ns

    def plan(rid: int, t: float) -> None:
        nonlocal decided, ordinal
        pe_e, de_e = pe_index[pe_of.pop(rid)], de_index[de_of.pop(rid)]
        # the scheduler's view of both nodes' read queues: last report plus its own charges
        pe_e.read_q = drain_node(c, pe_e.node, t, snic_rate)
        de_e.read_q = drain_node(c, de_e.node, t, snic_rate)
        r = by_id[rid].request
        t0 = clock()
        p = policy.plan(r, pe_e, de_e, params, ordinal)
        if p.pe_tokens:
            c.node_q[pe_e.node] += p.pe_tokens
        if p.de_tokens:
            c.node_q[de_e.node] += p.de_tokens
        dt = clock() - t0
        ordinal += 1
        sides["pe"] += p.pe_tokens
        sides["de"] += p.de_tokens
        calls["read_plan"].append((dt, 1))
        cost[rid] = cost.get(rid, 0.0) + dt
        decided += 1
        # untimed dynamics: PE prefill FIFO, DE holds KV for the decode
        a = by_id[rid]
        start = max(t, c.pe_busy[pe_e.engine_id])
        done = start + MODEL.prefill_flops(r.cached, r.new_tokens) / HW.gpu_flops
        c.pe_busy[pe_e.engine_id] = done
        c.pe_work[pe_e.engine_id].append((done, r.length))
        heapq.heappush(c.de_work[de_e.engine_id], (done + a.gen * TPOT, r.length))

    def spread(stage: str, dt: int, rids: list[int]) -> None:
        calls[stage].append((dt, len(rids)))
        if rids:
            share = dt / len(rids)
            for rid in rids:
                cost[rid] = cost.get(rid, 0.0) + share

    while decided < len(main):
        t, kind, g = heapq.heappop(events)
        heapq.heappush(events, (t + period, kind, g))
        while nxt < len(main) and main[nxt].t <= t:
            pe_queue.append(main[nxt].request)
            de_queue.append(main[nxt].request)
            nxt += 1
        if kind == 0:
            refresh_pe(c, g, t, snic_rate)
            t0 = clock()
            res = pe_fetch(pe_queue, c.pe[g], params.alpha, params.beta)
            pe_queue = list(res.remaining)
            c.pe[g] = list(res.engines)
            dt = clock() - t0
            spread("pe_fetch", dt, [rid for rid, _ in res.assignments])
            key = "pe_" + res.stop_reason
            stops[key] = stops.get(key, 0) + 1
            for e in c.pe[g]:
                pe_index[e.engine_id] = e
            for rid, eid in res.assignments:
                pe_of[rid] = eid
                if rid in de_of:
                    plan(rid, t)
        else:
            refresh_de(c, g, t, snic_rate)
            t0 = clock()
            route = de_route(de_queue, loads)
            loads = route.loads
            for rid, grp in route.assignments:
                private[grp].append(by_id[rid].request)
            de_queue = []
            dt = clock() - t0
            spread("de_route", dt, [rid for rid, _ in route.assignments])
            t0 = clock()
            placed = de_place(private[g], c.de[g], params.z_factor)
            private[g] = list(placed.remaining)
            c.de[g] = list(placed.engines)
            loads.set(g, sum(e.tok for e in placed.engines)
                      + sum(r.length for r in private[g]))
            dt = clock() - t0
            spread("de_place", dt, [rid for rid, _ in placed.assignments])
            key = "de_" + placed.stop_reason
            stops[key] = stops.get(key, 0) + 1
            for e in c.de[g]:
                de_index[e.engine_id] = e
            for rid, eid in placed.assignments:
                de_of[rid] = eid
                if rid in pe_of:
                    plan(rid, t)
        if t > args.max_sim_s:
            break

    warm = [cost[a.request.request_id] / 1000 for a in main[args.warmup:]
            if a.request.request_id in cost]
    total_ns = sum(dt for s in STAGES for dt, _ in calls[s])

    des = [e for g in c.de for e in g]
    state = {
        "sim_seconds": round(main[-1].t, 2),
        "de_hbm_used": round(1 - sum(e.hbm_free for e in des) / (hbm_tokens * len(des)), 3),
        "de_mean_seq": round(sum(e.seq for e in des) / len(des), 2),
        "pe_mean_tok": round(sum(e.tok for g in c.pe for e in g) / (len(c.pe) * gpus)),
        "read_tokens_de_share": round(sides["de"] / max(1, sides["pe"] + sides["de"]), 3),
        "fetch_stops": stops,
    }

    # single-request decisions on the final state (no dynamics, fetch size one)
    single: list[float] = []
    failed = 0
    for i, a in enumerate(extra):
        g = i % args.pe_nodes
        t0 = clock()
        try:
            res1 = decide(policy, a.request, c.pe[g], dict(enumerate(c.de)), loads, params, i)
        except NoAvailableEngine:
            failed += 1
            continue
        dt = clock() - t0
        single.append(dt / 1000)
        c.pe[g] = list(res1.pe_engines)
        c.de[res1.decision.de_group] = list(res1.de_engines)
        loads = res1.loads

    stages = {}
    for s in STAGES:
        xs = calls[s]
        busy = [dt for dt, n in xs if n]
        stages[s] = {
            "calls": len(xs),
            "requests": sum(n for _, n in xs),
            "mean_batch": round(sum(n for _, n in xs) / max(1, len(busy)), 2),
            "p50_us_per_fetch": round(pct([d / 1000 for d in busy], 50), 2),
            "p99_us_per_fetch": round(pct([d / 1000 for d in busy], 99), 2),
            "amortised_us_per_request": round(sum(d for d, _ in xs) / 1000 / max(1, decided), 3),
        }
    mean_us = total_ns / 1000 / max(1, decided)
    return {
        "engines": sum(len(g) for g in c.pe) + sum(len(g) for g in c.de),
        "pe_groups": args.pe_nodes,
        "de_groups": args.de_nodes,
        "gpus_per_node": gpus,
        "policy": args.policy,
        "requests": len(warm),
        "warmup": args.warmup,
        "rate_per_s": args.rate,
        "fetch_period_s": period,
        "median_us": round(statistics.median(warm), 3) if warm else None,
        "p99_us": round(pct(warm, 99), 3),
        "mean_us": round(mean_us, 3),
        "decisions_per_s": round(1e6 / mean_us) if mean_us else None,
        "single_median_us": round(statistics.median(single), 3) if single else None,
        "single_p99_us": round(pct(single, 99), 3),
        "single_requests": len(single),
        "single_failed": failed,
        "stages": stages,
        "state": state,
        "alpha_tokens": params.alpha,
        "beta_tokens": params.beta,
        "python": platform.python_version(),
        "cpu": args.cpu,
        "reported": "median_us/p99_us: per request, each fetch call's time split evenly over "
                    "the requests it decided, summed over stages",
    }


def render(out: dict[str, object]) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console()
    con.print(f"Scheduler decision time: {out['engines']} engines "
              f"({out['pe_groups']}P{out['de_groups']}D x {out['gpus_per_node']} GPUs), "
              f"policy {out['policy']}, one core")
    t = Table()
    t.add_column("metric")
    t.add_column("value", justify="right")
    for k in ("requests", "median_us", "p99_us", "mean_us", "decisions_per_s",
              "single_median_us", "single_p99_us", "rate_per_s", "fetch_period_s"):
        t.add_row(k, str(out[k]))
    con.print(t)
    s = Table(title="Per stage")
    for col in ("stage", "calls", "mean batch", "p50 us/fetch", "p99 us/fetch", "us/request"):
        s.add_column(col, justify="right" if col != "stage" else "left")
    stages = out["stages"]
    assert isinstance(stages, dict)
    for name, v in stages.items():
        s.add_row(name, str(v["calls"]), str(v["mean_batch"]), str(v["p50_us_per_fetch"]),
                  str(v["p99_us_per_fetch"]), str(v["amortised_us_per_request"]))
    con.print(s)
    con.print(f"cluster state: {out['state']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pe-nodes", type=int, default=48)
    ap.add_argument("--de-nodes", type=int, default=96)
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--requests", type=int, default=40_000)
    ap.add_argument("--warmup", type=int, default=20_000,
                    help="requests excluded from the statistics while DEs fill up")
    ap.add_argument("--single", type=int, default=5_000,
                    help="requests for the one-at-a-time decide() measurement")
    ap.add_argument("--rate", type=float, default=2_400.0, help="arrivals per second")
    ap.add_argument("--fetch-period", type=float, default=0.1, help="seconds (config default)")
    ap.add_argument("--max-len", type=int, default=64_000)
    ap.add_argument("--max-sim-s", type=float, default=3_600.0)
    ap.add_argument("--policy", default="dualpath")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--cpu", type=int, default=None,
                    help="core to pin to (default: the first allowed core; -1: no pinning)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.warmup >= args.requests:
        print(f"--warmup {args.warmup} must be below --requests {args.requests}",
              file=sys.stderr)
        return 2
    if args.cpu is None and hasattr(os, "sched_getaffinity"):
        args.cpu = min(os.sched_getaffinity(0))
    if args.cpu is not None and args.cpu >= 0 and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {args.cpu})
    try:
        out = run(args)
    except Exception as exc:  # a bad flag value reaches here as one line, not a traceback
        print(f"bench/scheduler.py: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(out))
    else:
        render(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
