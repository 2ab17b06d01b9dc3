"""Fixtures shared by the test modules (pytest finds them here by name)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

import psutil
import pytest
from hypothesis import HealthCheck, settings
from tiers import (  # noqa: F401 - the test tiers' hooks and guard, run from here
    pytest_collection_modifyitems,
    pytest_configure,
    pytest_runtest_setup,
    pytest_runtest_teardown,
    quick_searches_in_one_process,
    quick_tests_start_nothing,
)

from dualpath_cli.api.listen import free_port

if TYPE_CHECKING:
    from dualpath_cli.api.fake import FakeClient

T = TypeVar("T")

# A loaded CI machine makes hypothesis's example generation and each example slow: that is
# the machine, not the property, so neither its deadline nor its too-slow check applies.
settings.register_profile("loaded", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("loaded")

#: The first-party plugin's source tree, a plain package directory: the tests import it from
#: here (``sweep_path``), since the README's install does not pip-install it.
SWEEP_DIR = Path(__file__).resolve().parents[1] / "plugins" / "dualpath-pd-sweep"

#: The CLI as a subprocess (what a user's shell runs).
CLI = [sys.executable, "-m", "dualpath_cli.cli.app"]


def run_cli(env: dict[str, str], *args: str,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``dualpath ARGS...`` as a subprocess in ``env`` (a user's shell), output captured."""
    return subprocess.run([*CLI, *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


@contextlib.contextmanager
def recording(env: dict[str, str], url: str, window: str, out: Path,
              interval: str = "1s") -> Iterator[None]:
    """``dualpath record`` of the cluster at ``url`` for ``window`` into ``out`` while the
    block runs (a live diagnose of the same seconds); after it the recording must be written.
    """
    recorder = subprocess.Popen([*CLI, "record", "--url", url, "--window", window,
                                 "--interval", interval, "-o", str(out)], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        yield
    except BaseException:
        recorder.kill()
        recorder.communicate(timeout=30)
        raise
    _, err = recorder.communicate(timeout=120)
    assert recorder.returncode == 0, err


def _proc_state(pid: int) -> str:
    """Each thread's state, kernel wait channel and signal masks, from /proc (Linux)."""
    lines = []
    for task in sorted(Path(f"/proc/{pid}/task").glob("*")):
        with contextlib.suppress(OSError):
            status = dict(line.split(":", 1) for line in
                          (task / "status").read_text().splitlines() if ":" in line)
            wchan = (task / "wchan").read_text() if (task / "wchan").exists() else "?"
            lines.append(f"{task.name} {status.get('Name', '?').strip()}: "
                         f"{status.get('State', '?').strip()} wchan={wchan} "
                         + " ".join(f"{k}={status.get(k, '?').strip()}" for k in
                                    ("SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt")))
    return "\n".join(lines)


def communicate_or_explain(proc: subprocess.Popen[str], timeout: float) -> tuple[str, str]:
    """``proc.communicate(timeout)``; if it does not end in time, fail with what it was
    doing: each thread's kernel state and signal masks, and (started with
    ``PYTHONFAULTHANDLER=1``) its Python stacks from a SIGABRT.

    Why: a CLI that did not exit after a signal once failed CI with nothing to go on.
    """
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        state = _proc_state(proc.pid)
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGABRT)
        try:
            out, err = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        raise AssertionError(f"pid {proc.pid} still running after {timeout} s\n{state}\n"
                             f"stdout: {out[-4000:]}\nstderr: {err[-12000:]}") from None


def all_gone(pids: Iterable[int]) -> bool:
    """No process of ``pids`` is left running (a zombie counts as gone: its parent reaps it).

    A process that exits between the two looks is gone too (no NoSuchProcess race).
    """
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            pass
    return True


def wait_until(cond: Callable[[], T], timeout: float, what: str = "the condition", *,
               interval: float = 0.02, pace: Callable[[], object] | None = None) -> T:
    """Poll ``cond`` until it returns something true, and return that; after ``timeout``
    seconds fail naming ``what`` and the last value ``cond`` returned.

    Between polls it sleeps ``interval``, or calls ``pace`` instead where something paces
    the loop better than a sleep (a round trip to the server, a wait for fresh reports).
    An exception ``cond`` raises (an assertion that a process still runs) ends the wait.

    Why: a test waits on a condition with a deadline, never on a bare sleep, and one helper
    says the same thing on every timeout (``from conftest import wait_until``).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what} "
                                 f"(last: {value!r})")
        if pace is not None:
            pace()
        elif interval:
            time.sleep(interval)


def wait_for_turns(client: Any, total: int, work: subprocess.Popen[str],
                   timeout: float = 120) -> None:
    """Wait (bounded) until the cluster ``client`` asks placed ``total`` turns, while
    ``work`` (a ``dualpath bench`` feeding it) still runs; a round trip paces the loop."""
    def placed() -> bool:
        assert work.poll() is None, f"the workload ended ({work.returncode}) before the turns"
        return bool(client.view().scheduler.decisions.total >= total)

    wait_until(placed, timeout, f"{total} turns placed", pace=lambda: client.decisions(-1))


def forget_sweep_modules() -> None:
    """Drop the first-party plugin's modules, so the next import finds them afresh."""
    for name in [m for m in sys.modules if m.startswith("dualpath_pd_sweep")]:
        del sys.modules[name]


@pytest.fixture()
def sweep_path(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Make the first-party plugin (``dualpath_pd_sweep``) importable from its source tree
    without pip-installing it."""
    monkeypatch.syspath_prepend(str(SWEEP_DIR))
    forget_sweep_modules()
    yield
    forget_sweep_modules()


@pytest.fixture()
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Private XDG dirs for this test (in-process calls and subprocesses alike), and no
    ``DUALPATH_URL`` or ``DUALPATH_TOKEN`` from the caller's shell: the environment a CLI
    subprocess gets.

    Why: a launched cluster's state file, token and logs land under these dirs, so tests
    that launch in parallel never see each other's cluster (or the developer's own).
    """
    values = {"XDG_RUNTIME_DIR": str(tmp_path / "run"), "XDG_DATA_HOME": str(tmp_path / "data"),
              "XDG_STATE_HOME": str(tmp_path / "state")}
    (tmp_path / "run").mkdir(mode=0o700)
    for k, v in values.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("DUALPATH_URL", raising=False)
    monkeypatch.delenv("DUALPATH_TOKEN", raising=False)
    return dict(os.environ)


@pytest.fixture()
def clean_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The CLI, called in this process, sees none of the caller's setup: no ``DUALPATH_*``
    variable, a private runtime dir (no cluster's state file) and config home, no system
    config file. Returns the config home (not created).
    """
    for var in list(os.environ):
        if var.startswith("DUALPATH_"):
            monkeypatch.delenv(var)
    home = tmp_path / "home"
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    monkeypatch.setenv("DUALPATH_CONFIG_HOME", str(home))
    monkeypatch.setenv("DUALPATH_SYSTEM_CONFIG", str(tmp_path / "no-system.yaml"))
    return home


@pytest.fixture()
def fake_env(clean_config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No real cluster: nothing of the caller's setup (:func:`clean_config`), the URL and
    token of the fake cluster (:func:`fake`) instead, and a terminal wide enough for tables."""
    monkeypatch.setenv("DUALPATH_URL", "http://fake")
    monkeypatch.setenv("DUALPATH_TOKEN", "fake-token")
    monkeypatch.setenv("COLUMNS", "200")


@pytest.fixture()
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeClient:
    """The cluster the CLI connects to (``source.connect``): a FakeClient of one 2P4D view
    (test_diagnose_rules.make_view(0)), no metrics. Imported here, not at the top: most test
    runs need none of it."""
    from test_diagnose_rules import make_view

    from dualpath_cli.api.fake import FakeClient
    from dualpath_cli.cli import source

    client = FakeClient(make_view(0), metrics_text="")
    monkeypatch.setattr(source, "connect", lambda ref, timeout: client)
    return client


def _launcher_fate(proc: subprocess.Popen[str]) -> str:
    """Whether a launcher that ``stop`` could not stop still runs, or how it ended (its
    stderr): a state file gone with the launcher alive is a reader's doing, not its."""
    if proc.poll() is None:
        return f"\nthe launcher (pid {proc.pid}) still runs"
    _, err = proc.communicate(timeout=10)
    return f"\nthe launcher exited ({proc.returncode}): {err[-4000:]}"


class Launched(NamedTuple):
    """A cluster :func:`launch_cluster` started: its URL, port and ``ready in`` line."""

    url: str
    port: int
    ready_line: str


@pytest.fixture()
def launch_cluster(env: dict[str, str]) -> Iterator[Callable[..., Launched]]:
    """Start ``dualpath launch --port P ARGS...`` (in ``env``) and wait until it is ready.

    After the test each cluster is stopped with ``dualpath stop`` (which must succeed: a
    clean stop is part of every end-to-end check), and whatever is left of its processes
    is killed.
    """
    started: list[tuple[subprocess.Popen[str], int, list[psutil.Process], bool]] = []

    def launch(*args: str) -> Launched:
        port = free_port()
        proc = subprocess.Popen([*CLI, "launch", "--port", str(port), *args], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        # Process objects, not pids: psutil refuses to signal a pid reused since (by another
        # test's process on a busy host) where a fresh psutil.Process(pid) would kill it
        family = (psutil.Process(proc.pid).children(recursive=True) if proc.poll() is None
                  else [])
        ready = line.startswith("ready in ")
        started.append((proc, port, family, ready))
        assert ready, line + (proc.stderr.read()  # type: ignore[union-attr]
                                                      if proc.poll() is not None else "")
        return Launched(f"http://127.0.0.1:{port}", port, line)

    try:
        yield launch
        for proc, port, _, ready in reversed(started):
            if ready:
                stop = subprocess.run([*CLI, "stop", "--port", str(port)], env=env,
                                      capture_output=True, text=True, timeout=120)
                assert stop.returncode == 0, (stop.stdout + stop.stderr  # why, if it fails
                                              + _launcher_fate(proc))
                proc.communicate(timeout=60)
    finally:
        for proc, _, family, _ in started:
            for child in family:
                try:
                    child.kill()
                except psutil.NoSuchProcess:
                    pass
            if proc.poll() is None:
                proc.kill()
            if proc.stdout is not None and not proc.stdout.closed:
                proc.communicate(timeout=10)
