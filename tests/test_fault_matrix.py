"""The fault matrix on a live cluster (issue 17, item 3): one test per fault.

Each scenario starts a real :class:`~dualpath_cli.services.live.LiveCluster` (engine
processes over ZeroMQ, a POSIX store), serves multi-turn agent sessions, injects one fault
while turns are in flight and then checks the promises:

* the fault is **detected** within a stated bound (``limit_s``): an engine's death or silence
  by the scheduler, a bad block by its checksum before any byte of it is served, a store that
  refuses writes in ``dualpath_storage_write_errors_total``, a throttled NIC in the view;
* **no admitted turn is lost** (each finishes within ``TURN_TIMEOUT_S``);
* the **tokens are identical** to an in-process run of the same prompts by the reference
  model (it is exact: ``docs/architecture.md``, determinism), so nothing corrupt was served;
* **nothing half-written** is left (no ``*.tmp`` in the store; every block left verifies);
* the cluster **still serves** afterwards (a new session's turn), or serves recompute-only
  while the store refuses writes, which its metrics show.

``run_fault(name)`` is also what ``bench/reliability.py --faults`` runs and tabulates. The
slow rows are skipped unless ``DUALPATH_SLOW_TESTS=1``; the rest takes about a minute on
two cores. Store faults mount a small tmpfs or a FUSE passthrough that returns EIO
(tests/fuse_eio.py; root, /dev/fuse, fusepy and libfuse2; skipped with the reason
otherwise). The compute fabric dropping a peer is the ``fabric_drop`` fault; a whole node's
processes are killed in ``kill_node`` (nodes joined with ``launch --join``).
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest
from conftest import wait_until
from test_multinode import Procs, _json_line, engine_semaphores, launch_env

from dualpath_cli.faultspec import parse_fault
from dualpath_cli.runtime.model import load_model
from dualpath_cli.runtime.options import RuntimeOptions
from dualpath_cli.runtime.workloads import agentic_workload
from dualpath_cli.services.live import LiveCluster
from dualpath_cli.storage import PosixStore
from dualpath_cli.storage.inspect import verify_store
from dualpath_cli.workload.tokens import append_token_ids
from dualpath_cli.workload.trajectory import Trajectory

pytestmark = pytest.mark.e2e  # engine processes under faults

__all__ = ["FAULTS", "FaultRow", "run_fault", "MountRefused"]

#: Agents of every scenario: turn 0 fills the store, later turns read their prefix back.
AGENTS: list[Trajectory] = agentic_workload(4, turns=3, first_append=64, append=24, gen=4,
                                            seed=3)
VOCAB = 256
#: A turn not answered within this is lost.
TURN_TIMEOUT_S = 60.0
#: Heartbeat timeout of the scenarios (a SIGSTOPped engine is declared dead after this).
HB_TIMEOUT_S = 2.0

SLOW = pytest.mark.skipif(os.environ.get("DUALPATH_SLOW_TESTS") != "1",
                          reason="slow fault row: set DUALPATH_SLOW_TESTS=1 (or run "
                                 "bench/reliability.py --faults)")


class MountRefused(Exception):
    """A store fault needs a tmpfs mount and this process may not mount."""


@dataclass
class FaultRow:
    """One fault's figures (bench/reliability.py ``faults``)."""

    fault: str
    detected_s: float | None  # fault -> detection (None: not detected)
    limit_s: float  # the stated bound on detected_s
    lost_turns: int
    tokens_identical: bool
    served_corrupt: int  # turns served with tokens other than the reference's
    temp_files: int  # *.tmp left in the store
    serving_after: bool
    turns: int
    requeued: int
    detail: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if self.detected_s is not None:
            d["detected_s"] = round(self.detected_s, 3)
        d["seconds"] = round(self.seconds, 1)
        return d


@functools.cache
def _model() -> Any:
    from dualpath_cli.runtime.model.threads import limit_blas_threads

    limit_blas_threads(1)  # as the engines do: threaded BLAS is 10x slower on a busy host
    return load_model("tiny")


