"""Lifecycle of a live cluster without HTTP: drain, cut-off turns, engines dying with the
launcher, the state file. Real engine processes over ZeroMQ on loopback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from conftest import wait_until

from dualpath_cli.runtime.options import RuntimeOptions
from dualpath_cli.runtime.workloads import agentic_workload
from dualpath_cli.services import statefile
from dualpath_cli.services.live import Draining, LiveCluster
from dualpath_cli.storage import PosixStore
from dualpath_cli.storage.inspect import verify_store
from dualpath_cli.workload.tokens import append_token_ids

pytestmark = pytest.mark.e2e  # launched clusters and engine processes


def _sems() -> set[str]:
    shm = Path("/dev/shm")
    return {p.name for p in shm.glob("sem.mp-*")} if shm.is_dir() else set()


def _prompts(n: int, length: int = 96) -> list[list[int]]:
    trajs = agentic_workload(n, turns=1, first_append=length, seed=7)
    return [append_token_ids(t, 0, 256).tolist() for t in trajs]


def _opts(store: Path) -> RuntimeOptions:
    return RuntimeOptions(block_tokens=16, processes=True, store_dir=store, flops_rate=5e9,
                          fetch_s=0.005)


def _no_litter(store: Path) -> None:
    assert not list(store.rglob("*.tmp")), "temp files left in the store"
    report = verify_store(PosixStore(store))
    assert report.corrupt == [] and report.ok == report.checked


def test_drain_completes_admitted_turns_and_refuses_new_ones(tmp_path: Path) -> None:
    live = LiveCluster(_opts(tmp_path))
    live.start()
    pids = list(live.system.cluster.pids().values())  # type: ignore[union-attr]
    assert live.ready() and len(pids) == 3
    tickets = [live.submit(p, gen=8, session=f"s{i}") for i, p in enumerate(_prompts(6))]
    assert live.in_flight() > 0
    result = live.drain(timeout=60)
    with pytest.raises(Draining):
        live.submit(_prompts(1)[0], gen=1)
    assert result.abandoned == 0 and result.drained <= len(tickets)
    for t in tickets:
        assert len(t.wait(0).tokens) == 8
    assert live.state == "stopped" and not live.ready()
    wait_until(lambda: not any(psutil.pid_exists(p) for p in pids), 10, "engines to exit")
    _no_litter(tmp_path)


def test_drain_timeout_answers_cut_off_turns_with_a_retryable_error(tmp_path: Path) -> None:
    live = LiveCluster(_opts(tmp_path))
    live.start()
    pids = list(live.system.cluster.pids().values())  # type: ignore[union-attr]
    tickets = [live.submit(p, gen=64) for p in _prompts(8, length=160)]
    result = live.drain(timeout=0.0)
    assert result.abandoned >= 1 and result.drained + result.abandoned <= len(tickets)
    done = cut = 0
    for t in tickets:
        try:
            assert len(t.wait(0).tokens) == 64
            done += 1
        except Draining as err:
            assert "retry" in str(err)
            cut += 1
    assert cut == result.abandoned and done + cut == len(tickets)
    assert live.drain(timeout=5) is result  # a second signal: same result, nothing redone
    wait_until(lambda: not any(psutil.pid_exists(p) for p in pids), 10, "engines to exit")
    _no_litter(tmp_path)


_LAUNCHER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from dualpath_cli.runtime.options import RuntimeOptions
    from dualpath_cli.services.live import LiveCluster

    def main():
        live = LiveCluster(RuntimeOptions(block_tokens=16, processes=True,
                                          store_dir=Path(sys.argv[1]), flops_rate=5e9))
        live.start()
        print(" ".join(str(p) for p in live.system.cluster.pids().values()), flush=True)
        buckets = [b for nics in live.system.node_nics.values() for b in nics]
        buckets += [s.cnic for s in live.system.specs]
        names = {b._shared.get_lock()._semlock.name for b in buckets if hasattr(b, "_shared")}
        print(" ".join(sorted(n.lstrip("/") for n in names if n)), flush=True)
        while True:
            time.sleep(60)

    if __name__ == "__main__":
        main()
""")


def test_engines_and_semaphores_die_with_a_killed_launcher(tmp_path: Path) -> None:
    script = tmp_path / "launcher.py"
    script.write_text(_LAUNCHER)
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "store")],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        pids = [int(p) for p in line.split()]
        assert len(pids) == 3 and all(psutil.pid_exists(p) for p in pids)
        ours = {f"sem.{name}" for name in proc.stdout.readline().split()}
        assert ours  # the NIC buckets' named semaphores, unlinked once the engines opened them
        wait_until(lambda: not ours & _sems(), 10, "the engines to open the semaphores")
        family = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
        assert set(pids) <= set(family)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        proc.stdout.close()  # type: ignore[union-attr]

    def gone() -> bool:
        return not any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"
                       for p in family)

    try:
        wait_until(gone, 15, "the engines and the resource tracker to exit")
    finally:  # leave nothing behind even when the check fails
        for pid in family:
            try:
                psutil.Process(pid).kill()
            except psutil.NoSuchProcess:
                pass
    wait_until(lambda: not ours & _sems(), 10, "the launcher's semaphores to be unlinked")


