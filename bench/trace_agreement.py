"""Simulator and runtime on one Mooncake-shaped log: JCT and prefix hits (issue 36 part 4).

Usage::

    python bench/trace_agreement.py              # a table (a few minutes on 2 cores)
    python bench/trace_agreement.py --json       # one JSON object
    python bench/trace_agreement.py --conversations 12 --rate 0.5 --seed 3

Steps:

1. Generate a Mooncake-format log (``workload.mooncake_gen``: conversations that share a
   system prompt, task prompts and first tool outputs at different depths, then grow turn
   by turn) and link it as ``dualpath trace convert`` does: every turn keeps its request's
   block chain, every conversation its first arrival.
2. The runtime: what ``dualpath bench --trace LOG --policy dualpath --calibrate probe`` runs
   (services.bench: the embedded default 1P2D, storage NICs calibrated to this host from a
   probe; agents start at their arrival; each turn sends the ids its chain names). Its JCT,
   and its hit ratio from the scheduler's own store-lookup counters.
3. The simulator: the same trajectories, arrivals and setting (alpha, beta, quota, fetch
   period, the runtime's block size, the bench's storage-NIC rate less the block header) in
   the digital twin's embedded world of this host (services.twin ``world_for``: the
   reference model's prefill FLOP/s, per-forward overhead and decode step measured here
   right after the runtime run, engines sharing this host's cores, whole-block hits), as
   ``dualpath sim run --trace`` replays a trace. The twin probes the prefill FLOP/s at the
   traffic's mean turn (its mean context and append, ``services.twin.mean_turn``, as
   ``dualpath bench`` probes it); one departure from the twin: the compute is measured
   afresh (``measure_compute``), not the twin's kept measurement (``host_compute`` keeps
   the first it took for a shape: one taken at load 20 made the simulator 51% slow
   against a runtime run at load 16). ``--twin-probe`` shows the probe the twin used
   before (128 new tokens after 512 cached; the reference model computes long prompts
   faster per FLOP, 11.5 against 7.7 GFLOP/s here, which left the simulator 47% slow).
4. The independent count: ``workload.mooncake.mooncake_stats(log).prefix_hit_ratio``.

Storage reads: the runtime's ``snic_read_mb_by_node`` counts each request's blocks (a block
several requests joined counts for each), ``store_read_mb_by_node`` what its loaders read
(once per joined read); the simulator's ``snic_read_mb_by_node`` is what its NICs carried
(it joins reads the same way, ``sim/kv_reads.py``), ``joined_read_tokens`` what it joined.

Reported: ``runtime_jct_s``, ``sim_jct_s``, ``jct_error`` (sim / runtime - 1; goal: within
15%), ``runtime_hit_ratio``, ``sim_hit_ratio``, ``independent_hit_ratio`` (goal: within one
point of each other), the cross-conversation shares, and the CPU other processes used
during the runtime run (on a shared host the runtime's JCT moves with it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from dualpath_cli.runtime.options import RuntimeOptions, options_from_config
from dualpath_cli.services.bench import load_bench_config, run_bench
from dualpath_cli.services.twin import measure_compute, world_for
from dualpath_cli.sim import plans_from_trajectories
from dualpath_cli.sim.twin_replay import Setting, Traffic, World
from dualpath_cli.telemetry.hostload import ForeignCpu, cpu_priority
from dualpath_cli.workload.mooncake import mooncake_stats
from dualpath_cli.workload.mooncake_gen import ConversationShape, generate_conversations
from dualpath_cli.workload.mooncake_link import hit_split, link_requests
from dualpath_cli.workload.trajectory import Trajectory

GOAL_JCT = 0.15
GOAL_HITS = 0.01


def shape_of(args: argparse.Namespace) -> ConversationShape:
    """A log small enough for the reference model on a CPU in a minute or two: prompts of
    one to a few 512-token blocks, a tree of one system prompt, two tasks and two first tool
    outputs each, answers of a few tokens (a CPU decodes slowly)."""
    return ConversationShape(conversations=args.conversations, branching=(1, 2, 2),
                             shared_tokens=(520, 720), turns=(2, 4), own_tokens=(32, 256),
                             output_tokens=(2, 6), rate_per_s=args.rate, think_s=1.0,
                             service_s=0.5)


def run_runtime(trajs: list[Trajectory], root: Path) -> tuple[RuntimeOptions, dict[str, Any]]:
    """``dualpath bench --trace --policy dualpath --calibrate probe``'s run, in process."""
    loaded, _, cal = load_bench_config(trajs)
    base = options_from_config(loaded, processes=True)
    meter = ForeignCpu()
    meter.start()
    report = run_bench(["dualpath"], base, trajs, root, calibration=cal)
    other = meter.stop()
    row = report.policies[0]
    if row.errors:
        raise SystemExit(f"runtime run failed: {row.errors[-1]}")
    engines = base.gpus_per_node * (base.prefill_nodes + base.decode_nodes)
    return base, {"jct_s": row.jct_s, "hit_ratio": row.hit_ratio,
                  "busy_s": round(row.gpu_busy * row.jct_s * engines, 2),
                  "pe_batch_mean": round(row.pe_batch_mean, 2), "pe_chunks": row.pe_chunks,
                  "snic_read_mb": round(sum(row.snic_read_bytes.values()) / 1e6, 2),
                  "snic_read_mb_by_node": [round(b / 1e6, 2) for _, b in
                                           sorted(row.snic_read_bytes.items())],
                  "store_read_mb_by_node": [round(b / 1e6, 2) for _, b in
                                            sorted(row.store_read_bytes.items())],
                  "flops_rate": None if cal is None else cal.flops_rate,
                  "cross_share": row.cross_conversation_hit_share,
                  "prompt_tokens": row.prompt_tokens, "hit_tokens": row.hit_tokens,
                  "foreign_cores": None if other is None else round(other, 2)}