@functools.cache
def reference() -> dict[tuple[int, int], tuple[int, ...]]:
    """Every turn's tokens from the reference model in this process (no engines, no store)."""
    model = _model()
    out: dict[tuple[int, int], tuple[int, ...]] = {}
    for traj in AGENTS:
        ctx: list[int] = []
        cache = None  # the previous turn's KV: each turn computes only its new tokens
        for i, turn in enumerate(traj.turns):
            prompt = ctx + append_token_ids(traj, i, VOCAB).tolist()
            toks, cache = model.generate_with_cache(prompt, turn.gen, cache)
            out[traj.agent_id, i] = tuple(toks)
            ctx = prompt + toks
    return out


class Sessions:
    """Agents' sessions on a live cluster: each agent's turns in order, agents in parallel.

    Turn i's prompt is every earlier prompt and output plus turn i's appended tokens, as an
    OpenAI client keeping a conversation would send it.
    """

    def __init__(self, live: LiveCluster) -> None:
        self.live = live
        self.ctx: dict[int, list[int]] = {t.agent_id: [] for t in AGENTS}
        self.tokens: dict[tuple[int, int], tuple[int, ...]] = {}
        self.errors: dict[tuple[int, int], str] = {}
        self.admitted = 0
        self._lock = threading.Lock()

    def _agent(self, traj: Trajectory, turns: range) -> None:
        for i in turns:
            prompt = self.ctx[traj.agent_id] + append_token_ids(traj, i, VOCAB).tolist()
            try:
                ticket = self.live.submit(prompt, traj.turns[i].gen,
                                          session=f"agent-{traj.agent_id}")
                with self._lock:
                    self.admitted += 1
                out = ticket.wait(TURN_TIMEOUT_S).tokens
                self.live.done(ticket)
            except Exception as err:  # a lost turn: recorded, the agent stops
                with self._lock:
                    self.errors[traj.agent_id, i] = f"{type(err).__name__}: {err}"
                return
            with self._lock:
                self.tokens[traj.agent_id, i] = tuple(out)
            self.ctx[traj.agent_id] = prompt + list(out)

    def start(self, turns: range) -> list[threading.Thread]:
        threads = [threading.Thread(target=self._agent, args=(t, turns), daemon=True)
                   for t in AGENTS]
        for th in threads:
            th.start()
        return threads

    def run(self, turns: range) -> None:
        join(self.start(turns))


def join(threads: list[threading.Thread]) -> None:
    for th in threads:
        th.join(TURN_TIMEOUT_S * len(AGENTS[0].turns) + 30)
        assert not th.is_alive(), "a session thread hung past every turn's timeout"


def _opts(store: Path, **kw: Any) -> RuntimeOptions:
    base: dict[str, Any] = {"prefill_nodes": 2, "decode_nodes": 2, "block_tokens": 16,
                            "processes": True, "store_dir": store, "flops_rate": 5e9,
                            "heartbeat_timeout": HB_TIMEOUT_S}
    base.update(kw)
    return RuntimeOptions(**base)


@contextlib.contextmanager
def _cluster(opts: RuntimeOptions) -> Iterator[LiveCluster]:
    live = LiveCluster(opts)
    live.start(timeout=120)
    pids = list(live.system.cluster.pids().values())  # type: ignore[union-attr]
    try:
        yield live
    finally:
        for pid in pids:  # a SIGSTOPped engine must be able to die
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        live.close()
        wait_until(lambda: not any(psutil.pid_exists(p) and psutil.Process(p).status()
                                   != psutil.STATUS_ZOMBIE for p in pids), 15,
                   "the engine processes to exit")


def _temp_files(store: Path) -> list[Path]:
    return list(store.rglob("*.tmp"))


def _write_errors(live: LiveCluster) -> float:
    total = 0.0
    for snap in live.system.metrics(fresh=True, timeout=5).values():
        for row in snap["metrics"].get("dualpath_storage_write_errors_total", []):
            total += row["value"]
    return total


