"""Atomic file writes: a reader sees the old file or the new one, never half of one.

Every writer of a user-visible file (config init, traces, store metadata, PNG charts) goes
through here: the content goes to a uniquely named temp file in the same directory (so
concurrent writers, threads or processes, never share one), is optionally fsynced, then
``os.replace``-d over the target. On any failure the temp file is removed and the error
propagates unchanged. Text is written as UTF-8 with ``\\n`` line ends.

What is not ours is never replaced: a target that exists and is not a regular file (a
device such as ``/dev/full``, a pipe, a socket, a directory) is refused with
:class:`NotRegularFileError`, since a rename would swap the node for a plain file. A symlink
is written *through*: the new content replaces the file the link points to (created in the
link target's directory), and the link stays a link.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

__all__ = ["atomic_write_text", "atomic_write_lines", "atomic_write_bytes",
           "NotRegularFileError", "write_target"]

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a named pipe"),
          (stat.S_ISSOCK, "a socket"))


class NotRegularFileError(OSError):
    """The target exists and is not a regular file; an atomic rename would replace it."""

    def __init__(self, path: Path, kind: str, message: str | None = None) -> None:
        super().__init__(errno.EINVAL, message or f"{kind}, not a regular file; refusing to "
                         "replace it", str(path))


def write_target(path: str | os.PathLike[str]) -> Path:
    """The file a write to ``path`` really replaces: symlinks followed, special files refused.

    Raises:
        NotRegularFileError: ``path`` (after links) is a directory, device, pipe or socket,
            or is empty (``""`` would mean the current directory) or holds a NUL byte.
    """
    if not str(path):
        raise NotRegularFileError(Path("."), "an empty path")
    if "\0" in str(path):  # os.stat and open raise ValueError, not OSError, on one
        raise NotRegularFileError(Path(str(path).replace("\0", "\\0")), "",
                                  "the path holds a NUL byte")
    target = Path(os.path.realpath(path))  # a dangling link resolves to where it points
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        return target
    except OSError:
        return target  # unreadable metadata: let the write itself report it
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in _KINDS if test(mode)), "a special file")
        raise NotRegularFileError(Path(path), kind)
    return target


def _atomic_write(path: str | os.PathLike[str], chunks: Iterable[bytes], mode: int,
                  fsync: bool) -> None:
    """The one implementation: ``chunks`` (consumed lazily) become the new ``path``."""
    target = write_target(path)
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
