"""Benchmark: the embedded runtime in the paper's regime, every policy on one workload.

Usage: ``python bench/runtime.py [--json] [--runs N] [--agents N] [--snic-bw RATE]
[--policies basic,dualpath,oracle] [--preset P] [--config FILE] [--set key=value ...]``.

The setup is the deployment config (default preset ``embedded``: 1P2D, reference model,
64-token blocks) with the bench defaults of :mod:`dualpath_cli.services.bench`. Each run
first measures the compute rate (``--calibrate oracle``, the default: the workload's FLOPs
over a compute-only oracle run's JCT; ``probe``: one engine's prefill, runtime/calibrate.py)
and sizes the storage NICs so that Basic's storage time is ``REGIME_MULTIPLE`` (2.5, from the
paper's Figure 1) times the compute time; ``--snic-bw`` fixes the rate instead. Targets
(issue 18): JCT(basic)/JCT(dualpath) >= 1.8 and JCT(dualpath)/JCT(oracle) <= 1.2 in every
run, also with other work on the machine; every run reports the CPU other processes took
meanwhile (telemetry/hostload.py).

``--json`` prints one object: ``runs`` (per run: ``jct_s`` and ``snic_max_avg`` by policy,
``basic_over_dualpath``, ``dualpath_over_oracle``, ``snic_bw``, ``flops_rate``,
``foreign_cores`` by policy, ``setup``, ``policies``), the same ratios, ``snic_bw``,
``flops_rate`` and ``foreign_cores`` (the most any policy saw, per run) summarised as
``{"min", "median", "max"}`` over the runs, ``jct_s`` and ``snic_max_avg`` (median per
policy), ``goals``, ``goals_met`` (every run meets both) and ``priority_boost``.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from dualpath_cli.cli.output import to_jsonable
from dualpath_cli.errors import DualPathError
from dualpath_cli.runtime.options import options_from_config
from dualpath_cli.runtime.workloads import agentic_workload
from dualpath_cli.services.bench import (
    BenchReport,
    PolicyReport,
    calibrate_by_oracle,
    load_bench_config,
    run_bench,
)
from dualpath_cli.services.runner import RunResult
from dualpath_cli.telemetry.hostload import cpu_priority
from dualpath_cli.units import format_bytes

POLICIES = ["basic", "dualpath", "oracle", "split", "round-robin"]
GOAL_BASIC_OVER_DUALPATH = 1.8
GOAL_DUALPATH_OVER_ORACLE = 1.2


def spread(values: list[float]) -> dict[str, float] | None:
    """``{"min", "median", "max"}`` of ``values`` (None when empty)."""
    if not values:
        return None
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def run_summary(report: BenchReport) -> dict[str, Any]:
    """One run's headline numbers (ratios are None when a policy was not run)."""
    out = report.to_dict()
    j = out["jct_s"]
    cal = report.setup.get("snic_calibration") or {}
    foreign = {p.policy: p.foreign_cores for p in report.policies}
    return {
        "jct_s": j, "snic_max_avg": out["snic_max_avg"],
        "basic_over_dualpath": j["basic"] / j["dualpath"] if {"basic", "dualpath"} <= set(j)
        else None,
        "dualpath_over_oracle": j["dualpath"] / j["oracle"] if {"dualpath", "oracle"} <= set(j)
        else None,
        "snic_bw": report.setup["snic_bw"], "flops_rate": cal.get("flops_rate"),
        "foreign_cores": foreign, "setup": out["setup"], "policies": out["policies"]}


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Min/median/max over ``runs`` of the ratios, rates and host load; the goals' verdict."""
    def col(key: str) -> list[float]:
        return [r[key] for r in runs if r[key] is not None]

    busiest = [max(v for v in r["foreign_cores"].values() if v is not None)
               for r in runs if any(v is not None for v in r["foreign_cores"].values())]
    names = list(runs[0]["jct_s"]) if runs else []
    b_d, d_o = col("basic_over_dualpath"), col("dualpath_over_oracle")
    met = None
    if b_d and d_o and len(b_d) == len(d_o) == len(runs):
        met = all(x >= GOAL_BASIC_OVER_DUALPATH for x in b_d) and all(
            x <= GOAL_DUALPATH_OVER_ORACLE for x in d_o)
    return {
        "runs": runs,
        "basic_over_dualpath": spread(b_d), "dualpath_over_oracle": spread(d_o),
        "snic_bw": spread(col("snic_bw")), "flops_rate": spread(col("flops_rate")),
        "foreign_cores": spread(busiest),
        "jct_s": {p: statistics.median(r["jct_s"][p] for r in runs) for p in names},
        "snic_max_avg": {p: statistics.median(r["snic_max_avg"][p] for r in runs)
                         for p in names},
        "goals": {"basic_over_dualpath_min": GOAL_BASIC_OVER_DUALPATH,
                  "dualpath_over_oracle_max": GOAL_DUALPATH_OVER_ORACLE},
        "goals_met": met}


