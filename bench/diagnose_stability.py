"""Do diagnose verdicts hold still? One steady injected fault under a steady agent load,
graded over successive windows (issue 33's goal: the same grade in at least 9 of 10 windows
of 30 s).

For each fault diagnose covers, a fresh embedded cluster (``dualpath launch --inject SPEC``,
engine processes over ZeroMQ) serves ``dualpath bench --url`` agents (restarted when they
finish, so the load stays on), and after a warm-up ``dualpath diagnose all --url --window W
--json`` runs ``--windows`` times back to back, each a fresh process as cron or an operator
would run it (so the hysteresis reads the previous verdict back from the state file, as it
does live). Each window's grade is the worst finding of the expected workflow on the
expected subject (OK when there is none). Usage::

    python bench/diagnose_stability.py                      # every fault, 10 x 30 s
    python bench/diagnose_stability.py --only snic_throttle --json
    python bench/diagnose_stability.py --window 10s --windows 3   # a smoke run

Prints a table (fault, expected workflow and subject, the grades, the modal grade and its
share); with ``--json`` one object with per-fault ``rows`` and ``passed``. Exit 0 when every
row passes. Timings depend on the host: say how loaded it was next to any figure.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CLI = [sys.executable, "-m", "dualpath_cli.cli.app"]


@dataclass(frozen=True)
class Case:
    """One fault and where diagnose must report it."""

    name: str
    spec: str
    workflow: str
    subject: str  # a subject, or a prefix ending in a space ("block ")
    launch: tuple[str, ...] = ()


#: The faults diagnose covers (tests/test_faults_e2e.py proves each is found).
CASES = (
    Case("snic_throttle", "snic_throttle:node=1,fraction=0.25", "snic-imbalance", "node D1"),
    Case("hbm_frag", "hbm_frag:engine=1,stride=4", "hbm-frag", "engine 1"),
    Case("slow_compute", "slow_compute:engine=2,factor=8", "long-tail", "engine 2",
         ("--policy", "basic")),
    Case("read_latency", "read_latency:node=0,latency=100ms", "cache-hit", "node P0",
         ("--policy", "basic")),
    Case("hot_blocks", "hot_blocks:node=1,count=2,rate=100", "long-tail", "node D1",
         ("--policy", "basic")),
    # the drill's row: a slow store on a decode node, under the default policy (which
    # steers reads away from it: a window with too few reads there is OK, not a guess)
    Case("read_latency_decode", "read_latency:node=1,latency=200ms", "snic-imbalance",
         "node D1"),
)
_GRADES = ("OK", "WARNING", "CRITICAL", "UNKNOWN")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _grade(doc: dict[str, Any], case: Case) -> str:
    """The worst grade diagnose gave the case's subject in its workflow (OK: none)."""
    worst = 0
    for report in doc.get("reports", []):
        if report.get("workflow") != case.workflow:
            continue
        for f in report.get("findings", []):
            subject = f.get("subject") or ""
            hit = (subject.startswith(case.subject) if case.subject.endswith(" ")
                   else subject == case.subject)
            if hit:
                worst = max(worst, _GRADES.index(f.get("severity", "OK")))
    return _GRADES[worst]


def _load(env: dict[str, str], url: str) -> subprocess.Popen[str]:
    return subprocess.Popen([*CLI, "bench", "--url", url, "--agents", "6", "--turns", "200",
                             "--json"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, text=True)


def run_case(case: Case, window: str, windows: int, warmup_s: float) -> dict[str, Any]:
    """Launch, load, grade ``windows`` successive windows, stop: the case's row."""
    with tempfile.TemporaryDirectory(prefix="dp-stab-") as tmp:
        env = dict(os.environ)
        for k, sub in (("XDG_RUNTIME_DIR", "run"), ("XDG_STATE_HOME", "state"),
                       ("XDG_DATA_HOME", "data")):
            Path(tmp, sub).mkdir(mode=0o700)
            env[k] = str(Path(tmp, sub))
        env.pop("DUALPATH_URL", None)
        env.pop("DUALPATH_TOKEN", None)
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        launcher = subprocess.Popen([*CLI, "launch", "--port", str(port), "--store",
                                     str(Path(tmp, "store")), "--inject", case.spec,
                                     *case.launch], env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
        assert launcher.stdout is not None
        line = launcher.stdout.readline()
        if not line.startswith("ready in "):
            launcher.kill()
            _, err = launcher.communicate(timeout=30)
            return {"fault": case.name, "error": (line + err).strip()[-300:], "passed": False}
        load = _load(env, url)
        grades: list[str] = []
        errors = 0
        try:
            time.sleep(warmup_s)  # the load's first turns: caches and rates settle
            for _ in range(windows):
                if load.poll() is not None:
                    load = _load(env, url)  # keep the load on
                done = subprocess.run([*CLI, "diagnose", "all", "--url", url, "--window",
                                       window, "--json"], env=env, capture_output=True,
                                      text=True, timeout=600)
                try:
                    grades.append(_grade(json.loads(done.stdout), case))
                except ValueError:
                    grades.append("UNKNOWN")
                    errors += 1
        finally:
            load.terminate()
            load.communicate(timeout=60)
            subprocess.run([*CLI, "stop", "--port", str(port)], env=env,
                           capture_output=True, text=True, timeout=120)
            try:
                launcher.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                launcher.kill()
                launcher.communicate(timeout=10)
    modal, count = collections.Counter(grades).most_common(1)[0] if grades else ("-", 0)
    need = max(1, -(-9 * len(grades) // 10))  # 9 of 10
    return {"fault": case.name, "spec": case.spec, "workflow": case.workflow,
            "subject": case.subject.strip() + ("*" if case.subject.endswith(" ") else ""),
            "grades": " ".join(g[0] for g in grades), "modal": modal,
            "share": round(count / len(grades), 3) if grades else 0.0,
            "windows": len(grades), "diagnose_errors": errors,
            "passed": bool(grades) and count >= need and modal in ("WARNING", "CRITICAL")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--window", default="30s", help="each diagnose window (default 30s)")
    ap.add_argument("--windows", type=int, default=10, help="successive windows (default 10)")
    ap.add_argument("--warmup", type=float, default=15.0, help="seconds of load first")
    ap.add_argument("--only", action="append", help="a fault name (repeatable)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    cases = [c for c in CASES if not args.only or c.name in args.only]
    if not cases:
        print(f"no such fault: {args.only}; known: {', '.join(c.name for c in CASES)}",
              file=sys.stderr)
        return 2
    started = time.monotonic()
    rows = [run_case(c, args.window, args.windows, args.warmup) for c in cases]
    doc = {"window": args.window, "windows": args.windows,
           "passed": all(r["passed"] for r in rows), "rows": rows,
           "wall_s": round(time.monotonic() - started, 1)}
    if args.json:
        print(json.dumps(doc))
    else:
        print(f"{'fault':<14} {'workflow':<15} {'subject':<9} {'grades':<21} {'modal':<9} "
              f"share  passed")
        for r in rows:
            if "error" in r:
                print(f"{r['fault']:<14} launch failed: {r['error']}")
                continue
            print(f"{r['fault']:<14} {r['workflow']:<15} {r['subject']:<9} {r['grades']:<21} "
                  f"{r['modal']:<9} {r['share']:.0%}  {'yes' if r['passed'] else 'NO'}")
        print(f"{'passed' if doc['passed'] else 'FAILED'}: {len(rows)} faults, "
              f"{args.windows} windows of {args.window} each, {doc['wall_s']:.0f} s")
    return 0 if doc["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
