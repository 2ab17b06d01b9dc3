"""No ``/dev/shm/sem.mp-*`` left behind by a SIGKILLed node agent or launcher.

The engines' shared NIC buckets lock a named POSIX semaphore. multiprocessing's resource
tracker would unlink the names when their creator dies, but a SIGKILL to the creator's whole
process group (how the fault matrix kills a node) kills the tracker too. So the creator
unlinks each name once every engine has opened it (transfer/shaping.py): these tests kill
the whole group and look for the names the engines had open.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from conftest import wait_until
from test_multinode import START_S, Procs, _free_port, _json_line, engine_semaphores, launch_env

from dualpath_cli.transfer.shaping import SharedTokenBucket, record_dir, sweep_stale, unlink_shared

pytestmark = pytest.mark.e2e  # engine processes sharing named semaphores


def _exists(name: str) -> bool:
    return Path("/dev/shm", name).exists()


def _kill_group(p: Any) -> list[psutil.Process]:
    """SIGKILL the process group of ``p`` (its resource tracker too); wait until it is gone."""
    family = [psutil.Process(p.pid), *psutil.Process(p.pid).children(recursive=True)]
    os.killpg(p.pid, signal.SIGKILL)
    p.wait(30)
    _, alive = psutil.wait_procs(family, timeout=30)
    return list(alive)


def _kill_and_look(p: Any) -> None:
    """SIGKILL a serving process group; none of the names its engines mapped is left."""
    names = engine_semaphores(p.pid)
    assert names, "the engines map no NIC-bucket semaphore"
    assert not _kill_group(p)
    assert not [n for n in names if _exists(n)]


def _child_books(bucket: SharedTokenBucket, conn: Any) -> None:
    conn.send("opened")
    conn.recv()  # the parent unlinks the name meanwhile
    conn.send(bucket.reserve(1000, 0.0))


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="POSIX semaphores live in /dev/shm")
def test_an_unlinked_bucket_stays_shared_with_the_processes_that_opened_it() -> None:
    ctx = mp.get_context("spawn")
    bucket = SharedTokenBucket(1000.0)  # 1000 B/s
    name = bucket.semaphore
    assert name is not None and _exists(f"sem.{name.lstrip('/')}")
    ours, theirs = ctx.Pipe()
    child = ctx.Process(target=_child_books, args=(bucket, theirs), daemon=True)
    child.start()
    try:
        assert ours.poll(START_S) and ours.recv() == "opened"
        assert unlink_shared([bucket, bucket, object()]) == 1  # once, and only shared ones
        assert not _exists(f"sem.{name.lstrip('/')}") and bucket.semaphore is None
        assert bucket.reserve(1000, 0.0) == pytest.approx(1.0)
        ours.send("go")
        assert ours.poll(30) and ours.recv() == pytest.approx(2.0)  # the same timeline
        with pytest.raises(RuntimeError, match="unlinked"):  # no new process can open it
            ctx.Process(target=_child_books, args=(bucket, theirs)).start()
    finally:
        child.join(30)
        ours.close()
        theirs.close()
    assert child.exitcode == 0


_CREATOR = """
import sys
from dualpath_cli.transfer.shaping import SharedTokenBucket
bucket = SharedTokenBucket(None)
print(bucket.semaphore, flush=True)
sys.stdin.read()  # until killed
"""


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="POSIX semaphores live in /dev/shm")
def test_a_creator_killed_before_unlinking_is_swept_by_the_next() -> None:
    """Killed (with its resource tracker) before any engine opened its bucket: the name is
    in its record, and the next creator on the host unlinks it."""
    p = subprocess.Popen([sys.executable, "-c", _CREATOR], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert p.stdout is not None
        name = p.stdout.readline().strip()
        shm = f"sem.{name.lstrip('/')}"
        assert name.startswith("/mp-") and _exists(shm)
        records = [r for r in record_dir().glob(f"{p.pid}-*.names")]
        assert len(records) == 1 and records[0].read_text().split() == [name]
        assert not _kill_group(p)
        assert _exists(shm)  # nobody left to unlink it
        assert sweep_stale() >= 1
        assert not _exists(shm) and not records[0].exists()
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)
        for stream in (p.stdin, p.stdout):
            if stream is not None:
                stream.close()


@pytest.fixture
def scratch() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="dualpath-sem-") as tmp:
        yield Path(tmp)


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="POSIX semaphores live in /dev/shm")
def test_a_sigkilled_node_leaves_no_semaphores(scratch: Path) -> None:
    """The ``kill_node`` fault: a joined node agent and its engines, killed as a group."""
    procs = Procs(launch_env(scratch))
    port = _free_port()
    try:
        sched = procs.start("--role", "scheduler", "--port", str(port), "--store",
                            str(scratch / "store"), "--json")
        node = procs.join("decode", "d0", port, _json_line(sched, START_S)["token_file"])
        _json_line(node, START_S)
        _kill_and_look(node)
    finally:
        procs.close()


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="POSIX semaphores live in /dev/shm")
def test_a_sigkilled_embedded_launcher_leaves_no_semaphores(scratch: Path) -> None:
    """``dualpath launch`` (scheduler and engine processes) killed with its whole group."""
    procs = Procs(launch_env(scratch))
    try:
        launcher = procs.start("--port", str(_free_port()), "--store", str(scratch / "store"),
                               "--json")
        _json_line(launcher, START_S)
        _kill_and_look(launcher)
    finally:
        procs.close()


_CALIBRATOR = """
from dualpath_cli.runtime.calibrate import measure_flops_rate
measure_flops_rate("tiny", 600.0, new=16, cached=32)  # probes until killed
"""


def _computing(pid: int) -> bool:
    """A process under ``pid`` has numpy loaded: the FLOP-rate probe is running."""
    for child in psutil.Process(pid).children(recursive=True):
        try:
            if "_multiarray_umath" in Path(f"/proc/{child.pid}/maps").read_text():
                return True
        except OSError:
            continue
    return False


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc/PID/maps (Linux)")
def test_a_sigkilled_flops_probe_leaves_no_semaphores() -> None:
    """The bench's FLOP-rate probe (runtime/calibrate.py) killed with its group mid-probe:
    its probe process maps no ``sem.mp-*`` name (a plain subprocess, not a pool whose
    queues lock named semaphores), so the kill has nothing to leak."""
    p = subprocess.Popen([sys.executable, "-c", _CALIBRATOR], stderr=subprocess.PIPE,
                         start_new_session=True)
    try:
        wait_until(lambda: p.poll() is not None or _computing(p.pid), START_S,
                   "the probe to compute")
        assert p.poll() is None, p.communicate()[1]
        names = engine_semaphores(p.pid)
        assert not names, names
        assert not _kill_group(p)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)
        if p.stderr is not None:
            p.stderr.close()

