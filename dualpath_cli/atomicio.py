"""Atomic file writes: a reader sees the old file or the new one, never half of one.

Every writer of a user-visible file (config init, traces, store metadata, PNG charts) goes
through here: the content goes to a uniquely named temp file in the same directory (so
concurrent writers, threads or processes, never share one), is optionally fsynced, then
``os.replace``-d over the target. On any failure the temp file is removed and the error
propagates unchanged. Text is written as UTF-8 with ``\\n`` line ends.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

__all__ = ["atomic_write_text", "atomic_write_lines", "atomic_write_bytes"]


def _atomic_write(path: str | os.PathLike[str], chunks: Iterable[bytes], mode: int,
                  fsync: bool) -> None:
    """The one implementation: ``chunks`` (consumed lazily) become the new ``path``."""
    target = Path(path)
    directory = target.parent if str(target.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            for chunk in chunks:
                handle.write(chunk)
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


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, *, mode: int = 0o644,
                       fsync: bool = True) -> None:
    """Write ``data`` to ``path`` atomically (binary files such as PNG charts).

    Args:
        path: the target file; its directory must exist.
        data: the whole content.
        mode: permissions of the new file (mkstemp alone would leave 0600).
        fsync: flush the data to stable storage before the rename.

    Raises:
        OSError: the directory is missing or not writable, or the write failed.
    """
    _atomic_write(path, (data,), mode, fsync)


def atomic_write_text(path: str | os.PathLike[str], text: str, *, mode: int = 0o644,
                      fsync: bool = True) -> None:
    """Write ``text`` to ``path`` atomically, UTF-8 encoded (arguments as above)."""
    _atomic_write(path, (text.encode("utf-8"),), mode, fsync)


def atomic_write_lines(path: str | os.PathLike[str], lines: Iterable[str], *,
                       mode: int = 0o644, fsync: bool = True) -> None:
    """Write ``lines``, each followed by a newline, to ``path`` atomically (as above).

    ``lines`` is consumed while writing, so a generator never has to fit in memory; if it
    raises, the old file stays.
    """

    def encoded() -> Iterator[bytes]:
        for line in lines:
            yield f"{line}\n".encode()

    _atomic_write(path, encoded(), mode, fsync)