def _serving(live: LiveCluster, gen: int = 4) -> bool:
    """A new session's turn is answered, with the reference model's tokens."""
    prompt = append_token_ids(AGENTS[0], 0, VOCAB).tolist()[::-1]
    try:
        got = live.submit(prompt, gen, session="after-the-fault").wait(TURN_TIMEOUT_S).tokens
    except Exception:
        return False
    return list(got) == _model().generate(prompt, gen)


def _row(name: str, sessions: Sessions, live: LiveCluster, store: Path, detected: float | None,
         limit: float, t0: float, serving: bool, **detail: Any) -> FaultRow:
    ref = reference()
    wanted = {(t.agent_id, i) for t in AGENTS for i in range(len(t.turns))}
    lost = len(wanted - set(sessions.tokens))
    wrong = sum(1 for k, v in sessions.tokens.items() if ref[k] != v)
    return FaultRow(name, detected, limit, lost, wrong == 0 and lost == 0, wrong,
                    len(_temp_files(store)), serving, len(sessions.tokens),
                    live.system.scheduler.requeued,
                    {**detail, "errors": dict(list(
                        {f"{a}/{i}": e for (a, i), e in sessions.errors.items()}.items())[:3])},
                    time.monotonic() - t0)


def _holder(live: LiveCluster, role: str, among: Collection[int] | None = None) -> int | None:
    """An engine of ``role`` (of ``among``, if given) that holds a dispatched turn now (so
    killing it strands work); ``None`` if none does."""
    sched = live.system.scheduler
    with sched._lock:
        for f in sched.flights.values():
            eid = f.pe if role == "prefill" else f.de
            if eid >= 0 and (among is None or eid in among) and (
                    role == "decode" or not f.prefilled):
                return eid
    return None


def _busy_engine(live: LiveCluster, role: str, timeout: float = 30.0) -> int:
    """An engine of ``role`` that holds a dispatched turn (waiting for one)."""
    found: list[int] = []

    def holding() -> bool:
        eid = _holder(live, role)
        if eid is not None:
            found.append(eid)
        return eid is not None

    wait_until(holding, timeout, f"a {role} engine to hold a turn")
    return found[0]


def _freeze_busy(live: LiveCluster, role: str, engines_of: Callable[[int], Collection[int]],
                 pgid_of: Callable[[int], int], group: bool = False,
                 timeout: float = 30.0) -> tuple[int, float]:
    """Stop (SIGSTOP) the process of an engine of ``role`` that holds a turn, and return it
    with the time of the stop: the turn is checked again once the engine is stopped, so a
    turn that finished between the choice and the stop cannot leave the fault with nothing
    to re-queue (it chooses again then). ``group``: stop the process group ``pgid_of``
    gives (a node and its engines), else that one process."""
    deadline = time.monotonic() + timeout
    signal_ = os.killpg if group else os.kill
    while True:
        victim = _busy_engine(live, role, max(0.1, deadline - time.monotonic()))
        t0 = time.monotonic()
        signal_(pgid_of(victim), signal.SIGSTOP)
        if _holder(live, role, engines_of(victim)) is not None:
            return victim, t0
        signal_(pgid_of(victim), signal.SIGCONT)
        assert time.monotonic() < deadline, f"no {role} engine held a turn once stopped"


def _detected_since(live: LiveCluster, eid: int, t0: float, timeout: float) -> float | None:
    sched = live.system.scheduler

    def dead() -> bool:  # a declaration after the fault (not a stall on a busy host before)
        with sched._lock:
            return any(e == eid and t >= t0 for e, t in sched.dead_events)

    try:
        wait_until(dead, timeout, f"engine {eid} to be declared dead")
    except AssertionError:
        return None
    with sched._lock:
        at = next(t for e, t in sched.dead_events if e == eid and t >= t0)
    return at - t0


