"""Signals that end a run by unwinding it, and the short sections they must not split.

Why: the CLI turns SIGTERM and SIGHUP into :class:`Terminated` (and SIGINT into
``KeyboardInterrupt``) in the main thread, so ``finally`` blocks stop engines and remove
temporary files. A signal that lands between creating a resource and entering the ``try``
that removes it (``mkdtemp`` has returned, the ``with`` is not entered yet) would leave the
resource behind. :func:`deferred` holds such a signal until its section ends and raises it
there; :func:`temp_dir` uses it, so a temporary directory is removed however the run ends.

An import is such a section too, always: an extension module's initialisation may swallow
an exception raised inside it (CI saw Cython's ``numpy.random`` do so: ``storage bench``
then ran its full 60 s after SIGTERM). A signal that lands in an import is raised once the
main thread has left it (a helper thread watches for that and re-delivers the signal).

The handlers live in :mod:`dualpath_cli.cli.app`; they call :func:`deliver`. Without them
(a library caller) nothing is deferred and nothing here changes how signals behave.
"""

from __future__ import annotations

import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

__all__ = ["Terminated", "deliver", "deferred", "temp_dir", "on_act"]


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised in the main thread so it unwinds like Ctrl-C does."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


_depth = 0  # nesting of deferred sections on the main thread (where handlers run)
_pending: int | None = None  # a signal that arrived inside one
_after_import: int | None = None  # a signal held until the main thread's import ends

#: Called with the signal number just before its interrupt is raised (the CLI restores the
#: default dispositions there, so a second SIGTERM ends the process at once).
on_act: Callable[[int], None] | None = None


def _interrupt(signum: int) -> KeyboardInterrupt:
    return KeyboardInterrupt() if signum == signal.SIGINT else Terminated(signum)


def _act(signum: int, cause: BaseException | None = None) -> None:
    """Raise ``signum``'s interrupt (chained to ``cause``, an error already on its way)."""
    if on_act is not None:
        on_act(signum)
    if cause is not None:
        raise _interrupt(signum) from cause
    raise _interrupt(signum)


def _importing(frame: FrameType | None) -> bool:
    """Whether ``frame`` runs inside an import (importlib's frames are on its stack)."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def _redeliver_after_import(signum: int) -> None:
    """Watch the main thread from a helper and deliver ``signum`` again (its handler runs
    anew) once no import is on the main thread's stack."""
    main = threading.main_thread().ident or 0

    def watch() -> None:
        global _after_import
        while _importing(sys._current_frames().get(main)):  # noqa: SLF001 - CPython's view
            time.sleep(0.005)  # an import takes ms; polling beats hooking every frame
        held, _after_import = _after_import, None
        if held is not None:
            signal.pthread_kill(main, held)  # a real signal: it wakes a blocked wait

    threading.Thread(target=watch, name="dp-signal-after-import", daemon=True).start()


def deliver(signum: int, frame: FrameType | None = None) -> None:
    """Called by a signal handler (so on the main thread) with the handler's ``frame``:
    raise the signal's interrupt now, or hold it inside a :func:`deferred` section (until
    it ends) or an import (until the main thread leaves it). A second signal while one is
    held for an import is raised at once: the operator insists."""
    global _pending, _after_import
    if _depth:
        if _pending is None or signum != signal.SIGINT:  # a termination outranks a Ctrl-C
            _pending = signum
        return
    if _after_import is None and _importing(frame):
        _after_import = signum
        _redeliver_after_import(signum)
        return
    _after_import = None
    _act(signum)


@contextmanager
def deferred() -> Iterator[None]:
    """A section a termination signal does not split: one arriving inside it is raised
    when it ends (chained to the section's own error, if it raised one). Only the main
    thread's sections defer (signal handlers run there); elsewhere this does nothing."""
    global _depth
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _depth += 1
    try:
        yield
    except BaseException as err:
        _leave(err)
        raise
    _leave(None)


def _leave(cause: BaseException | None) -> None:
    """End a deferred section: the outermost one raises the signal held inside it."""
    global _depth, _pending
    _depth -= 1
    if not _depth and _pending is not None:
        signum, _pending = _pending, None
        _act(signum, cause)


@contextmanager
def temp_dir(dir: Path | None = None, prefix: str | None = None) -> Iterator[Path]:
    """A new temporary directory (``tempfile.mkdtemp``), removed when the block ends,
    however it ends: a termination signal that lands as it is created included. A signal
    that lands during the removal is raised once the directory is gone."""
    path: Path | None = None
    try:
        with deferred():
            path = Path(tempfile.mkdtemp(prefix=prefix, dir=dir))
        yield path
    finally:
        if path is not None:
            with deferred():
                shutil.rmtree(path, ignore_errors=True)
