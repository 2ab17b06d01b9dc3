"""Benchmark: the embedded runtime in an I/O-bound setting, every policy on one workload.

Usage: ``python bench/runtime.py [--json] [--agents N] [--snic-bw 7MB/s] [--preset P]
[--config FILE] [--set key=value ...]``.
The setup is the deployment config (default preset ``embedded``: 1P2D, reference model,
64-token blocks) with the bench defaults of :mod:`dualpath_cli.services.bench` (storage NICs
shaped so that reading over the three nodes takes about as long as prefilling). Targets
(issue 4): JCT(basic)/JCT(dualpath) >= 1.8 at 1P2D and JCT(dualpath) <= 1.2 x JCT(oracle).
``--json`` prints one object whose ``jct_s`` and ``snic_max_avg`` map each policy to its
number (plus ``setup`` and ``policies`` with every measurement).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from dualpath_cli.cli.output import to_jsonable
from dualpath_cli.errors import DualPathError
from dualpath_cli.runtime.options import options_from_config
from dualpath_cli.runtime.workloads import agentic_workload
from dualpath_cli.services.bench import load_bench_config, run_bench

POLICIES = ["basic", "dualpath", "oracle", "split", "round-robin"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--agents", type=int, default=16)
    ap.add_argument("--turns", type=int, default=12)
    ap.add_argument("--first-append", type=int, default=128)
    ap.add_argument("--append", type=int, default=64)
    ap.add_argument("--gen", type=int, default=2)
    ap.add_argument("--snic-bw", default=None)
    ap.add_argument("--preset", default=None)
    ap.add_argument("--config", type=Path, default=None)
    ap.add_argument("--set", action="append", default=[], dest="sets")
    ap.add_argument("--policies", default=",".join(POLICIES))
    args = ap.parse_args()
    traj = agentic_workload(args.agents, turns=args.turns, first_append=args.first_append,
                            append=args.append, gen=args.gen)
    try:
        loaded, applied = load_bench_config(traj, preset=args.preset, config_file=args.config,
                                            sets=args.sets, snic_bw=args.snic_bw)
        base = options_from_config(loaded, processes=True)
    except DualPathError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    workload = {"first_append": args.first_append, "append": args.append, "gen": args.gen,
                "bench_defaults": applied}
    with tempfile.TemporaryDirectory(prefix="dualpath-bench-") as root:
        report = run_bench(args.policies.split(","), base, traj, Path(root), setup=workload)
    out = report.to_dict()
    if args.json:
        print(json.dumps(to_jsonable(out)))
        return
    print(f"setup: {out['setup']}")
    print(f"{'policy':<12} {'JCT s':>7} {'SNIC Max/Avg':>13} {'GPU busy':>9} {'bubble s':>9} "
          f"{'PE batch':>9} {'tokens':>7}")
    for p in report.policies:
        print(f"{p.policy:<12} {p.jct_s:7.2f} {p.snic_max_avg:13.2f} {p.gpu_busy:9.1%} "
              f"{p.bubble_s:9.3f} {p.pe_batch_mean:9.2f} {'same' if p.tokens_match else 'DIFF':>7}")
    j = out["jct_s"]
    if {"basic", "dualpath", "oracle"} <= set(j):
        print(f"JCT basic/dualpath = {j['basic'] / j['dualpath']:.2f} (target >= 1.8); "
              f"dualpath/oracle = {j['dualpath'] / j['oracle']:.2f} (target <= 1.2)")


if __name__ == "__main__":
    main()
