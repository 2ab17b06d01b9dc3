"""Standard output that cannot be written (full disk, closed pipe, I/O error): one line, exit 1.

Why one place: every command prints through ``sys.stdout`` (JSON, tables, help, the
version), and the write that fails may be the last flush at interpreter exit, after the
command returned. Both console scripts (``dualpath``, ``dualpath-monitor``) run their
command through :func:`guard_stdout`, which flushes inside the guard and turns ``ENOSPC``,
``EPIPE`` and ``EIO`` into ``error: cannot write standard output: ...`` on stderr and exit 1,
instead of a traceback, Python's ``Exception ignored`` and exit 120, or Click's silent exit 1
on a closed pipe.
"""

from __future__ import annotations

import errno
import functools
import os
import sys
from collections.abc import Callable
from typing import ParamSpec

__all__ = ["LOST_OUTPUT_ERRNOS", "EXIT_LOST_OUTPUT", "guard_stdout", "is_lost_output"]

#: The write errors that mean the output went nowhere: a full device, a closed reader, a
#: failing device.
LOST_OUTPUT_ERRNOS = frozenset({errno.ENOSPC, errno.EPIPE, errno.EIO})

#: The exit code of a run whose output was lost (the house's generic failure).
EXIT_LOST_OUTPUT = 1

_P = ParamSpec("_P")


def is_lost_output(err: BaseException) -> bool:
    """Whether ``err`` (or what it was raised from) is a lost write to an unnamed stream.

    A named file's error carries its ``filename`` and is the command's own to report.
    """
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in LOST_OUTPUT_ERRNOS and (
                seen.filename is None):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _reason(err: BaseException) -> str:
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in LOST_OUTPUT_ERRNOS:
            return seen.strerror or errno.errorcode.get(seen.errno or 0, "I/O error")
        seen = seen.__cause__ or seen.__context__
    return str(err)


def _discard_stdout() -> None:
    """Point file descriptor 1 at /dev/null so the interpreter's last flush of what is still
    buffered succeeds (else Python prints ``Exception ignored`` and exits 120)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # stdout replaced (tests) or closed
        pass


def _say(message: str) -> None:
    from dualpath_cli.cli.output import fail

    try:
        fail(message)
    except (OSError, ValueError):  # stderr lost too: the exit code still says it
        pass


def guard_stdout(main: Callable[_P, int]) -> Callable[_P, int]:
    """``main`` that flushes stdout before returning and reports a lost write in one line."""

    @functools.wraps(main)
    def guarded(*args: _P.args, **kwargs: _P.kwargs) -> int:
        try:
            code = main(*args, **kwargs)
            sys.stdout.flush()
        except (OSError, SystemExit) as err:  # Click turns EPIPE into a bare exit 1
            if isinstance(err, SystemExit) and err.code not in (1, None):
                raise
            if not is_lost_output(err):
                raise
            _discard_stdout()
            _say(f"cannot write standard output: {_reason(err)}")
            return EXIT_LOST_OUTPUT
        return code

    return guarded
