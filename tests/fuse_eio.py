"""A FUSE passthrough that makes the kernel return EIO on reads and writes of chosen files.

    python tests/fuse_eio.py BACKING MOUNT CONTROL

mounts BACKING at MOUNT (foreground; ``fusermount -u MOUNT`` ends it). Every operation passes
through to BACKING, except that a ``read`` of a file whose name matches a ``read PATTERN``
line of the CONTROL file, or a ``write``/``create``/``rename``/``fsync`` matching a ``write
PATTERN`` line, fails with EIO: the reader (a store engine, through the kernel) gets a real
``OSError(EIO)`` from ``pread``, not an injected one. The control file is re-read when it
changes, so a test turns errors on and off while the store is in use. ``direct_io``
keeps the page cache out of the way: every read reaches this process.

Why fusepy: a small, long-kept ctypes binding of libfuse 2 (``libfuse2``); the fault matrix's
``store_eio`` row (tests/test_fault_matrix.py) runs this as a subprocess.
"""

from __future__ import annotations

import errno
import fnmatch
import os
import sys
import threading
from typing import Any

from fuse import FUSE, FuseOSError, Operations  # type: ignore[import-untyped]


class EioPassthrough(Operations):  # type: ignore[misc]
    """Passthrough of ``root``; EIO where the control file says so."""

    def __init__(self, root: str, control: str) -> None:
        self.root = os.path.realpath(root)
        self.control = control
        self._stamp: tuple[float, int] | None = None
        self._rules: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    # -- the fault ------------------------------------------------------------------------
    def _failing(self, op: str, path: str) -> bool:
        try:
            st = os.stat(self.control)
            stamp = (st.st_mtime, st.st_size)
        except FileNotFoundError:
            stamp = None
        with self._lock:
            if stamp != self._stamp:
                self._stamp = stamp
                rules: list[tuple[str, str]] = []
                if stamp is not None:
                    with open(self.control, encoding="utf-8") as f:
                        for line in f:
                            kind, _, pattern = line.strip().partition(" ")
                            if kind in ("read", "write") and pattern:
                                rules.append((kind, pattern))
                self._rules = rules
            rules = self._rules
        name = os.path.basename(path)
        return any(kind == op and fnmatch.fnmatch(name, pattern) for kind, pattern in rules)

    def _eio(self, op: str, path: str) -> None:
        if self._failing(op, path):
            raise FuseOSError(errno.EIO)

    def _full(self, path: str) -> str:
        return os.path.join(self.root, path.lstrip("/"))

    # -- passthrough ----------------------------------------------------------------------
    def access(self, path: str, mode: int) -> None:
        if not os.access(self._full(path), mode):
            raise FuseOSError(errno.EACCES)

    def chmod(self, path: str, mode: int) -> None:
        os.chmod(self._full(path), mode)

    def chown(self, path: str, uid: int, gid: int) -> None:
        os.chown(self._full(path), uid, gid)

    def getattr(self, path: str, fh: Any = None) -> dict[str, Any]:
        st = os.lstat(self._full(path))
        return {key: getattr(st, key) for key in (
            "st_atime", "st_ctime", "st_gid", "st_mode", "st_mtime", "st_nlink", "st_size",
            "st_uid")}

    def readdir(self, path: str, fh: Any) -> list[str]:
        return [".", "..", *os.listdir(self._full(path))]

    def readlink(self, path: str) -> str:
        return os.readlink(self._full(path))

    def mknod(self, path: str, mode: int, dev: int) -> None:
        os.mknod(self._full(path), mode, dev)

    def rmdir(self, path: str) -> None:
        os.rmdir(self._full(path))

    def mkdir(self, path: str, mode: int) -> None:
        os.mkdir(self._full(path), mode)

    def statfs(self, path: str) -> dict[str, Any]:
        sv = os.statvfs(self._full(path))
        return {key: getattr(sv, key) for key in (
            "f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files",
            "f_flag", "f_frsize", "f_namemax")}

    def unlink(self, path: str) -> None:
        os.unlink(self._full(path))

    def symlink(self, name: str, target: str) -> None:
        os.symlink(target, self._full(name))

    def rename(self, old: str, new: str) -> None:
        self._eio("write", new)
        os.rename(self._full(old), self._full(new))

    def link(self, target: str, name: str) -> None:
        os.link(self._full(name), self._full(target))

    def utimens(self, path: str, times: Any = None) -> None:
        os.utime(self._full(path), times)

    def open(self, path: str, flags: int) -> int:
        return os.open(self._full(path), flags & ~getattr(os, "O_DIRECT", 0))

    def create(self, path: str, mode: int, fi: Any = None) -> int:
        self._eio("write", path)
        return os.open(self._full(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)

    def read(self, path: str, length: int, offset: int, fh: int) -> bytes:
        self._eio("read", path)
        return os.pread(fh, length, offset)

    def write(self, path: str, buf: bytes, offset: int, fh: int) -> int:
        self._eio("write", path)
        return os.pwrite(fh, buf, offset)

    def truncate(self, path: str, length: int, fh: Any = None) -> None:
        self._eio("write", path)
        with open(self._full(path), "r+b") as f:
            f.truncate(length)

    def flush(self, path: str, fh: int) -> None:
        return None

    def release(self, path: str, fh: int) -> None:
        os.close(fh)

    def fsync(self, path: str, fdatasync: int, fh: int) -> None:
        self._eio("write", path)
        os.fsync(fh)


def main(argv: list[str]) -> int:
    backing, mount, control = argv
    FUSE(EioPassthrough(backing, control), mount, foreground=True, nothreads=False,
         direct_io=True, attr_timeout=0, entry_timeout=0)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