def _fmt(s: dict[str, float] | None, spec: str = ".2f") -> str:
    if s is None:
        return "-"
    return f"{s['min']:{spec}} / {s['median']:{spec}} / {s['max']:{spec}}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--runs", type=int, default=1, help="runs (each one calibrated anew)")
    ap.add_argument("--agents", type=int, default=16)
    ap.add_argument("--turns", type=int, default=12)
    ap.add_argument("--first-append", type=int, default=128)
    ap.add_argument("--append", type=int, default=64)
    ap.add_argument("--gen", type=int, default=2)
    ap.add_argument("--snic-bw", default=None, help="fix the storage-NIC rate (no calibration)")
    ap.add_argument("--preset", default=None)
    ap.add_argument("--config", type=Path, default=None)
    ap.add_argument("--set", action="append", default=[], dest="sets")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--calibrate", choices=("probe", "oracle"), default="oracle",
                    help="the compute rate the NICs are sized from: the workload's FLOPs over "
                    "an oracle run's JCT (default; run first, reused as the oracle row), or a "
                    "probe of one engine's prefill")
    ap.add_argument("--boost", action="store_true",
                    help="raise this session's autogroup priority while measuring "
                    "(telemetry/hostload.py; other sessions' jobs then take little CPU, a "
                    "neighbour in this session still competes as an equal)")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the temp stores are removed
    if args.runs < 1:
        print("error: --runs must be >= 1", file=sys.stderr)
        raise SystemExit(2)
    with cpu_priority(args.boost) as boosted:
        if args.boost and not boosted:
            print("warning: --boost: could not raise the priority (needs CAP_SYS_NICE and "
                  "autogroup scheduling)", file=sys.stderr)
        out = measure(args)
    out["priority_boost"] = boosted
    report(out, args.json)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Calibrate and run ``args.runs`` times; the summary (:func:`summarise`)."""
    traj = agentic_workload(args.agents, turns=args.turns, first_append=args.first_append,
                            append=args.append, gen=args.gen)
    runs: list[dict[str, Any]] = []
    for k in range(args.runs):
        try:
            loaded, applied, cal = load_bench_config(
                traj, preset=args.preset, config_file=args.config, sets=args.sets,
                snic_bw=args.snic_bw)
            base = options_from_config(loaded, processes=True)
        except DualPathError as err:
            print(f"error: {err}", file=sys.stderr)
            raise SystemExit(2) from None
        if cal is not None:
            rate = format_bytes(cal.snic_bw, binary=False)
            print(f"run {k + 1}: compute {cal.flops_rate / 1e9:.2f} GFLOP/s ({cal.probes} "
                  f"probes) -> storage NIC {rate}/s per node (Basic "
                  f"reads {cal.basic_storage_s:.1f} s = {cal.multiple:g} x compute "
                  f"{cal.compute_s:.1f} s)", file=sys.stderr, flush=True)
        workload = {"first_append": args.first_append, "append": args.append,
                    "gen": args.gen, "bench_defaults": applied}
        with tempfile.TemporaryDirectory(prefix="dualpath-bench-") as root:
            done: dict[str, tuple[PolicyReport, RunResult]] = {}
            if cal is not None and args.calibrate == "oracle":
                loaded, applied, cal, done["oracle"] = calibrate_by_oracle(
                    traj, base, Path(root), preset=args.preset, config_file=args.config,
                    sets=args.sets)
                base = options_from_config(loaded, processes=True)
                workload["bench_defaults"] = applied
                assert cal is not None
                print(f"run {k + 1}: oracle {done['oracle'][1].jct:.2f} s -> "
                      f"{cal.flops_rate / 1e9:.2f} GFLOP/s -> storage NIC "
                      f"{format_bytes(cal.snic_bw, binary=False)}/s per node",
                      file=sys.stderr, flush=True)
            report = run_bench(args.policies.split(","), base, traj, Path(root),
                               setup=workload, calibration=cal, done=done)
        run = run_summary(report)
        runs.append(run)
        print(f"run {k + 1}: JCT {', '.join(f'{p} {s:.2f} s' for p, s in run['jct_s'].items())}"
              f"; other processes {max(v or 0.0 for v in run['foreign_cores'].values()):.2f} "
              "cores", file=sys.stderr, flush=True)
    return summarise(runs)


def report(out: dict[str, Any], as_json: bool) -> None:
    """Print the summary: one JSON object, or the per-run table and the min/median/max."""
    if as_json:
        print(json.dumps(to_jsonable(out)))
        return
    runs = out["runs"]
    print(f"setup: {runs[-1]['setup']}")
    print(f"{'run':>3} {'policy':<12} {'JCT s':>7} {'SNIC Max/Avg':>13} {'GPU busy':>9} "
          f"{'bubble s':>9} {'PE batch':>9} {'tokens':>7} {'other CPU':>9}")
    for k, run in enumerate(runs, 1):
        for p in run["policies"]:
            other = "-" if p["foreign_cores"] is None else f"{p['foreign_cores']:.2f}"
            print(f"{k:>3} {p['policy']:<12} {p['jct_s']:7.2f} {p['snic_max_avg']:13.2f} "
                  f"{p['gpu_busy']:9.1%} {p['bubble_s']:9.3f} {p['pe_batch_mean']:9.2f} "
                  f"{'same' if p['tokens_match'] else 'DIFF':>7} {other:>9}")
    snic = out["snic_bw"]
    print("storage NIC per node (min / median / max): "
          + ("-" if snic is None else " / ".join(f"{format_bytes(snic[q], binary=False)}/s"
                                                  for q in ("min", "median", "max"))))
    print(f"JCT basic/dualpath (min / median / max): {_fmt(out['basic_over_dualpath'])} "
          f"(goal >= {GOAL_BASIC_OVER_DUALPATH} in every run)")
    print(f"JCT dualpath/oracle (min / median / max): {_fmt(out['dualpath_over_oracle'])} "
          f"(goal <= {GOAL_DUALPATH_OVER_ORACLE} in every run)")
    print(f"other processes' CPU, cores (min / median / max): {_fmt(out['foreign_cores'])}")
    print(f"priority boost: {'on' if out['priority_boost'] else 'off'}")
    if out["goals_met"] is not None:
        print(f"goals met in every run: {'yes' if out['goals_met'] else 'NO'}")


if __name__ == "__main__":
    main()
