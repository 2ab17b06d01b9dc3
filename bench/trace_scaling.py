"""Trace reading scales linearly with the file: a one-line trace at 1x, 2x and 4x its size.

Usage::

    python bench/trace_scaling.py --json                 # ~0.45 MB, 0.9 MB, 1.8 MB lines
    python bench/trace_scaling.py --turns 150000 --sim   # also simulate each (slow)

Prints, per size, the file's bytes and turns, ``read_s`` (read and validate the trace, as
``sim run --trace`` does before simulating) and with ``--sim`` ``sim_s`` (one offline
``dualpath`` run on ds27b 1P1D: its cost is per turn, so a line of 150K small turns is
150K simulated turns). ``read_ratio`` / ``sim_ratio``: the 4x time over the 1x time; linear
work gives about 4 (issue 34 item 11's goal: reading is linear in the file's size).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from dualpath_cli.sim import Workload, make_setup, simulate_offline


def _write(path: Path, turns: int) -> None:
    header = {"format": "dualpath-trace", "version": 1, "max_len": 10**9}
    line = {"agent_id": 0, "token_seed": 1, "turns": [[1, 1]] * turns}
    path.write_text(json.dumps(header) + "\n" + json.dumps(line, separators=(",", ":"))
                    + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    """Time reading (and optionally simulating) one-line traces of growing size."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=75_000, help="turns of the 1x line")
    ap.add_argument("--sim", action="store_true", help="also simulate each trace")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for scale in (1, 2, 4):
            path = Path(tmp) / f"x{scale}.jsonl"
            _write(path, args.turns * scale)
            start = time.perf_counter()
            workload = Workload.from_file(path)
            row: dict[str, float | int] = {"scale": scale, "bytes": path.stat().st_size,
                                           "turns": args.turns * scale,
                                           "read_s": time.perf_counter() - start}
            if args.sim:
                setup = make_setup("ds27b", "1P1D", "dualpath")
                start = time.perf_counter()
                simulate_offline(setup, workload.plans(1))
                row["sim_s"] = time.perf_counter() - start
            rows.append(row)
    out: dict[str, object] = {"rows": rows,
                              "read_ratio": rows[-1]["read_s"] / rows[0]["read_s"]}
    if args.sim:
        out["sim_ratio"] = rows[-1]["sim_s"] / rows[0]["sim_s"]
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"{'scale':>5} {'bytes':>10} {'turns':>8} {'read_s':>8} {'sim_s':>8}")
    for r in rows:
        sim = f"{r['sim_s']:8.2f}" if "sim_s" in r else f"{'-':>8}"
        print(f"{r['scale']:>5} {r['bytes']:>10,} {r['turns']:>8,} {r['read_s']:8.3f} {sim}")
    print(f"4x/1x read: {out['read_ratio']:.2f}" + (f", sim: {out['sim_ratio']:.2f}"
                                                     if args.sim else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
