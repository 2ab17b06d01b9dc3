"""Typed storage errors: a corrupt block is never data, it is one of these.

A *missing* block is not an error (stores return ``None`` / the loader reports a miss).
Corruption is: the store moves the file to ``quarantine/`` and raises, the loader turns it
into a miss (the engine recomputes) and counts it in
``dualpath_storage_corrupt_blocks_total{reason}``.
"""

from __future__ import annotations

import errno

from dualpath_cli.errors import DualPathError, UsageError

__all__ = [
    "StorageError",
    "StorageUsageError",
    "CorruptBlockError",
    "ChecksumMismatch",
    "TruncatedBlock",
    "ForeignHeader",
    "CapacityError",
    "WriteRefused",
    "WRITE_REFUSALS",
    "write_refusal_of",
]

#: Why a store refused a block write (the ``reason`` label of
#: ``dualpath_storage_write_errors_total``): full (ENOSPC, EDQUOT, or a block larger than
#: the store's capacity), read_only (EROFS), failed (any other error: EIO...).
WRITE_REFUSALS: tuple[str, ...] = ("full", "read_only", "failed")
_BY_ERRNO = {errno.ENOSPC: "full", errno.EDQUOT: "full", errno.EROFS: "read_only"}


class StorageError(DualPathError):
    """A store could not do what was asked (I/O failure, bad root)."""


class StorageUsageError(UsageError):
    """A bad storage argument (unknown codec, bad shape, unusable root): exit 2."""


class CorruptBlockError(StorageError):
    """A block file exists but cannot be trusted. ``reason`` labels the metric."""

    reason = "corrupt"

    def __init__(self, path: str, detail: str) -> None:
        super().__init__(f"{path}: {self.reason.replace('_', ' ')}: {detail}")
        self.path = path
        self.detail = detail


class ChecksumMismatch(CorruptBlockError):
    """Payload (or header) bytes do not match the stored checksum."""

    reason = "checksum"


class TruncatedBlock(CorruptBlockError):
    """The file is shorter than its header says."""

    reason = "truncated"


class ForeignHeader(CorruptBlockError):
    """Not a dualpath block (bad magic or version) or a block stored under another key."""

    reason = "foreign_header"


class CapacityError(StorageError):
    """A block is larger than the store's whole capacity."""


class WriteRefused(StorageError):
    """The store could not write a block: the file system said ``errno`` (no temp file is
    left behind). ``reason`` is one of :data:`WRITE_REFUSALS`."""

    def __init__(self, path: str, err: int | None, strerror: str | None) -> None:
        super().__init__(f"{path}: cannot write block ({strerror or 'failed'})")
        self.path = path
        self.errno = err
        self.reason = _BY_ERRNO.get(err or 0, "failed")


def write_refusal_of(err: BaseException) -> str:
    """Why a write failed, as :data:`WRITE_REFUSALS` names it."""
    if isinstance(err, WriteRefused):
        return err.reason
    if isinstance(err, CapacityError):
        return "full"
    return _BY_ERRNO.get(getattr(err, "errno", None) or 0, "failed")
