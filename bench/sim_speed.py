"""Simulator speed: simulated turns per wall-clock second on one core.

Usage::

    python bench/sim_speed.py --json                       # 2P4D, 2048 agents, 64K
    python bench/sim_speed.py --pd 48P96D --agents 48000   # the paper's largest run

Prints ``turns``, ``wall_s`` and ``turns_per_s`` (trace generation excluded, reported apart
as ``trace_wall_s``); ``--progress`` passes the progress callback a terminal's bar gets
(``progress_reports``: how often it was called), to measure what it costs. The goal: more
than 8K turns/s, and 48P96D with 48K agents (about 7.5M turns) end to end in under 15
minutes.

``core`` says which simulator core ran: ``compiled`` (mypyc, built at install) or ``python``
(the pure-Python reference: ``DUALPATH_PURE_SIM=1``, or no build; dualpath_cli/compiled.py);
``core_reason`` why.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from dualpath_cli import compiled
from dualpath_cli.errors import DualPathError
from dualpath_cli.sim import make_setup, simulate_offline, synthetic_plans
from dualpath_cli.units import parse_tokens


def main(argv: list[str] | None = None) -> int:
    """Run one offline simulation and report its speed."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="ds660b")
    ap.add_argument("--pd", default="2P4D")
    ap.add_argument("--agents", type=int, default=2048)
    ap.add_argument("--max-len", default="64K")
    ap.add_argument("--policy", default="dualpath")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--progress", action="store_true",
                    help="pass a progress callback (as a terminal's bar does) to measure its cost")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    try:
        setup = make_setup(args.model, args.pd, args.policy)
        t0 = time.perf_counter()
        plans = synthetic_plans(parse_tokens(args.max_len), args.agents, args.seed)
        trace_wall = time.perf_counter() - t0
        reports: list[object] = []
        res = (simulate_offline(setup, plans, progress=reports.append) if args.progress
               else simulate_offline(setup, plans))
    except DualPathError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    out = {"model": args.model, "pd": args.pd, "agents": args.agents,
           "max_len": args.max_len, "policy": args.policy, "turns": res.turns,
           "events": res.events, "wall_s": round(res.wall_s, 3),
           "turns_per_s": round(res.turns_per_s, 1), "trace_wall_s": round(trace_wall, 3),
           "jct_s": round(res.jct, 1), "progress_reports": len(reports),
           "core": compiled.core(), "core_reason": compiled.reason()}
    if args.json:
        print(json.dumps(out))
    else:
        print(f"{res.turns} turns in {res.wall_s:.1f} s: {res.turns_per_s:,.0f} turns/s "
              f"(JCT {res.jct:,.0f} s simulated; trace built in {trace_wall:.1f} s; "
              f"{out['core']} core: {out['core_reason']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
