"""CLI start time: wall-clock seconds of ``dualpath --version`` and ``dualpath --help``.

Usage::

    python bench/cli_start.py               # table: 3 warm-up runs, then 20 timed runs each
    python bench/cli_start.py --runs 50 --json

Like hyperfine: every command runs ``--warmup`` times untimed (warm page cache), then
``--runs`` times; each run is a fresh process (``<venv>/bin/dualpath``, the console script a
user runs) with its output thrown away. Reported per command: mean, standard deviation, min,
median and max wall time, and the median CPU time (user + system) of the child, which moves
less than wall time when other work shares the machine. The floor rows (``python -c pass``
and ``import typer`` with its rich help formatter) show how much of the time is ours.

Before timing, the package's bytecode is compiled (``compileall``, what ``pip install`` does
for a regular install; ``--no-compile`` skips it): with ``PYTHONDONTWRITEBYTECODE`` set, as in
some sandboxes, an editable install would otherwise compile every module from source on
every start (0.55 s instead of 0.41 s for ``--help`` here, 2026-12-03).

``--json`` prints one object; ``version_s`` and ``help_s`` are the median wall times of the
two commands (the goal: under 0.3 s each), ``commands`` has every statistic.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

GOAL_S = 0.3


def _dualpath() -> list[str]:
    """The console script beside this interpreter, else the one on PATH, else ``-m``."""
    here = Path(sys.executable).with_name("dualpath")
    if here.exists():
        return [str(here)]
    found = shutil.which("dualpath")
    return [found] if found else [sys.executable, "-m", "dualpath_cli.cli.app"]


def _once(argv: list[str], env: dict[str, str]) -> tuple[float, float, int]:
    """One run: (wall seconds, child CPU seconds, exit code)."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    return wall, usage.ru_utime + usage.ru_stime, proc.returncode


def measure(argv: list[str], runs: int, warmup: int) -> dict[str, float | int | str]:
    """Statistics of ``runs`` timed runs of ``argv`` after ``warmup`` untimed ones."""
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "100"}
    for _ in range(warmup):
        _once(argv, env)
    walls, cpus = [], []
    for _ in range(runs):
        wall, cpu, code = _once(argv, env)
        if code != 0:
            raise SystemExit(f"error: {' '.join(argv)} exited {code}")
        walls.append(wall)
        cpus.append(cpu)
    return {"command": " ".join(Path(argv[0]).name if i == 0 else a for i, a in enumerate(argv)),
            "runs": runs, "mean_s": statistics.fmean(walls),
            "stdev_s": statistics.stdev(walls) if runs > 1 else 0.0,
            "min_s": min(walls), "median_s": statistics.median(walls), "max_s": max(walls),
            "cpu_median_s": statistics.median(cpus)}


def _compile_package() -> None:
    """Write the bytecode of dualpath_cli and the first-party plugins, as an install does."""
    import compileall

    import dualpath_cli

    roots = [Path(dualpath_cli.__file__).parent]
    roots += sorted((Path(__file__).resolve().parent.parent / "plugins").glob("*/dualpath_*"))
    for root in roots:
        compileall.compile_dir(str(root), quiet=1)


def main(argv: list[str] | None = None) -> int:
    """Time the CLI's start and print a table or one JSON object."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20, help="timed runs per command")
    ap.add_argument("--warmup", type=int, default=3, help="untimed runs first")
    ap.add_argument("--no-floor", action="store_true", help="skip the python/typer floor rows")
    ap.add_argument("--no-compile", action="store_true",
                    help="do not compile the package's bytecode first")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    if args.runs < 1 or args.warmup < 0:
        ap.error("--runs must be at least 1 and --warmup at least 0")
    cli = _dualpath()
    if not args.no_compile:
        _compile_package()
    rows = {"version": measure([*cli, "--version"], args.runs, args.warmup),
            "help": measure([*cli, "--help"], args.runs, args.warmup)}
    if not args.no_floor:
        rows["python"] = measure([sys.executable, "-c", "pass"], args.runs, args.warmup)
        rows["typer"] = measure([sys.executable, "-c", "import typer.main, typer.rich_utils"],
                                args.runs, args.warmup)
    version_s, help_s = rows["version"]["median_s"], rows["help"]["median_s"]
    ok = float(version_s) < GOAL_S and float(help_s) < GOAL_S
    if args.json:
        print(json.dumps({"version_s": round(float(version_s), 4),
                          "help_s": round(float(help_s), 4), "goal_s": GOAL_S,
                          "goal_met": ok, "load_avg_1m": os.getloadavg()[0],
                          "cpus": os.cpu_count(), "commands": rows}))
        return 0
    print(f"{'command':<44} {'mean':>7} {'± sd':>7} {'min':>7} {'median':>7} {'max':>7} "
          f"{'CPU':>7}")
    for row in rows.values():
        print(f"{str(row['command'])[:44]:<44} {row['mean_s']:>7.3f} {row['stdev_s']:>7.3f} "
              f"{row['min_s']:>7.3f} {row['median_s']:>7.3f} {row['max_s']:>7.3f} "
              f"{row['cpu_median_s']:>7.3f}")
    print(f"seconds; {args.runs} runs after {args.warmup} warm-up; load average "
          f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    print(f"goal: --version and --help median under {GOAL_S} s: {'met' if ok else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
