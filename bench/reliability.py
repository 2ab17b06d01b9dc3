"""Reliability figures: fuzz cases run and failures (tracebacks, hangs, unclear errors).

Runs the harness of tests/fuzzing.py without shrinking, over every ``dualpath`` command's
arguments, config files (``config validate``), trace files (``trace stats``) and the HTTP API
of a started in-process cluster (schemathesis, from its OpenAPI document, every endpoint with
and without the token), and counts cases. The CI version is tests/test_fuzz_*.py; this is
the long one::

    nice -n 19 python bench/reliability.py            # ~2,000 cases, a table
    nice -n 19 python bench/reliability.py --long     # >= 10,000 cases
    nice -n 19 python bench/reliability.py --json     # one JSON object

JSON keys: ``fuzz_cases``, ``fuzz_failures``, ``fuzz_accepted`` (cases that got past every
check: exit 0, the stubbed work reached, or HTTP < 400), ``by_target`` (cases, accepted,
failures, seconds per command, file kind or the API), ``failures`` (the first 20, each a
command line and a reason), ``seconds``.

Faults and soak (issue 17, items 3 and 5), each its own part::

    nice -n 19 python bench/reliability.py --no-fuzz --faults          # the fault matrix
    nice -n 19 python bench/reliability.py --no-fuzz --soak 10000      # bench/soak.py

``--faults`` runs every scenario of tests/test_fault_matrix.py, the ``scheduler_kill`` row
of tests/test_scheduler_restart.py and the ``restart_pe`` and ``crash_loop_pe`` rows of
tests/test_engine_restart.py (``--fault NAME`` picks some) and adds ``faults``: one row
per fault with ``detected_s`` (and its bound ``limit_s``), ``lost_turns``,
``tokens_identical``, ``served_corrupt``, ``temp_files``, ``serving_after`` and ``ok``
(every goal met), or ``skipped`` with the reason. ``--soak N`` adds
``soak_rss_growth``, ``fd_growth``, ``leftover_temp_files`` and ``soak_turns``.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from fuzzing import (  # tests/ is put on the path just above
    Outcome,
    Sandbox,
    argv_strategy,
    commands,
    config_text_strategy,
    run_cli,
    stubbed,
    trace_bytes_strategy,
)
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

__all__ = ["run_fuzz", "main"]


def _collect(strategy: st.SearchStrategy[Any], cases: int, seed: int,
             run: Callable[[Any], Outcome], sink: list[Outcome]) -> None:
    """Draw ``cases`` inputs and run each; no assertion, so nothing shrinks or stops early."""

    @hypothesis_seed(seed)
    @settings(max_examples=cases, deadline=None, database=None,
              suppress_health_check=list(HealthCheck), phases=[Phase.generate])
    @given(strategy)
    def one(value: Any) -> None:
        sink.append(run(value))

    one()


def file_case(box: Sandbox, argv_head: list[str], data: bytes, n: int) -> Outcome:
    """Write ``data`` to a fresh file in the sandbox and run ``argv_head + [file]``."""
    path = box.root / f"case-{n}"
    path.write_bytes(data)
    try:
        return run_cli([*argv_head, str(path)], box)
    finally:
        path.unlink(missing_ok=True)


def _file_runner(box: Sandbox, head: list[str], counter: Iterator[int]
                 ) -> Callable[[bytes], Outcome]:
    """A case runner for one file kind (each file gets a fresh name)."""
    def run(data: bytes) -> Outcome:
        return file_case(box, head, data, next(counter))

    return run


def _http_fuzz(examples: int, seed: int) -> list[Outcome]:
    """The API of a started in-process cluster, fuzzed from its OpenAPI document."""
    from fuzzing import run_http_fuzz

    from dualpath_cli.api.app import create_app
    from dualpath_cli.api.auth import TokenAuth
    from dualpath_cli.runtime.options import RuntimeOptions
    from dualpath_cli.services.live import LiveCluster
    from dualpath_cli.telemetry.gpu import UnavailableGpu

    live = LiveCluster(RuntimeOptions(block_tokens=8, flops_rate=5e9, fetch_s=0.005,
                                      heartbeat_timeout=10.0))
    live.start()
    try:
        app = create_app(live, TokenAuth("fuzz-token"), gpu=UnavailableGpu("bench"))

        def clear() -> None:
            if live.system.faults:
                live.system.clear_faults()

        return run_http_fuzz(app, "fuzz-token", examples, seed, after_each=clear)
    finally:
        live.close()


def run_fuzz(per_command: int, per_file_kind: int, seed: int = 0,
             only: str | None = None, http_examples: int = 0) -> dict[str, Any]:
    """Run every target; return the figures (see the module docstring)."""
    started = time.monotonic()
    by_target: dict[str, dict[str, Any]] = {}
    failures: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix="dualpath-fuzz-") as tmp:
        box = Sandbox.create(Path(tmp))
        try:
            with stubbed():
                targets: list[tuple[str, st.SearchStrategy[Any], Callable[[Any], Outcome],
                                    int]] = []
                for cmd in commands():
                    targets.append((" ".join(cmd.words), argv_strategy(cmd, box),
                                    lambda argv: run_cli(argv, box), per_command))
                counter = iter(range(10**9))
                for name, head, strategy in (
                        ("config file", ["config", "validate"], config_text_strategy()),
                        ("config file (--json)", ["config", "validate", "--json"],
                         config_text_strategy()),
                        ("trace file", ["trace", "stats"], trace_bytes_strategy()),
                        ("trace file (--json)", ["trace", "stats", "--json"],
                         trace_bytes_strategy())):
                    targets.append((name, strategy, _file_runner(box, head, counter),
                                    per_file_kind))
                for name, strategy, run, cases in targets:
                    if only and only not in name:
                        continue
                    sink: list[Outcome] = []
                    t0 = time.monotonic()
                    _collect(strategy, cases, seed, run, sink)
                    bad = [o for o in sink if not o.ok]
                    failures += bad
                    by_target[name] = {"cases": len(sink), "failures": len(bad),
                                       "accepted": sum(o.accepted for o in sink),
                                       "seconds": round(time.monotonic() - t0, 2)}
        finally:
            box.close()
    if http_examples and (not only or "http" in only):
        t0 = time.monotonic()
        try:
            outcomes = _http_fuzz(http_examples, seed)
        except Exception as err:  # e.g. the OpenAPI document itself cannot be built
            outcomes = [Outcome(["http"], -1, "", False,
                                f"cannot fuzz the API: {type(err).__name__}: {err}"[:300])]
        bad = [o for o in outcomes if not o.ok]
        failures += bad
        by_target["http (every endpoint, with and without token)"] = {
            "cases": len(outcomes), "failures": len(bad),
            "accepted": sum(o.accepted for o in outcomes),
            "seconds": round(time.monotonic() - t0, 2)}
    return {"fuzz_cases": sum(t["cases"] for t in by_target.values()),
            "fuzz_failures": len(failures),
            "fuzz_accepted": sum(t["accepted"] for t in by_target.values()),
            "by_target": by_target,
            "failures": [{"argv": o.argv, "reason": o.reason, "output_tail": o.output[-800:]}
                         for o in failures[:20]],
            "seconds": round(time.monotonic() - started, 1)}


# -- faults and soak (issue 17, items 3 and 5) ---------------------------------------------
def run_faults(names: list[str] | None = None) -> list[dict[str, Any]]:
    """One row per fault of tests/test_fault_matrix.py (all of them, slow ones included),
    tests/test_scheduler_restart.py (the scheduler killed with -9 and restarted) and
    tests/test_engine_restart.py (the only PE killed and restarted; a PE's crash loop)."""
    import tempfile

    from test_engine_restart import RESTART_FAULTS
    from test_fault_matrix import FAULTS, MountRefused, run_fault
    from test_scheduler_restart import SCHEDULER_FAULTS

    def engine_restart(name: str) -> Any:
        with tempfile.TemporaryDirectory(prefix="dualpath-fault-") as tmp:
            return RESTART_FAULTS[name](Path(tmp))

    rows: list[dict[str, Any]] = []
    for name in names or [*FAULTS, *SCHEDULER_FAULTS, *RESTART_FAULTS]:
        try:
            row = (SCHEDULER_FAULTS[name]() if name in SCHEDULER_FAULTS
                   else engine_restart(name) if name in RESTART_FAULTS else run_fault(name))
        except MountRefused as err:
            rows.append({"fault": name, "skipped": str(err)})
            continue
        d = row.to_dict()
        d["ok"] = bool(row.detected_s is not None and row.detected_s <= row.limit_s
                       and row.lost_turns == 0 and row.tokens_identical
                       and row.served_corrupt == 0 and row.temp_files == 0
                       and row.serving_after)
        rows.append({"name": name, **d})
    return rows


def run_soak(turns: int, ring: int | None = None) -> dict[str, Any]:
    """bench/soak.py's figures for ``turns`` turns (a subprocess: it launches a cluster),
    with a ``ring``-decision scheduler ring when given (its warm-up then fills it)."""
    import subprocess

    soak = Path(__file__).resolve().parent / "soak.py"
    done = subprocess.run([sys.executable, str(soak), "--turns", str(turns), "--json",
                           *(["--decision-ring", str(ring)] if ring else [])],
                          capture_output=True, text=True)
    if not done.stdout.strip():
        raise SystemExit(f"bench/soak.py failed: {done.stderr.strip()[-500:]}")
    out = json.loads(done.stdout)
    return {"soak_rss_growth": out["soak_rss_growth"], "fd_growth": out["fd_growth"],
            "leftover_temp_files": out["leftover_temp_files"], "soak_turns": out["turns"],
            "soak_errors": out["errors"], "soak_seconds": out["seconds"]}


def _print_faults(rows: list[dict[str, Any]]) -> None:
    print(f"\n{'fault':<32} {'detected_s':>10} {'limit_s':>8} {'lost':>5} {'identical':>9} "
          f"{'corrupt':>8} {'tmp':>4} {'serving':>8}")
    for r in rows:
        if "skipped" in r:
            print(f"{r['fault']:<32} skipped: {r['skipped']}")
            continue
        det = "-" if r["detected_s"] is None else f"{r['detected_s']:.3f}"
        print(f"{r['fault']:<32} {det:>10} {r['limit_s']:>8g} {r['lost_turns']:>5} "
              f"{str(r['tokens_identical']):>9} {r['served_corrupt']:>8} {r['temp_files']:>4} "
              f"{str(r['serving_after']):>8}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--long", action="store_true", help="at least 10,000 cases")
    parser.add_argument("--cases", type=int, default=None, help="cases per command")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", default=None, help="targets whose name contains this")
    parser.add_argument("--no-http", action="store_true", help="skip the API fuzz")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--no-fuzz", action="store_true", help="skip the fuzz part")
    parser.add_argument("--faults", action="store_true", help="run the fault matrix")
    parser.add_argument("--fault", action="append", default=None,
                        help="run only this fault of the matrix (repeatable)")
    parser.add_argument("--soak", type=int, default=0, metavar="TURNS",
                        help="run bench/soak.py for TURNS turns")
    parser.add_argument("--soak-ring", type=int, default=None, metavar="N",
                        help="the soak's scheduler.decision_ring (its warm-up fills it)")
    args = parser.parse_args(argv)
    # SIGTERM unwinds (the sandbox temp directory is removed) instead of ending at once
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    per_command = args.cases or (300 if args.long else 40)
    per_file = per_command * 2 if args.long else per_command * 3
    http = 0 if args.no_http else (100 if args.long else 10)
    figures: dict[str, Any] = {} if args.no_fuzz else run_fuzz(
        per_command, per_file, args.seed, args.only, http)
    if args.faults or args.fault:
        figures["faults"] = run_faults(args.fault)
    if args.soak:
        figures.update(run_soak(args.soak, args.soak_ring))
    bad_faults = [r for r in figures.get("faults", []) if not r.get("ok", True)]
    soak_bad = bool(args.soak) and (figures["fd_growth"] > 0
                                    or figures["leftover_temp_files"] > 0)
    if args.json:
        print(json.dumps(figures))
    elif args.no_fuzz:
        pass
    else:
        print(f"{'target':<24} {'cases':>7} {'accepted':>9} {'failures':>9} {'s':>7}")
        for name, row in figures["by_target"].items():
            print(f"{name[:24]:<24} {row['cases']:>7} {row['accepted']:>9} "
                  f"{row['failures']:>9} {row['seconds']:>7}")
        print(f"{'all':<24} {figures['fuzz_cases']:>7} {figures['fuzz_accepted']:>9} "
              f"{figures['fuzz_failures']:>9} {figures['seconds']:>7}")
        for fail in figures["failures"]:
            print(f"FAIL dualpath {' '.join(map(repr, fail['argv']))}: {fail['reason']}")
    if not args.json and "faults" in figures:
        _print_faults(figures["faults"])
    if not args.json and args.soak:
        print(f"\nsoak {figures['soak_turns']} turns: RSS growth "
              f"{figures['soak_rss_growth']:+.2%}, fd growth {figures['fd_growth']:+d}, "
              f"leftover temp files {figures['leftover_temp_files']}")
    fuzz_bad = figures.get("fuzz_failures", 0) != 0
    return 0 if not (fuzz_bad or bad_faults or soak_bad) else 1


if __name__ == "__main__":
    sys.exit(main())
