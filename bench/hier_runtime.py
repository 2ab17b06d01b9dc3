"""Hierarchical vs flat scheduling in the runtime: decision latency with emulated engines.

Usage::

    python bench/hier_runtime.py [--json] [--pd 48P96D] [--subs 0] [--rate 100]
        [--agents 300] [--seconds 20] [--warmup 15] [--speed 10] [--hosts 4]

For each scheduler (flat, then hierarchical with ``--subs`` sub-schedulers, 0: the core
default, 12 at 48P96D), a :class:`~dualpath_cli.cluster.system.RuntimeSystem` with ``--pd``
x 8 emulated engines (:mod:`dualpath_cli.runtime.emulated`: the real wire protocol over real
ZeroMQ sockets, time from the ds660b-on-hopper cost model) serves Table 2 64K agents
submitted open-loop at ``--rate`` turns/s (bench/control_plane.py's driver). Over
``--seconds`` after ``--warmup``, every scheduling call that finds work is timed in wall
time: each (sub-)scheduler's PE group fetch and DE group fetch, and in the hierarchy the
root's routing of each new turn (``core.hierarchy.route_to_subs``). ``--json`` prints one
object, key ``hier_vs_flat_runtime``: per scheduler the calls by kind, decision latency
p50/p99 over all calls and by kind (us; wall time, and the calling thread's CPU time, which
leaves out waits for a core or for the GIL the subs' threads share), the scheduling time per
turn decided, and the turns/s reached.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from control_plane import Driver  # bench/ is not a package

from dualpath_cli.cluster.system import RuntimeSystem
from dualpath_cli.config.model import parse_pd
from dualpath_cli.runtime import hierarchy
from dualpath_cli.runtime.gctune import pace_gc_for_scheduler
from dualpath_cli.runtime.options import RuntimeOptions
from dualpath_cli.workload.build import synthetic_trace


def _timed(fn: Callable[..., Any], out: list[tuple[float, float]]) -> Callable[..., Any]:
    """``fn`` with each call's (wall, thread CPU) seconds appended to ``out`` (measurement
    only; the CPU leaves out the waits for a core or for the GIL that wall time includes)."""
    def call(*args: Any) -> Any:
        t, c = time.perf_counter(), time.thread_time()
        try:
            return fn(*args)
        finally:
            out.append((time.perf_counter() - t, time.thread_time() - c))
    return call


def _quantiles(xs: list[tuple[float, float]]) -> dict[str, Any]:
    if not xs:
        return {"calls": 0, "p50_us": None, "p99_us": None, "cpu_p50_us": None,
                "cpu_p99_us": None}
    a = np.asarray(xs) * 1e6
    out: dict[str, Any] = {"calls": len(xs)}
    for col, name in ((0, ""), (1, "cpu_")):
        for q in (50, 99):
            out[f"{name}p{q}_us"] = round(float(np.percentile(a[:, col], q)), 1)
    return out


def run_one(args: argparse.Namespace, hierarchical: bool) -> dict[str, Any]:
    """One scheduler's window (flat or hierarchical) on a fresh emulated cluster."""
    spec = parse_pd(args.pd)
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    samples: dict[str, list[tuple[float, float]]] = defaultdict(list)
    with tempfile.TemporaryDirectory(prefix="dualpath-hier-", dir=shm) as tmp:
        opts = RuntimeOptions(
            prefill_nodes=spec.prefill_nodes, decode_nodes=spec.decode_nodes,
            gpus_per_node=8, engines="emulated", emulated_hosts=args.hosts,
            emulated_speed=args.speed, store_dir=Path(tmp), block_tokens=64,
            heartbeat_s=args.heartbeat, fetch_s=args.fetch,
            heartbeat_timeout=args.heartbeat_timeout, decision_ring=1000,
            hierarchical=hierarchical, sub_schedulers=args.subs if hierarchical else 0)
        system = RuntimeSystem(opts)
        route = hierarchy.route_to_subs
        try:
            t0 = time.monotonic()
            system.start(timeout=600)
            start_s = time.monotonic() - t0
            system.scheduler.metrics(fresh=True, timeout=120)  # every engine connected
            subs = system.scheduler.schedulers()  # the schedulers we time
            for sub in subs:
                sub._pe_fetch = _timed(sub._pe_fetch, samples["pe_fetch"])  # type: ignore[method-assign]
                sub._de_fetch = _timed(sub._de_fetch, samples["de_fetch"])  # type: ignore[method-assign]
            hierarchy.route_to_subs = _timed(route, samples["root_route"])
            trace = synthetic_trace(64_000, args.agents, seed=1)
            driver = Driver(system, list(trace.trajectories), args.rate)
            driver.thread.start()
            time.sleep(args.warmup)  # the measurement window, not a race
            for xs in samples.values():
                xs.clear()
            d0, w0 = driver.completed, time.monotonic()
            q0 = system.scheduler.log.last_seq or 0
            time.sleep(args.seconds)
            window = {k: list(v) for k, v in samples.items()}
            d1, w1 = driver.completed, time.monotonic()
            q1 = system.scheduler.log.last_seq or 0
            driver.stop.set()
            driver.thread.join(5)
            dead = sum(1 for e in system.scheduler.engines.values() if not e.alive)
        finally:
            hierarchy.route_to_subs = route
            system.close()
    wall = w1 - w0
    every = [x for xs in window.values() for x in xs]
    decided = q1 - q0
    return {
        "scheduler": f"hierarchical ({len(subs)})" if hierarchical else "flat",
        "subs": len(subs) if hierarchical else 0, **_quantiles(every),
        "by_kind": {k: _quantiles(v) for k, v in sorted(window.items())},
        "sched_us_per_turn": round(1e6 * sum(w for w, _ in every) / decided, 1)
        if decided else None,
        "sched_cpu_us_per_turn": round(1e6 * sum(c for _, c in every) / decided, 1)
        if decided else None,
        "decisions": decided, "turns_per_s": round((d1 - d0) / wall, 1),
        "dead_engines": dead, "start_s": round(start_s, 1), "window_s": round(wall, 1),
    }


