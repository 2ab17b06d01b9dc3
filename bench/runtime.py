"""Benchmark: the embedded runtime in an I/O-bound setting, every policy on one workload.

Usage: ``python bench/runtime.py [--json] [--agents N] [--snic-bw 2MB/s] [--pd 1P2D]``.
Storage NICs are shaped so that reading the cached context dominates the compute of the
tiny reference model. Targets (issue 4): JCT(basic)/JCT(dualpath) >= 1.8 at 1P2D and
JCT(dualpath) <= 1.2 x JCT(oracle). ``--json`` prints one object whose ``jct_s`` and
``snic_max_avg`` map each policy to its number.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from dualpath_cli.cli.output import to_jsonable
from dualpath_cli.config.model import parse_pd
from dualpath_cli.runtime.bench import run_bench
from dualpath_cli.runtime.system import RuntimeOptions
from dualpath_cli.runtime.workloads import agentic_workload
from dualpath_cli.units import parse_bandwidth

POLICIES = ["basic", "dualpath", "oracle", "split", "round-robin"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--agents", type=int, default=8)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--first-append", type=int, default=512)
    ap.add_argument("--append", type=int, default=32)
    ap.add_argument("--snic-bw", default="4MB/s")
    ap.add_argument("--pd", default="1P2D")
    args = ap.parse_args()
    pd = parse_pd(args.pd)
    base = RuntimeOptions(prefill_nodes=pd.prefill_nodes, decode_nodes=pd.decode_nodes,
                          processes=True, snic_bw=parse_bandwidth(args.snic_bw),
                          block_tokens=16)
    traj = agentic_workload(args.agents, turns=args.turns, first_append=args.first_append,
                            append=args.append)
    with tempfile.TemporaryDirectory(prefix="dualpath-bench-") as root:
        report = run_bench(POLICIES, base, traj, Path(root))
    out = report.to_dict()
    if args.json:
        print(json.dumps(to_jsonable(out)))
        return
    print(f"setup: {out['setup']}")
    print(f"{'policy':<12} {'JCT s':>7} {'SNIC Max/Avg':>13} {'GPU busy':>9} {'bubble s':>9} "
          f"{'tokens':>7}")
    for p in report.policies:
        print(f"{p.policy:<12} {p.jct_s:7.2f} {p.snic_max_avg:13.2f} {p.gpu_busy:9.1%} "
              f"{p.bubble_s:9.3f} {'same' if p.tokens_match else 'DIFF':>7}")
    j = out["jct_s"]
    print(f"JCT basic/dualpath = {j['basic'] / j['dualpath']:.2f} (target >= 1.8); "
          f"dualpath/oracle = {j['dualpath'] / j['oracle']:.2f} (target <= 1.2)")


if __name__ == "__main__":
    main()