# -- scenarios ---------------------------------------------------------------------------
def _kill(role: str, tmp: Path) -> FaultRow:
    store = tmp / "store"
    t_start = time.monotonic()  # restart off: the engine stays dead (restart rows:
    # tests/test_engine_restart.py)
    with _cluster(_opts(store, restart=False)) as live:
        s = Sessions(live)
        s.run(range(0, 1))
        threads = s.start(range(1, 3))
        cluster = live.system.cluster
        victim, t0 = _freeze_busy(live, role, lambda e: (e,), cluster.pid)  # type: ignore[union-attr]
        os.kill(cluster.pid(victim), signal.SIGKILL)  # type: ignore[union-attr]
        detected = _detected_since(live, victim, t0, 10)
        join(threads)
        state = next(e.state for e in live.view().engines if e.engine_id == victim)
        return _row(f"kill -9 {'PE' if role == 'prefill' else 'DE'}", s, live, store,
                    detected, 2.0, t_start, _serving(live), engine=victim, state_after=state)


def _sigstop(tmp: Path) -> FaultRow:
    store = tmp / "store"
    t_start = time.monotonic()
    with _cluster(_opts(store)) as live:
        s = Sessions(live)
        s.run(range(0, 1))
        threads = s.start(range(1, 3))
        cluster = live.system.cluster
        victim, t0 = _freeze_busy(live, "decode", lambda e: (e,), cluster.pid)  # type: ignore[union-attr]
        pid = cluster.pid(victim)  # type: ignore[union-attr]
        try:
            detected = _detected_since(live, victim, t0, HB_TIMEOUT_S + 15)
            join(threads)
        finally:
            os.kill(pid, signal.SIGCONT)
        sched = live.system.scheduler
        wait_until(lambda: sched.revived >= 1, 15, "the stopped engine to report again")
        return _row("SIGSTOP DE (hang)", s, live, store, detected, HB_TIMEOUT_S + 1.5,
                    t_start, _serving(live), engine=victim, revived=sched.revived)


