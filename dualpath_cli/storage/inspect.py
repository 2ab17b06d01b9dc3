"""Whole-store reports behind ``dualpath storage inspect`` and ``storage verify``.

``inspect`` reads only headers (4 KiB per block) to count blocks and bytes per namespace and
lists the hottest blocks from the persisted access counts; ``verify`` reads every block in
full, checks both checksums, and quarantines what fails.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from dualpath_cli.storage.buffers import BufferPool
from dualpath_cli.storage.errors import CorruptBlockError
from dualpath_cli.storage.header import HEADER_SIZE, unpack_header
from dualpath_cli.storage.posix import PosixStore
from dualpath_cli.storage.store import ReadOp

__all__ = ["NamespaceStats", "StoreReport", "VerifyReport", "inspect_store", "verify_store"]


@dataclass(slots=True)
class NamespaceStats:
    """Blocks and bytes of one namespace."""

    namespace: str
    blocks: int = 0
    bytes: int = 0


@dataclass(slots=True)
class StoreReport:
    """What ``storage inspect`` prints."""

    root: str
    blocks: int
    bytes: int
    capacity_bytes: int | None
    namespaces: list[NamespaceStats]
    hottest: list[tuple[str, int]]
    unreadable_headers: int
    quarantined: int

    def to_dict(self) -> dict[str, object]:
        """Plain data for ``--json``."""
        return {
            "root": self.root, "blocks": self.blocks, "bytes": self.bytes,
            "capacity_bytes": self.capacity_bytes,
            "namespaces": [{"namespace": n.namespace, "blocks": n.blocks, "bytes": n.bytes}
                           for n in self.namespaces],
            "hottest": [{"key": k, "reads": n} for k, n in self.hottest],
            "unreadable_headers": self.unreadable_headers, "quarantined": self.quarantined,
        }


@dataclass(slots=True)
class VerifyReport:
    """What ``storage verify`` found."""

    root: str
    checked: int = 0
    ok: int = 0
    corrupt: list[dict[str, str]] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:
        """Plain data for ``--json``."""
        return {"root": self.root, "checked": self.checked, "ok": self.ok,
                "corrupt": self.corrupt}


def inspect_store(store: PosixStore, top: int = 10) -> StoreReport:
    """Count blocks and bytes per namespace (headers only) and list the hottest blocks."""
    per_ns: dict[str, NamespaceStats] = {}
    blocks = total = unreadable = 0
    for key in store.keys():
        path = str(store.path(key))
        try:
            with open(path, "rb") as fh:
                head = fh.read(HEADER_SIZE)
                size = os.fstat(fh.fileno()).st_size
        except FileNotFoundError:
            continue
        blocks += 1
        total += size
        try:
            header = unpack_header(head, path, expected_key=key)
        except CorruptBlockError:
            unreadable += 1
            continue
        stats = per_ns.setdefault(header.namespace, NamespaceStats(header.namespace))
        stats.blocks += 1
        stats.bytes += size
    counts = store.access_counts()
    hottest = sorted(((k.hex, n) for k, n in counts.items()), key=lambda kv: (-kv[1], kv[0]))
    return StoreReport(str(store.root), blocks, total, store.capacity_bytes,
                       sorted(per_ns.values(), key=lambda s: -s.bytes), hottest[:top],
                       unreadable, len(store.quarantined()))


def verify_store(store: PosixStore, batch: int = 64) -> VerifyReport:
    """Read and check every block; corrupt ones are quarantined and listed."""
    report = VerifyReport(str(store.root))
    pool = BufferPool()
    keys = list(store.keys())
    for start in range(0, len(keys), batch):
        ops = [ReadOp(k) for k in keys[start:start + batch]]
        store.read_batch(ops, pool)
        for op in ops:
            if op.missing and op.error is None:
                continue  # deleted meanwhile
            report.checked += 1
            if op.error is not None:
                report.corrupt.append({"key": op.key.hex, "reason": op.error.reason,
                                       "detail": op.error.detail})
            else:
                report.ok += 1
            if op.buffer is not None:
                op.buffer.release()
    return report