def run_sim(trajs: list[Trajectory], base: RuntimeOptions,
            old_probe: bool = False) -> tuple[World, dict[str, Any]]:
    """The same workload and setting in the twin's embedded world of this host, measured
    now at the traffic's mean turn (``old_probe``: at 128 new tokens after 512 instead)."""
    from dualpath_cli.sim import make_setup
    from dualpath_cli.sim.measured import TimedSimulation

    pd = f"{base.prefill_nodes}P{base.decode_nodes}D"
    plans = plans_from_trajectories(trajs)
    setting = Setting(base.alpha, base.beta, base.quota_s, base.policy, pd)
    traffic = Traffic("generated log", base.model, pd, setting, base.z_factor, tuple(plans),
                      sum(p.num_turns for p in plans), 0.0, base.snic_bw,
                      block_tokens=base.block_tokens)
    def measure(model: str, context: int, new: int) -> dict[str, float]:
        return measure_compute(model, 512, 128) if old_probe else measure_compute(
            model, context, new)

    world = world_for(traffic, calibrate=False, measure=measure)
    setup = make_setup("ds660b", pd, base.policy, "hopper", calibration=world.calibration,
                       alpha=base.alpha, beta=base.beta)
    setup = replace(setup, model=world.model, hardware=world.hardware)
    sim = TimedSimulation(setup, plans)
    res = sim.run_offline()  # agents at their plans' start_s
    return world, {"jct_s": res.jct, "hit_ratio": res.hit_ratio,
                   "busy_s": round(sum(e.busy_time for e in (*sim.pes, *sim.des)), 2),
                   "pe_busy_s": round(sum(e.busy_time for e in sim.pes), 2),
                   "pe_batches": sum(e.batches for e in sim.pes),
                   "snic_util": round(res.snic_util, 3),
                   "read_tokens": [res.read_tokens_pe_side, res.read_tokens_de_side],
                   "joined_read_tokens": int(res.extra.get("joined_read_tokens", 0)),
                   "snic_read_mb_by_node": [round(n.read_bytes / 1e6, 2) for n in sim.nodes],
                   "snic_kv_rate_mb_s": round(world.hardware.snic_bandwidth / 1e6, 3),
                   "cross_share": res.cross_conversation_hit_share,
                   "prompt_tokens": res.prompt_tokens, "hit_tokens": res.hit_tokens}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--conversations", type=int, default=16)
    ap.add_argument("--rate", type=float, default=2.0,
                    help="conversation starts per second in the log (default 2)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--twin-probe", action="store_true",
                    help="calibrate the simulator's prefill with the twin's former probe (128 "
                    "new tokens after 512) instead of at the workload's mean turn")
    ap.add_argument("--no-boost", action="store_true",
                    help="do not raise this session's autogroup priority while measuring")
    args = ap.parse_args()
    with cpu_priority(not args.no_boost) as boosted:
        out = measure(args, boosted)
    if args.json:
        print(json.dumps(out))
        return
    print(f"log: {out['log']['conversations']} conversations, {out['log']['requests']} "
          f"requests, {out['log']['input_tokens']:,} input tokens, "
          f"{out['log']['duration_s']:.1f} s of arrivals")
    print(f"{'':<12} {'JCT s':>8} {'hit ratio':>10} {'across':>8}")
    print(f"{'runtime':<12} {out['runtime_jct_s']:>8.2f} {out['runtime_hit_ratio']:>10.2%} "
          f"{out['runtime_cross_share']:>8.1%}")
    print(f"{'simulator':<12} {out['sim_jct_s']:>8.2f} {out['sim_hit_ratio']:>10.2%} "
          f"{out['sim_cross_share']:>8.1%}")
    print(f"{'independent':<12} {'':>8} {out['independent_hit_ratio']:>10.2%} "
          f"{out['independent_cross_share']:>8.1%}")
    print(f"JCT error {out['jct_error']:+.1%} (goal within {GOAL_JCT:.0%}): "
          f"{'met' if out['jct_within_goal'] else 'NOT met'}; hits within "
          f"{GOAL_HITS:.0%} point: {'met' if out['hits_within_goal'] else 'NOT met'}")
    print(f"other processes kept {out['foreign_cores']} cores busy during the runtime run; "
          f"load average {out['load_average']}; {out['wall_s']:.0f} s")


