"""Benchmark: live tuning (issue 14). What the dynamic controllers gain, and (part
``suggest``) how long ``tune suggest`` takes.

Usage::

    python bench/tuning.py                         # every part, a table
    python bench/tuning.py --parts dynamic --json  # one JSON object

Part ``dynamic`` (key ``dynamic_gain``): JCT with the dynamic controllers (alpha from the
busiest storage NIC's utilisation, beta from the PEs' GPU utilisation, the compute quota from
the TTFT tail; ``core/controllers.py``) on versus off, on the same workload:

* ``sim``: the simulator at 2P4D, DS 660B, the 64K synthetic workload (``--sim-agents``
  agents offline, policy dualpath), once per controller alone and once with all three;
* ``runtime``: the embedded runtime (1P2D, the reference model, the bench's calibrated
  storage NICs, ``--rt-agents`` agents x ``--rt-turns`` turns, policy dualpath), controllers
  off, each alone and all on (stepping every ``--rt-interval`` seconds), ``--rt-repeat``
  times in turn; each JCT is the median of its repeats.

``gain`` is ``jct_off / jct_on - 1``: positive means the controllers made the job faster.
The seed claims +5-8% throughput from a dynamic threshold; this reports what it is here,
whatever the sign.

Each part is a function in :data:`PARTS` returning its keys; a part not built yet is
refused by name.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dualpath_cli.errors import DualPathError, UsageError
from dualpath_cli.telemetry.hostload import cpu_priority

ALL_CONTROLLERS = ("alpha", "beta", "quota")


def _gain(off: float, on: float) -> float | None:
    return round(off / on - 1.0, 4) if on > 0 else None


def sim_dynamic(agents: int, pd: str = "2P4D", model: str = "ds660b", max_len: int = 64_000,
                seed: int = 1) -> dict[str, Any]:
    """Offline JCT in the simulator: controllers off, each alone, all on."""
    from dualpath_cli.sim import make_setup, simulate_offline, synthetic_plans

    plans = synthetic_plans(max_len, agents, seed)
    runs: dict[str, dict[str, Any]] = {}
    for label, ctl in (("off", ()), ("alpha", ("alpha",)), ("beta", ("beta",)),
                       ("quota", ("quota",)), ("all", ALL_CONTROLLERS)):
        res = simulate_offline(make_setup(model, pd, "dualpath", controllers=ctl), plans)
        runs[label] = {"jct_s": round(res.jct, 2),
                       "mean_trajectory_s": round(res.extra["mean_trajectory_s"], 2),
                       "snic_util": round(res.snic_util, 4), "pe_util": round(res.pe_util, 4),
                       "moves": int(res.extra.get("controller_moves", 0)),
                       "alpha_end": int(res.extra["alpha_tokens"]),
                       "beta_end": int(res.extra["beta_tokens"]),
                       "wall_s": round(res.wall_s, 2)}
    off = runs["off"]["jct_s"]
    return {"setup": {"pd": pd, "model": model, "max_len": max_len, "agents": agents,
                      "policy": "dualpath", "mode": "offline"},
            "runs": runs,
            "gain": {k: _gain(off, v["jct_s"]) for k, v in runs.items() if k != "off"}}


def runtime_dynamic(agents: int, turns: int, interval_s: float,
                    repeat: int = 1) -> dict[str, Any]:
    """Offline JCT on the embedded runtime (1P2D): controllers off, each alone, all on;
    ``repeat`` rounds (the runs of a round back to back), medians reported."""
    from dualpath_cli.runtime.options import options_from_config
    from dualpath_cli.runtime.workloads import agentic_workload
    from dualpath_cli.services.bench import calibrate_by_oracle, load_bench_config, run_policy

    trajectories = agentic_workload(agents, turns=turns)
    root = Path(tempfile.mkdtemp(prefix="dualpath-tuning-"))
    try:
        loaded, _, _ = load_bench_config(trajectories)
        base = options_from_config(loaded, processes=True)
        loaded, _, cal, _ = calibrate_by_oracle(trajectories, base, root)
        base = options_from_config(loaded, processes=True, control_interval_s=interval_s)
        samples: dict[str, list[dict[str, Any]]] = {}
        for _ in range(repeat):
            for label, on in (("off", ()), ("alpha", ("alpha",)), ("beta", ("beta",)),
                              ("quota", ("quota",)), ("all", ALL_CONTROLLERS)):
                opts = dataclasses.replace(
                    base, controllers={name: name in on for name in ALL_CONTROLLERS})
                t0 = time.perf_counter()
                rep, run = run_policy("dualpath", opts, trajectories, root)
                samples.setdefault(label, []).append({
                    "jct_s": rep.jct_s, "ttft_p99_s": rep.ttft_p99_s,
                    "snic_max_avg": rep.snic_max_avg, "gpu_busy": rep.gpu_busy,
                    "errors": len(run.errors), "wall_s": time.perf_counter() - t0})
        runs: dict[str, dict[str, Any]] = {}
        for label, rows in samples.items():
            runs[label] = {k: round(statistics.median(r[k] for r in rows), 4)
                           for k in rows[0]}
            runs[label]["jct_all_s"] = [round(r["jct_s"], 3) for r in rows]
        off = runs["off"]["jct_s"]
        return {"setup": {"pd": f"{base.prefill_nodes}P{base.decode_nodes}D",
                          "model": base.model, "agents": agents, "turns": turns,
                          "policy": "dualpath", "snic_bw": base.snic_bw,
                          "control_interval_s": interval_s,
                          "snic_calibrated": cal is not None},
                "repeat": repeat, "runs": runs,
                "gain": {k: _gain(off, v["jct_s"]) for k, v in runs.items() if k != "off"}}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def part_dynamic(args: argparse.Namespace) -> dict[str, Any]:
    """``dynamic_gain``: the controllers on vs off, in the simulator and the runtime."""
    out: dict[str, Any] = {
        "sim": sim_dynamic(args.sim_agents) if args.sim_agents > 0 else None}
    out["runtime"] = (runtime_dynamic(args.rt_agents, args.rt_turns, args.rt_interval,
                                      args.rt_repeat) if args.rt_agents > 0 else None)
    return {"dynamic_gain": out}


def part_suggest(args: argparse.Namespace) -> dict[str, Any]:
    """``suggest_s``: ``tune suggest --from`` 10 minutes of recorded 2P4D traffic, in a fresh
    process (bench/tune_suggest.py: the recording, the timing)."""
    from tune_suggest import bench_suggest  # bench/ is on sys.path when run as a script

    return bench_suggest(args.suggest_model)


PARTS: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "dynamic": part_dynamic,
    "suggest": part_suggest,
}
"""Part name -> function returning its keys (``suggest`` adds ``suggest_s``)."""

KNOWN_PARTS = ("dynamic", "suggest")


def _table(out: dict[str, Any]) -> str:
    lines = []
    dyn = out.get("dynamic_gain")
    if dyn:
        sim = dyn.get("sim") or {"setup": None, "runs": {}, "gain": {}}
        s = sim["setup"]
        if s:
            lines.append(f"dynamic controllers, simulator {s['pd']} {s['model']} "
                         f"{s['max_len'] // 1000}K, {s['agents']} agents offline "
                         f"({s['policy']})")
            lines.append(f"  {'controllers':<12} {'JCT s':>9} {'mean traj s':>12} "
                         f"{'gain':>8} {'moves':>6} {'SNIC util':>9} {'PE busy':>8}")
        for k, r in sim["runs"].items():
            g = sim["gain"].get(k)
            lines.append(f"  {k:<12} {r['jct_s']:>9.1f} {r['mean_trajectory_s']:>12.1f} "
                         f"{'-' if g is None else f'{g:+.2%}':>8} {r['moves']:>6} "
                         f"{r['snic_util']:>9.1%} {r['pe_util']:>8.1%}")
        rt = dyn.get("runtime")
        if rt:
            s = rt["setup"]
            lines.append(f"dynamic controllers, embedded runtime {s['pd']} {s['model']}, "
                         f"{s['agents']} agents x {s['turns']} turns ({s['policy']}, "
                         f"step every {s['control_interval_s']:g} s)")
            lines.append(f"  {'controllers':<12} {'JCT s':>9} {'TTFT p99 s':>11} {'gain':>8} "
                         f"{'Max/Avg':>8} {'GPU busy':>9}")
            for k, r in rt["runs"].items():
                g = rt["gain"].get(k)
                lines.append(f"  {k:<12} {r['jct_s']:>9.2f} {r['ttft_p99_s']:>11.3f} "
                             f"{'-' if g is None else f'{g:+.2%}':>8} "
                             f"{r['snic_max_avg']:>8.2f} {r['gpu_busy']:>9.1%}")
    for key, value in out.items():
        if key not in ("dynamic_gain", "parts", "priority_boost"):
            lines.append(f"{key}: {value}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the asked parts and print a table or one JSON object."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default=",".join(KNOWN_PARTS),
                    help="comma-separated parts: " + ", ".join(KNOWN_PARTS))
    ap.add_argument("--sim-agents", type=int, default=2048,
                    help="simulator agents (2P4D DS 660B 64K, offline; 0: skip the simulator)")
    ap.add_argument("--rt-agents", type=int, default=8,
                    help="embedded-runtime agents (0: skip the runtime)")
    ap.add_argument("--rt-turns", type=int, default=8, help="turns per runtime agent")
    ap.add_argument("--rt-interval", type=float, default=0.5,
                    help="runtime controller step, seconds")
    ap.add_argument("--rt-repeat", type=int, default=1,
                    help="rounds of runtime runs (medians reported)")
    ap.add_argument("--suggest-model", default="tiny",
                    help="suggest: the recorded cluster's model (tiny: embedded; ds660b)")
    ap.add_argument("--boost", action="store_true",
                    help="raise this session's autogroup priority while measuring")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args, rest = ap.parse_known_args(argv)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    try:
        bad = [p for p in parts if p not in KNOWN_PARTS]
        if bad or not parts:
            raise UsageError(f"--parts: unknown part {', '.join(bad) or '(none)'}; choose "
                             f"from {', '.join(KNOWN_PARTS)}")
        missing = [p for p in parts if p not in PARTS]
        if missing:
            raise UsageError(f"--parts: {', '.join(missing)} not built yet; built: "
                             f"{', '.join(PARTS)}")
        if rest:
            raise UsageError(f"unknown arguments: {' '.join(rest)}")
        out: dict[str, Any] = {"parts": parts}
        with cpu_priority(args.boost) as boosted:
            out["priority_boost"] = boosted
            for p in parts:
                out.update(PARTS[p](args))
    except DualPathError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    print(json.dumps(out) if args.json else _table(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