def _mutate(path: Path, kind: str, donor: bytes) -> None:
    """Corrupt one block file in place (a reader may be reading it right now)."""
    if kind == "corrupt":
        with open(path, "r+b") as f:
            f.seek(4096 + 7)  # the payload: only its checksum can tell
            byte = f.read(1)
            f.seek(4096 + 7)
            f.write(bytes([byte[0] ^ 0x5A]) if byte else b"\x01")
    elif kind == "truncate":
        os.truncate(path, os.path.getsize(path) // 2)
    else:  # replace: a whole, valid block of another prefix under this name
        with open(path, "r+b") as f:
            f.write(donor)
            f.truncate(len(donor))


def _blocks(store: Path) -> list[Path]:
    return sorted(p for p in (store / "blocks").rglob("*.kv") if not p.name.startswith("."))


def _block_fault(kind: str, tmp: Path) -> FaultRow:
    store = tmp / "store"
    t_start = time.monotonic()
    reason = {"corrupt": "checksum", "truncate": "truncated", "replace": "foreign_header"}[kind]
    with _cluster(_opts(store)) as live:
        s = Sessions(live)
        s.run(range(0, 1))
        files = _blocks(store)
        assert len(files) >= 2 * len(AGENTS), "turn 0 stored too few blocks"
        donor = files[-1].read_bytes()
        threads = s.start(range(1, 3))  # turn 1 reads the prefix these blocks hold...
        t0 = time.monotonic()
        for path in files[:-1]:  # ...while they are mutated
            _mutate(path, kind, donor)
        qdir = store / "quarantine"
        detected: float | None = None
        with contextlib.suppress(AssertionError):
            wait_until(lambda: qdir.is_dir() and any(qdir.iterdir()), 30, "a quarantined block")
            detected = time.monotonic() - t0
        join(threads)
        serving = _serving(live)
        quarantined = sorted(p.name for p in qdir.iterdir()) if qdir.is_dir() else []
        mutated = {p.name[:-3] for p in files[:-1]}
        left = verify_store(PosixStore(store))  # what was never read: still caught
        row = _row(f"{kind} block files", s, live, store, detected, 5.0, t_start,
                   serving, mutated=len(mutated), quarantined=len(quarantined),
                   reasons=sorted({q.split(".")[1] for q in quarantined}),
                   corrupt_left=len(left.corrupt))
        # a quarantined block is one we mutated; every one of them was caught for our reason
        assert {q.split(".")[0] for q in quarantined} <= mutated, quarantined
        assert {c["key"] for c in left.corrupt} <= mutated
        assert row.detail["reasons"] in ([reason], []), row.detail
        return row


@contextlib.contextmanager
def _tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A small tmpfs at ``path`` (unmounted after); MountRefused where mounting is refused."""
    path.mkdir(parents=True, exist_ok=True)
    mount = shutil.which("mount")
    if mount is None or os.geteuid() != 0:
        raise MountRefused("a tmpfs store needs root and mount(8)")
    done = subprocess.run([mount, "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs",
                           str(path)], capture_output=True, text=True)
    if done.returncode != 0:
        raise MountRefused(f"mount -t tmpfs refused: {done.stderr.strip()}")
    try:
        yield path
    finally:
        for _ in range(50):  # busy while a closing engine still holds a file
            if subprocess.run(["umount", str(path)], capture_output=True).returncode == 0:
                break
            time.sleep(0.1)
        else:
            subprocess.run(["umount", "-l", str(path)], capture_output=True)


def _remount(path: Path, mode: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{mode}", str(path)], check=True,
                   capture_output=True)


def _fill(path: Path) -> Path:
    """Take every free byte of the file system at ``path`` (a filler file outside blocks/)."""
    filler = path / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for size in (1 << 20, 1 << 12, 1):
            chunk = bytes(size)
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, chunk)
    finally:
        os.close(fd)
    return filler


def _store_fault(kind: str, tmp: Path) -> FaultRow:
    store = tmp / "store"
    t_start = time.monotonic()
    with _tmpfs(store, "64m"), _cluster(_opts(store)) as live:
        s = Sessions(live)
        s.run(range(0, 1))
        before = len(_blocks(store))
        t0 = time.monotonic()
        filler = None
        if kind == "readonly":
            _remount(store, "ro")
        else:
            filler = _fill(store)
        threads = s.start(range(1, 3))
        detected: float | None = None
        try:
            with contextlib.suppress(AssertionError):
                wait_until(lambda: _write_errors(live) > 0, 30, "a write error in the metrics")
                detected = time.monotonic() - t0
            join(threads)
            during = len(_blocks(store))
            errors = _write_errors(live)
            serving_ro = _serving(live)  # recompute-only, still serving
        finally:
            if kind == "readonly":
                _remount(store, "rw")
            elif filler is not None:
                filler.unlink()
        n = len(_blocks(store))
        serving_back = _serving(live)  # the same prompt again: its blocks are written now
        grown = len(_blocks(store)) > n
        return _row(f"store {'read-only' if kind == 'readonly' else 'full'}", s, live, store,
                    detected, 5.0, t_start, serving_ro, blocks_before=before,
                    blocks_during=during, write_errors=errors, persisting_again=grown,
                    serving_after_restore=serving_back)


def _throttle(tmp: Path) -> FaultRow:
    store = tmp / "store"
    t_start = time.monotonic()
    snic = 50e6
    with _cluster(_opts(store, snic_bw=snic)) as live:
        s = Sessions(live)
        s.run(range(0, 1))
        fault = parse_fault("snic_throttle:node=0,fraction=0.002")
        threads = s.start(range(1, 3))
        t0 = time.monotonic()
        live.set_faults([fault], "test")
        detected: float | None = None

        def reported() -> bool:
            node = next(n for n in live.view().nodes if n.node == 0)
            return node.snic_bandwidth_bytes_per_s == pytest.approx(snic * 0.002)

        with contextlib.suppress(AssertionError):
            wait_until(reported, 10, "the view to report the throttled NIC")
            detected = time.monotonic() - t0
        join(threads)
        serving = _serving(live)
        faults = [f["spec"] for f in live.faults()]
        live.clear_faults("test")
        return _row("storage NIC throttled to 0.2%", s, live, store, detected, 1.0, t_start,
                    serving, faults=faults)


@contextlib.contextmanager
def _fuse_eio(backing: Path, mount: Path, control: Path) -> Iterator[Path]:
    """``tests/fuse_eio.py`` mounting ``backing`` at ``mount`` (unmounted after, its process
    gone); MountRefused where FUSE cannot mount (no /dev/fuse, no libfuse, not allowed)."""
    try:
        import fuse  # noqa: F401 - fusepy, over libfuse2
    except (ImportError, OSError) as err:
        raise MountRefused(f"fusepy cannot load libfuse ({err}): pip install fusepy, "
                           "apt-get install libfuse2") from None
    fusermount = shutil.which("fusermount") or shutil.which("fusermount3")
    if not Path("/dev/fuse").exists() or fusermount is None:
        raise MountRefused("no /dev/fuse or fusermount: FUSE cannot mount here")
    backing.mkdir(parents=True, exist_ok=True)
    mount.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("fuse_eio.py")),
                             str(backing), str(mount), str(control)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not os.path.ismount(mount):
            if proc.poll() is not None:
                err = proc.stderr.read().strip() if proc.stderr else ""
                raise MountRefused(f"the FUSE mount failed: {err[-300:]}")
            if time.monotonic() > deadline:
                raise MountRefused("the FUSE mount did not appear within 30 s")
            time.sleep(0.02)
        yield mount
    finally:
        control.unlink(missing_ok=True)
        for _ in range(100):  # busy while a closing engine still holds a file
            if not os.path.ismount(mount) or subprocess.run(
                    [fusermount or "fusermount", "-u", str(mount)],
                    capture_output=True).returncode == 0:
                break
            time.sleep(0.1)
        else:
            subprocess.run([fusermount or "fusermount", "-uz", str(mount)],
                           capture_output=True)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        if proc.stderr is not None:
            proc.stderr.close()


def _read_failures(live: LiveCluster) -> float:
    """Blocks the scheduler's ledger counted as missed because their read failed."""
    return live.system.scheduler.ledger.m_miss["read_failed"].value


def _store_eio(tmp: Path) -> FaultRow:
    """The store's file system returns EIO (a FUSE passthrough, tests/fuse_eio.py) on every
    block read and every write while turns 1-2 read their prefix back."""
    backing, store, control = tmp / "backing", tmp / "store", tmp / "eio-control"
    t_start = time.monotonic()
    with _fuse_eio(backing, store, control), _cluster(_opts(store)) as live:
        s = Sessions(live)
        s.run(range(0, 1))
        before = len(_blocks(backing))
        assert before >= len(AGENTS), "turn 0 stored too few blocks"
        t0 = time.monotonic()
        control.write_text("read *.kv\nwrite *\n")
        threads = s.start(range(1, 3))
        detected: float | None = None
        try:
            with contextlib.suppress(AssertionError):
                wait_until(lambda: _read_failures(live) > 0 or _write_errors(live) > 0, 30,
                           "a failed read or write in the metrics")
                detected = time.monotonic() - t0
            join(threads)
            during = len(_blocks(backing))
            read_failed, write_errors = _read_failures(live), _write_errors(live)
            serving_eio = _serving(live)  # recompute-only while the store fails
        finally:
            control.unlink(missing_ok=True)
        n = len(_blocks(backing))
        serving_back = _serving(live)  # the same prompt again: its blocks are written now
        grown = len(_blocks(backing)) > n
        left = verify_store(PosixStore(backing))
        return _row("store returns EIO (FUSE)", s, live, backing, detected, 5.0, t_start,
                    serving_eio, blocks_before=before, blocks_during=during,
                    read_failed=read_failed, write_errors=write_errors,
                    persisting_again=grown, serving_after_restore=serving_back,
                    corrupt_left=len(left.corrupt))


def _requeued(live: LiveCluster, reason: str) -> float:
    family = live.system.scheduler.registry.family("dualpath_scheduler_requeued_turns_total")
    return sum(child.value for labels, child in family.samples()
               if labels.get("reason") == reason)


def _fabric_drop(tmp: Path) -> FaultRow:
    """A PE drops out of the compute fabric (``fabric_drop``: its sockets to the DEs closed,
    what they queued lost, every KV message it sends lost) just as turns 1-2 start, and comes
    back once the first lost turn is re-queued. Its heartbeats still reach the scheduler: it
    is alive, only its KV never arrives."""
    store = tmp / "store"
    t_start = time.monotonic()
    with _cluster(_opts(store)) as live:
        s = Sessions(live)
        s.run(range(0, 1))
        victim = 0  # a PE (engines 0 and 1 are the prefill nodes' engines)
        t0 = time.monotonic()
        live.set_faults([parse_fault(f"fabric_drop:engine={victim}")], "test")
        threads = s.start(range(1, 3))
        detected: float | None = None
        try:
            with contextlib.suppress(AssertionError):
                wait_until(lambda: _requeued(live, "kv_lost") > 0, 30,
                           "a turn re-queued after its KV was dropped")
                detected = time.monotonic() - t0
        finally:
            live.clear_faults("test")  # the link is back
        join(threads)
        serving = _serving(live)
        state = next(e.state for e in live.view().engines if e.engine_id == victim)
        return _row("compute fabric drops a PE", s, live, store, detected, 5.0, t_start,
                    serving, engine=victim, rerun=_requeued(live, "kv_lost"),
                    state_after=state, dead_events=len(live.system.scheduler.dead_events))


def _kill_node(tmp: Path) -> FaultRow:
    """A joined node's processes (its ``launch --role decode --join`` and its engines) all
    killed with SIGKILL while they hold turns; the scheduler runs in this process."""
    from openai_server import serve

    store = tmp / "store"
    t_start = time.monotonic()
    procs = Procs(dict(launch_env(tmp), DUALPATH_TOKEN="test-token"))
    with _cluster(_opts(store, local_engines=False)) as live, serve(live) as served:
        port = served.url.rsplit(":", 1)[1]
        try:
            nodes = {name: procs.join(role, name, port) for name, role in (
                ("p0", "prefill"), ("p1", "prefill"), ("d0", "decode"), ("d1", "decode"))}
            engines = {name: _json_line(p, 180)["engines"] for name, p in nodes.items()}
            node_of = {eid: name for name, eids in engines.items() for eid in eids}
            sems_of = {name: engine_semaphores(p.pid) for name, p in nodes.items()}
            s = Sessions(live)
            s.run(range(0, 1))
            threads = s.start(range(1, 3))
            victim, t0 = _freeze_busy(  # the node agent and its engines
                live, "decode", lambda e: engines[node_of[e]],
                lambda e: nodes[node_of[e]].pid, group=True)
            name = node_of[victim]
            sems = sems_of[name]  # its NIC buckets' semaphores
            os.killpg(nodes[name].pid, signal.SIGKILL)
            detected = _detected_since(live, victim, t0, HB_TIMEOUT_S + 15)
            join(threads)
            nodes[name].wait(10)
            alive = [n for n, p in nodes.items() if p.poll() is None]
            return _row("kill -9 a node", s, live, store, detected, HB_TIMEOUT_S + 1.5,
                        t_start, _serving(live), node=name, engines=engines[name],
                        nodes_alive=alive, semaphores=len(sems),
                        semaphores_left=sum(Path("/dev/shm", n).exists() for n in sems))
        finally:
            procs.close()


#: fault name -> (scenario, slow)
FAULTS: dict[str, tuple[Callable[[Path], FaultRow], bool]] = {
    "kill_pe": (functools.partial(_kill, "prefill"), False),
    "kill_de": (functools.partial(_kill, "decode"), False),
    "sigstop_de": (_sigstop, False),
    "corrupt_blocks": (functools.partial(_block_fault, "corrupt"), False),
    "truncate_blocks": (functools.partial(_block_fault, "truncate"), True),
    "replace_blocks": (functools.partial(_block_fault, "replace"), True),
    "store_full": (functools.partial(_store_fault, "full"), False),
    "store_readonly": (functools.partial(_store_fault, "readonly"), True),
    "snic_throttle": (_throttle, True),
    "store_eio": (_store_eio, False),
    "kill_node": (_kill_node, False),
    "fabric_drop": (_fabric_drop, False),
}


def run_fault(name: str) -> FaultRow:
    """Run one scenario in a temporary directory (removed after) and return its row."""
    scenario, _ = FAULTS[name]
    with tempfile.TemporaryDirectory(prefix="dualpath-fault-") as tmp:
        return scenario(Path(tmp))


def _check(row: FaultRow) -> None:
    assert row.detected_s is not None and row.detected_s <= row.limit_s, row
    assert row.lost_turns == 0, row
    assert row.tokens_identical and row.served_corrupt == 0, row
    assert row.temp_files == 0, row
    assert row.serving_after, row


@pytest.mark.parametrize("name", [pytest.param(n, marks=[SLOW] if slow else [])
                                  for n, (_, slow) in FAULTS.items()])
def test_fault(name: str) -> None:
    try:
        row = run_fault(name)
    except MountRefused as err:
        pytest.skip(str(err))
    _check(row)
    if name == "fabric_drop":  # re-run, not declared dead: it never stopped heartbeating
        assert row.detail["rerun"] >= 1 and row.detail["state_after"] == "ready", row
        assert row.detail["dead_events"] == 0, row
    elif name == "kill_node":
        assert row.requeued >= 1 and len(row.detail["nodes_alive"]) == 3, row
        assert row.detail["semaphores"] >= 1 and row.detail["semaphores_left"] == 0, row
    elif name.startswith("kill"):
        assert row.requeued >= 1 and row.detail["state_after"] == "dead", row
    elif name == "sigstop_de":
        assert row.requeued >= 1 and row.detail["revived"] >= 1, row
    elif name.endswith("_blocks"):
        assert row.detail["quarantined"] >= 1, row  # reads hit the bad blocks
    elif name == "store_eio":
        assert row.detail["read_failed"] >= 1 and row.detail["write_errors"] >= 1, row
        assert row.detail["blocks_during"] == row.detail["blocks_before"], row
        assert row.detail["persisting_again"] and row.detail["serving_after_restore"], row
        assert row.detail["corrupt_left"] == 0, row
    elif name.startswith("store"):
        assert row.detail["write_errors"] >= 1, row
        assert row.detail["blocks_during"] == row.detail["blocks_before"], row
        assert row.detail["persisting_again"] and row.detail["serving_after_restore"], row


def test_losing_every_prefill_engine_answers_admitted_turns_at_once(tmp_path: Path) -> None:
    """kill -9 of the only PE (1P2D) with cluster.restart off: the admitted turns fail at
    once with one line (HTTP 503), not after their client's timeout; new turns are refused
    the same way."""
    from dualpath_cli.services.live import EnginesLost

    with _cluster(_opts(tmp_path / "store", prefill_nodes=1, restart=False)) as live:
        prompts = [append_token_ids(t, 0, VOCAB).tolist() for t in AGENTS]
        tickets = [live.submit(p, 64) for p in prompts]
        t0 = time.monotonic()
        live.system.cluster.kill(0)
        for ticket in tickets:
            try:
                assert len(ticket.wait(10).tokens) == 64  # finished before the kill
            except EnginesLost as err:
                assert str(err).startswith("every prefill engine has died (engine 0 ")
        assert time.monotonic() - t0 < 10
        with pytest.raises(EnginesLost, match="restart the cluster"):
            live.submit(prompts[0], 4)
        assert not live.ready()
    assert not _temp_files(tmp_path / "store")