def measure(args: argparse.Namespace, boosted: bool) -> dict[str, Any]:
    """Generate, run both, compare (module docstring)."""
    wall = time.perf_counter()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    requests = generate_conversations(shape_of(args), args.seed)
    stats = mooncake_stats(requests)
    hits, cross = hit_split(requests)
    trace, _ = link_requests(requests)
    trajs = list(trace.trajectories)
    with tempfile.TemporaryDirectory(prefix="dualpath-agreement-") as root:
        t0 = time.perf_counter()
        base, rt = run_runtime(trajs, Path(root))
        print(f"runtime: JCT {rt['jct_s']:.2f} s, hits {rt['hit_ratio']:.2%} "
              f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
    world, sim = run_sim(trajs, base, args.twin_probe)
    err = sim["jct_s"] / rt["jct_s"] - 1.0
    ind = stats.prefix_hit_ratio
    return {
        "runtime_jct_s": round(rt["jct_s"], 3), "sim_jct_s": round(sim["jct_s"], 3),
        "jct_error": round(err, 4),
        "runtime_hit_ratio": round(rt["hit_ratio"], 4),
        "sim_hit_ratio": round(sim["hit_ratio"], 4),
        "independent_hit_ratio": round(ind, 4),
        "runtime_cross_share": round(rt["cross_share"], 4),
        "sim_cross_share": round(sim["cross_share"], 4),
        "independent_cross_share": round(cross / hits, 4) if hits else 0.0,
        "jct_within_goal": abs(err) <= GOAL_JCT,
        "hits_within_goal": max(abs(rt["hit_ratio"] - ind), abs(sim["hit_ratio"] - ind))
        <= GOAL_HITS,
        "log": {"conversations": args.conversations, "rate_per_s": args.rate,
                "seed": args.seed, "requests": stats.requests,
                "input_tokens": stats.input_tokens,
                "duration_s": round(stats.duration_s, 1), "trajectories": len(trajs)},
        "setting": {"pd": f"{base.prefill_nodes}P{base.decode_nodes}D",
                    "block_tokens": base.block_tokens, "snic_bw": base.snic_bw,
                    "fetch_s": base.fetch_s, "quota_s": base.quota_s},
        "sim_world": list(world.notes),
        "where_the_time_goes": {  # engine busy seconds (all engines), batching, NICs
            "runtime": {k: rt[k] for k in ("busy_s", "pe_batch_mean", "pe_chunks",
                                           "flops_rate", "snic_read_mb",
                                           "snic_read_mb_by_node", "store_read_mb_by_node")},
            "sim": {k: sim[k] for k in ("busy_s", "pe_busy_s", "pe_batches", "snic_util",
                                        "read_tokens", "joined_read_tokens",
                                        "snic_read_mb_by_node", "snic_kv_rate_mb_s")}},
        "foreign_cores": rt["foreign_cores"], "priority_boost": boosted,
        "load_average": None if load is None else round(load, 2),
        "wall_s": round(time.perf_counter() - wall, 1),
    }


if __name__ == "__main__":
    main()