def main(argv: list[str] | None = None) -> int:
    pace_gc_for_scheduler()  # this process hosts the schedulers it measures
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--pd", default="48P96D")
    ap.add_argument("--subs", type=int, default=0, help="sub-schedulers (0: core default)")
    ap.add_argument("--rate", type=float, default=100.0)
    ap.add_argument("--agents", type=int, default=300)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--warmup", type=float, default=15.0)
    ap.add_argument("--speed", type=float, default=10.0)
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--heartbeat", type=float, default=1.0)
    ap.add_argument("--fetch", type=float, default=0.1)
    ap.add_argument("--heartbeat-timeout", type=float, default=120.0)
    args = ap.parse_args(argv)
    rows = [run_one(args, False), run_one(args, True)]
    load = os.getloadavg()[0]
    if args.json:
        print(json.dumps({"hier_vs_flat_runtime": {"pd": args.pd, "rate": args.rate,
                                                   "agents": args.agents, "rows": rows,
                                                   "load_average": round(load, 1)}}))
        return 0
    print(f"{args.pd}, {args.agents} agents at {args.rate:g} turns/s offered, "
          f"{args.seconds:g} s window (load average {load:.1f})")
    print("wall (CPU) microseconds per scheduling call that found work")
    print("| scheduler | calls | p50 us | p99 us | pe_fetch p50/p99 | de_fetch p50/p99 | "
          "root p50/p99 | sched us per turn | turns/s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        k = r["by_kind"]

        def pq(name: str, k: dict[str, Any] = k) -> str:
            q = k.get(name)
            if not q or not q["calls"]:
                return "-"
            return (f"{q['p50_us']} ({q['cpu_p50_us']}) / {q['p99_us']} "
                    f"({q['cpu_p99_us']})")

        print(f"| {r['scheduler']} | {r['calls']} | {r['p50_us']} ({r['cpu_p50_us']}) | "
              f"{r['p99_us']} ({r['cpu_p99_us']}) | {pq('pe_fetch')} | {pq('de_fetch')} | "
              f"{pq('root_route')} | {r['sched_us_per_turn']} ({r['sched_cpu_us_per_turn']}) "
              f"| {r['turns_per_s']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
