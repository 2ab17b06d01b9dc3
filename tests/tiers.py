"""The test tiers: ``e2e`` marks a test that starts processes or servers, and a quick test
(``pytest -m "not e2e"``, the inner loop) that starts one fails.

Why a guard and not only markers: a marker is a promise; a quick test that starts an engine
process, a launched cluster or an HTTP server would quietly make the quick loop slow and
flaky. tests/conftest.py imports the hooks and the fixture below, so pytest runs them.

What counts as starting something: ``subprocess`` (``run``, ``Popen``), a
``multiprocessing`` process (spawn or fork), ``os.fork`` and a socket that listens, in the
test, its fixtures (module-scoped ones too: they are set up in the first test's setup) or
a thread it started. A few one-shot helper programs are fine (``QUICK_PROGRAMS``).
"""

from __future__ import annotations

import contextlib
import multiprocessing.process
import os
import socket
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

__all__ = ["E2E_FIXTURES", "QUICK_PROGRAMS", "StartsAProcess", "pytest_configure",
           "pytest_collection_modifyitems", "pytest_runtest_setup", "pytest_runtest_teardown",
           "quick_searches_in_one_process", "quick_tests_start_nothing", "refused_starts"]

#: Fixtures that start processes or servers: a test that asks for one is ``e2e``.
E2E_FIXTURES = frozenset({"launch_cluster"})

#: One-shot helper programs that a quick test may run (they start nothing that lives on):
#: git, the C compiler storage/native.py builds the block reader with, promtool checking a
#: text, and the io_uring probe storage/engines.py runs once per process.
QUICK_PROGRAMS = frozenset({"git", "cc", "gcc", "clang", "promtool"})


class StartsAProcess(AssertionError):
    """A test outside the ``e2e`` tier started a process or a server."""


class _Running:
    """The test now running when it is a quick one (no ``e2e`` marker), and what it started."""

    quick: pytest.Item | None = None
    started: list[str] = []


def _note(what: str) -> None:
    item = _Running.quick
    if item is not None:
        _Running.started.append(what)
        raise StartsAProcess(f"{item.nodeid} {what}, but is not marked e2e: mark it "
                             "(@pytest.mark.e2e, a module's pytestmark, or a fixture in "
                             "tiers.E2E_FIXTURES)")


def _quick_program(args: Any) -> bool:
    argv = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)
    program = os.path.basename(os.fsdecode(argv[0])) if argv else ""
    return program in QUICK_PROGRAMS or any("_probe_uring" in str(a) for a in argv)


def _guard_starts() -> None:
    """Wrap the ways a test starts a process or a server so that :func:`_note` sees them."""
    execute_child = subprocess.Popen._execute_child  # type: ignore[attr-defined]
    start = multiprocessing.process.BaseProcess.start
    fork = os.fork
    listen = socket.socket.listen

    def guarded_execute_child(self: subprocess.Popen[Any], args: Any, *rest: Any) -> Any:
        if not _quick_program(args):
            _note(f"runs {args!r}")
        return execute_child(self, args, *rest)

    def guarded_start(self: multiprocessing.process.BaseProcess) -> None:
        _note(f"starts the process {self.name}")
        start(self)

    def guarded_fork() -> int:
        _note("forks")
        return fork()

    def guarded_listen(self: socket.socket, *args: Any) -> None:
        _note(f"listens on {self.getsockname()!r}")
        listen(self, *args)

    subprocess.Popen._execute_child = guarded_execute_child  # type: ignore[attr-defined]
    multiprocessing.process.BaseProcess.start = guarded_start  # type: ignore[method-assign]
    os.fork = guarded_fork
    socket.socket.listen = guarded_listen  # type: ignore[method-assign]


def pytest_configure(config: pytest.Config) -> None:
    _guard_starts()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if E2E_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.e2e)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    _Running.quick = None if item.get_closest_marker("e2e") else item
    _Running.started = []


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    _Running.quick = None


@pytest.fixture(autouse=True)
def quick_searches_in_one_process(request: pytest.FixtureRequest,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A quick test's twin search replays its settings in this process: the search's pool
    of worker processes (its default wherever the process has no other thread) belongs to
    the e2e tier, which tests that it answers the same (tests/test_twin.py)."""
    if request.node.get_closest_marker("e2e") is None:
        from dualpath_cli.sim import twin_search

        monkeypatch.setattr(twin_search, "WORKERS", 1)


@pytest.fixture(autouse=True)
def quick_tests_start_nothing() -> Iterator[None]:
    """Fail a quick test that started something, even where the code under test swallowed
    the :class:`StartsAProcess` error (a fallback, a retry, a background thread)."""
    yield
    started, _Running.started = _Running.started, []
    if started:
        more = f" (and {len(started) - 1} more)" if len(started) > 1 else ""
        pytest.fail(f"this quick test {started[0]}{more}; mark it e2e", pytrace=False)


@contextlib.contextmanager
def refused_starts() -> Iterator[list[str]]:
    """The starts refused inside the block (still raised), not held against the test: for
    the guard's own test (tests/test_tiers.py)."""
    before = len(_Running.started)
    refused: list[str] = []
    try:
        yield refused
    finally:
        refused.extend(_Running.started[before:])
        del _Running.started[before:]
