"""Launch-to-ready of ``dualpath launch`` (the embedded default 1P2D), over several launches.

Run: ``python bench/launch.py [--runs 5] [--json]``. Each run starts ``python -m
dualpath_cli.cli.app launch`` as a fresh process with private XDG directories, a free
loopback port and an empty store, and measures from spawning that process until ``/readyz``
answers 200 (seen from outside: Python start-up, imports, HTTP up, three engine processes
spawned and said hello). The launcher's own ``ready in X s`` figure is reported beside it.
Then it sends SIGTERM and times the stop (drain with nothing in flight, close, exit 0).
``--json`` prints one object; ``ready_s`` holds min/median/max of the outside measure
(goal: median <= 5 s on the development machine).

The machine is shared: like the other benches it raises this session's autogroup priority
while measuring (``--no-boost`` to not) and reports the cores other processes kept busy
during each launch (``foreign_cores``; telemetry/hostload.py).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from dualpath_cli.api.listen import free_port
from dualpath_cli.telemetry.hostload import (
    FOREIGN_WARN_CORES,
    ForeignCpu,
    cpu_priority,
    tree_cpu_seconds,
)


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/readyz", timeout=1) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def one_launch(timeout: float = 60.0) -> dict[str, float]:
    """One launch: outside ready time, the launcher's own figure, and the stop time."""
    with tempfile.TemporaryDirectory(prefix="dualpath-launch-bench-") as tmp:
        root = Path(tmp)
        (root / "run").mkdir(mode=0o700)
        env = {**os.environ, "XDG_RUNTIME_DIR": str(root / "run"),
               "XDG_DATA_HOME": str(root / "data"), "XDG_STATE_HOME": str(root / "state")}
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        meter = ForeignCpu()
        meter.start()
        t0 = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-m", "dualpath_cli.cli.app", "launch",
                                 "--port", str(port)], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            deadline = t0 + timeout
            while not _ready(url):
                if proc.poll() is not None:
                    raise RuntimeError(f"launch exited with {proc.returncode}: "
                                       f"{proc.stderr.read() if proc.stderr else ''}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"not ready within {timeout} s")
                time.sleep(0.01)
            ready = time.monotonic() - t0
            tree = tree_cpu_seconds(proc.pid)
            foreign = meter.stop()
            if foreign is not None:  # the launcher's tree is still running: not foreign
                foreign = max(0.0, foreign - tree / ready)
            assert proc.stdout is not None
            line = proc.stdout.readline()
            match = re.match(r"ready in ([0-9.]+) s", line)
            reported = float(match.group(1)) if match else float("nan")
            t1 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(timeout)
            stop = time.monotonic() - t1
            if code != 0:
                raise RuntimeError(f"launch exited with {code} after SIGTERM")
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
    return {"ready_s": ready, "reported_s": reported, "stop_s": stop,
            "foreign_cores": float("nan") if foreign is None else foreign}


def _stats(values: list[float]) -> dict[str, float]:
    return {"min": round(min(values), 3), "median": round(statistics.median(values), 3),
            "max": round(max(values), 3)}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="launches to time")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--no-boost", action="store_true",
                        help="do not raise this session's CPU priority while measuring")
    args = parser.parse_args(argv)
    with cpu_priority(not args.no_boost) as boosted:
        runs = [one_launch() for _ in range(args.runs)]
    foreign = [r["foreign_cores"] for r in runs]
    result = {"runs": args.runs, "cpus": os.cpu_count(),
              "ready_s": _stats([r["ready_s"] for r in runs]),
              "reported_s": _stats([r["reported_s"] for r in runs]),
              "stop_s": _stats([r["stop_s"] for r in runs]),
              "isolation": {"boosted": boosted,
                            "max_foreign_cores": round(max(foreign), 2)}}
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"dualpath launch (embedded 1P2D), {args.runs} launches, {os.cpu_count()} CPUs, "
          f"priority {'boosted' if boosted else 'not boosted'}")
    print(f"{'run':>6} {'ready (outside)':>16} {'ready (reported)':>17} {'stop':>8} "
          f"{'other CPU':>10}")
    for i, r in enumerate(runs, 1):
        flag = " !" if r["foreign_cores"] > FOREIGN_WARN_CORES else ""
        print(f"{i:>6} {r['ready_s']:>14.2f} s {r['reported_s']:>15.2f} s "
              f"{r['stop_s']:>6.2f} s {r['foreign_cores']:>8.2f} c{flag}")
    for key in ("min", "median", "max"):
        print(f"{key:>6} {result['ready_s'][key]:>14.2f} s "
              f"{result['reported_s'][key]:>15.2f} s {result['stop_s'][key]:>6.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
