"""Atomic file writes: a reader sees the old file or the new one, never half of one.

Every writer of a user-visible file (config init, traces, store metadata) goes through here:
the text goes to a uniquely named temp file in the same directory (so concurrent writers,
threads or processes, never share one), is optionally fsynced, then ``os.replace``-d over the
target. On any failure the temp file is removed and the error propagates unchanged.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TextIO

__all__ = ["atomic_write_text", "atomic_write_lines"]


def _atomic_write(path: str | os.PathLike[str], write: Callable[[TextIO], object], mode: int,
                  fsync: bool) -> None:
    target = Path(path)
    directory = target.parent if str(target.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            write(handle)
            handle.flush()
            if fsync:
                os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def atomic_write_text(path: str | os.PathLike[str], text: str, *, mode: int = 0o644,
                      fsync: bool = True) -> None:
    """Write ``text`` to ``path`` atomically.

    Args:
        path: the target file; its directory must exist.
        text: the whole content.
        mode: permissions of the new file (mkstemp alone would leave 0600).
        fsync: flush the data to stable storage before the rename.

    Raises:
        OSError: the directory is missing or not writable, or the write failed.
    """
    _atomic_write(path, lambda handle: handle.write(text), mode, fsync)


def atomic_write_lines(path: str | os.PathLike[str], lines: Iterable[str], *,
                       mode: int = 0o644, fsync: bool = True) -> None:
    """Write ``lines``, each followed by a newline, to ``path`` atomically (as above)."""

    def write(handle: TextIO) -> None:
        for line in lines:
            handle.write(line)
            handle.write("\n")

    _atomic_write(path, write, mode, fsync)
