"""What a run leaves behind: nothing after SIGTERM/SIGHUP (they unwind like Ctrl-C), stale
per-policy stores of a SIGKILLed bench removed by the next run, the quarantine kept and the
faults of a bench shown."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import communicate_or_explain, wait_until
from rich.console import Console

from dualpath_cli.services.bench import (
    BenchReport,
    PolicyReport,
    keep_quarantine,
    remove_stale_stores,
)

pytestmark = pytest.mark.e2e  # the CLI as a subprocess, signalled


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid  # reaped: no process has it (pids are not reused this fast)


def test_stale_run_stores_are_removed(tmp_path: Path) -> None:
    stale = tmp_path / f"dualpath-pid{_dead_pid()}-abc123"
    live = tmp_path / f"basic-pid{os.getpid()}-def456"
    other = tmp_path / "blocks"
    for d in (stale, live, other):
        (d / "x").mkdir(parents=True)
    assert remove_stale_stores(tmp_path) == [stale]
    assert not stale.exists() and live.exists() and other.exists()


def test_quarantine_outlives_the_run_store(tmp_path: Path) -> None:
    store = tmp_path / "run"
    (store / "quarantine").mkdir(parents=True)
    assert keep_quarantine(store, tmp_path, "dualpath") is None  # empty: nothing kept
    (store / "quarantine" / "ab.checksum.1.kvb").write_bytes(b"bad")
    kept = keep_quarantine(store, tmp_path, "dualpath")
    assert kept is not None and kept.parent == tmp_path / "quarantine"
    assert [p.name for p in kept.iterdir()] == ["ab.checksum.1.kvb"]


def _report(**faults: object) -> PolicyReport:
    rep = PolicyReport("dualpath", 1.0, 4, 0.1, 0.2, 0.1, 0.2, 0.01, 0.02, True, {0: 10},
                       1.0, 0.5, 0.0, 0, 1.0, 0)
    for key, value in faults.items():
        setattr(rep, key, value)
    return rep


def test_faults_show_in_table_and_json(tmp_path: Path) -> None:
    from dualpath_cli.cli.bench_cmd import render_bench

    setup = {"pd": "1P2D", "agents": 2, "turns": 4, "model": "tiny", "mode": "offline",
             "snic_bw": 1e9}
    clean, faulty = _report(), _report(dead_engines=[1], retried_turns=3,
                                       quarantined_blocks=2, quarantine_dir="/q/dualpath-1")
    out = io.StringIO()
    render_bench(BenchReport(setup, [clean]), Console(file=out, width=100), online=False)
    assert "faults" not in out.getvalue()
    render_bench(BenchReport(setup, [faulty]), Console(file=out, width=200), online=False)
    assert ("faults in dualpath: engines died: 1; 3 turns retried; 2 corrupt blocks "
            "quarantined (kept in /q/dualpath-1)") in out.getvalue()
    row = BenchReport(setup, [faulty]).to_dict()["policies"][0]
    assert (row["dead_engines"], row["retried_turns"], row["quarantined_blocks"]) == ([1], 3, 2)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_storage_bench_cleans_up_on_a_signal(tmp_path: Path, sig: signal.Signals) -> None:
    """SIGTERM left a 273 MB temp directory behind; now it unwinds like Ctrl-C."""
    root = tmp_path / "bench"
    root.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "dualpath_cli.cli.app", "storage", "bench", "--root", str(root),
         "--block-size", "64KiB", "--queue-depth", "1", "--size", "32MiB", "--seconds",
         "60"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "NO_COLOR": "1", "PYTHONFAULTHANDLER": "1"},
        # as from a terminal: a runner started under nohup hands its children an ignored
        # SIGHUP, which the CLI rightly leaves alone (it only replaces default handlers)
        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
    try:
        def begun() -> bool:  # its temp directory exists: the work has begun
            assert proc.poll() is None, proc.communicate()
            return any(root.iterdir())

        wait_until(begun, 60, "the work to begin", interval=0.05)
        proc.send_signal(sig)
        _, err = communicate_or_explain(proc, 60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 128 + sig, err
    assert "Traceback" not in err and f"terminated by signal {int(sig)}" in err
    assert list(root.iterdir()) == [], err


def test_bench_sigterm_takes_its_engines_and_store_with_it(tmp_path: Path) -> None:
    """SIGTERM to `dualpath bench` exited in 0.01 s and orphaned its three engines, with
    the per-policy store left behind; now it unwinds: engines stopped, store removed."""
    import psutil

    root = tmp_path / "store"
    proc = subprocess.Popen(
        [sys.executable, "-m", "dualpath_cli.cli.app", "bench", "--agents", "4", "--turns",
         "30", "--store", str(root), "--snic-bw", "1GB/s", "--policy", "dualpath"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONFAULTHANDLER": "1"})
    family: list[psutil.Process] = []
    try:
        me = psutil.Process(proc.pid)
        def engines_up() -> bool:
            assert proc.poll() is None, proc.communicate()
            return len([c for c in me.children(recursive=True)
                        if "resource_tracker" not in " ".join(c.cmdline())]) >= 3

        # engines import numpy and build the model
        wait_until(engines_up, 180, "three engine processes", interval=0.1)
        family = me.children(recursive=True)
        proc.send_signal(signal.SIGTERM)
        _, err = communicate_or_explain(proc, 60)
        assert proc.returncode == 143, err
        assert "terminated by signal 15; cleaned up" in err and "Traceback" not in err
        wait_until(lambda: not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE
                                   for p in family), 15,
                   "the engines to go with their launcher", interval=0.05)
        assert list(root.iterdir()) == []  # the per-policy store went with the run
    finally:
        for p in family:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_an_interrupted_ceiling_measurement_stops_its_readers(tmp_path: Path) -> None:
    """Ctrl-C or a signal during the verified-ceiling phase of ``storage bench`` ends it at
    the readers' next batch, not after ``--seconds`` (its non-daemon reader threads used to
    hold the process until their deadline)."""
    from dualpath_cli.storage.native import native_reader

    native = native_reader()
    if native is None or not native.hashes:
        pytest.skip("no native read path here: the ceiling is not measured")
    probe = textwrap.dedent("""
        import signal, sys, time
        from pathlib import Path
        from dualpath_cli.storage.benchmark import make_dataset, verified_ceiling_gbps
        data = make_dataset(Path(sys.argv[1]), 65536, 4 << 20)
        def interrupt(*_):
            raise KeyboardInterrupt
        signal.signal(signal.SIGALRM, interrupt)
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        t0 = time.monotonic()
        try:
            verified_ceiling_gbps(data, 2, overlap=False, min_seconds=60)
        except KeyboardInterrupt:
            print(time.monotonic() - t0)
    """)
    out = subprocess.run([sys.executable, "-c", probe, str(tmp_path)], capture_output=True,
                         text=True, timeout=50)
    assert out.returncode == 0, out.stderr
    assert float(out.stdout) < 30, out.stdout  # the deadline was 60 s