def test_state_files_live_stale_and_location(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    assert statefile.state_dir() == tmp_path / "run" / "dualpath"
    assert oct(statefile.state_dir().stat().st_mode & 0o777) == "0o700"
    me = statefile.ClusterState(pid=os.getpid(), url="http://127.0.0.1:1", host="127.0.0.1",
                                port=1, started_at=time.time(), token_file="t",
                                pid_start=statefile.process_start_time(os.getpid()))
    statefile.write_state(me)
    assert oct(me.path.stat().st_mode & 0o777) == "0o600"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    ghost = statefile.ClusterState(pid=dead.pid, url="http://127.0.0.1:2", host="127.0.0.1",
                                   port=2, started_at=time.time(), token_file="t")
    statefile.write_state(ghost)
    statefile.token_path(2).write_text("x")
    # a recycled pid (ours, but started at another time) is not the launcher either
    recycled = statefile.ClusterState(pid=os.getpid(), url="http://127.0.0.1:3",
                                      host="127.0.0.1", port=3, started_at=0.0, token_file="t",
                                      pid_start=1.0)
    statefile.write_state(recycled)
    # after a clock step psutil's wall-clock start of a live launcher moves by whole seconds:
    # its start since boot (when the system tells it) decides, and it is live
    stepped = statefile.ClusterState(
        pid=os.getpid(), url="http://127.0.0.1:4", host="127.0.0.1", port=4,
        started_at=time.time(), token_file="t",
        pid_start=statefile.process_start_time(os.getpid()) - 1.0,  # type: ignore[operator]
        pid_start_since_boot=statefile.process_start_since_boot(os.getpid()))
    statefile.write_state(stepped)
    recycled_too = statefile.ClusterState(  # the right wall-clock start, another boot start
        pid=os.getpid(), url="http://127.0.0.1:5", host="127.0.0.1", port=5,
        started_at=time.time(), token_file="t",
        pid_start=statefile.process_start_time(os.getpid()), pid_start_since_boot=1.0)
    statefile.write_state(recycled_too)
    live, stale = statefile.live_states()
    boot_known = stepped.pid_start_since_boot is not None
    assert [s.port for s in live] == ([1, 4] if boot_known else [1, 5])
    assert sorted(s.port for s in stale) == ([2, 3, 5] if boot_known else [2, 3, 4])
    assert not ghost.path.exists() and not statefile.token_path(2).exists()
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    assert statefile.state_dir() == tmp_path / "state" / "dualpath"


def test_readyz_is_green_only_after_every_engine_said_hello(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from dualpath_cli.api.app import create_app
    from dualpath_cli.api.auth import TokenAuth

    live = LiveCluster(_opts(tmp_path))
    client = TestClient(create_app(live, TokenAuth.generate(tmp_path / "token")))
    try:
        assert client.get("/readyz").status_code == 503  # not started
        live.spawn()
        assert client.get("/readyz").status_code == 503  # engines spawned, not waited for
        live.wait_ready(60)
        assert client.get("/readyz").status_code == 200
        live.drain(10)
        assert client.get("/readyz").status_code == 503
    finally:
        live.close()
        client.close()


def test_close_removes_the_temp_files_of_a_killed_engine(tmp_path: Path) -> None:
    """A block write cut by SIGKILL leaves an invisible temp file; closing removes it (and
    only it: another writer's temp file is not ours to touch)."""
    live = LiveCluster(_opts(tmp_path))
    live.start()
    cluster = live.system.cluster
    victim = cluster.pids()[2]  # type: ignore[union-attr]
    cluster.kill(2)
    wait_until(lambda: 2 in cluster.exited(), 10, "the engine to die")  # type: ignore[union-attr]
    leaf = tmp_path / "blocks" / "ab" / "cd"
    leaf.mkdir(parents=True, exist_ok=True)
    cut = leaf / f".{'0' * 32}.kv.{victim}.140000.tmp"
    other = leaf / f".{'1' * 32}.kv.{os.getpid()}.140000.tmp"
    cut.write_bytes(b"half a block")
    other.write_bytes(b"someone else's")
    live.close()
    assert not cut.exists() and other.exists()
    assert not live.ready()
