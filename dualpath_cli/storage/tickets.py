"""What a loader hands back: a load's ticket and result, the read queue's size, and why a
block was not served."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from dualpath_cli.core.layout import BlockKey
from dualpath_cli.storage.block import LoadedBlock
from dualpath_cli.storage.store import ReadOp

__all__ = ["LoadTicket", "LoadResult", "ReadQueue", "MISS_REASONS", "miss_reason_of"]

log = logging.getLogger(__name__)

#: Why a KV block was not served (the ``reason`` label of ``dualpath_kv_miss_blocks_total``).
MISS_REASONS: tuple[str, ...] = ("never_stored", "prefix_diverged", "evicted", "quarantined",
                                 "read_failed", "timed_out", "cancelled")

def miss_reason_of(op: ReadOp, closing: bool = False) -> str:
    """Why a store read of ``op`` delivered nothing: corrupt (quarantined), an I/O error
    (timed out or failed), the loader closing (cancelled), else the block was gone from the
    store when read (evicted or collected after the lookup found it)."""
    if op.error is not None:
        return "quarantined"
    if op.io_error is not None:
        return "timed_out" if "timed out" in op.io_error.lower() else "read_failed"
    return "cancelled" if closing else "evicted"


@dataclass(frozen=True, slots=True)
class ReadQueue:
    """Work queued or in flight on a node's loader."""

    blocks: int
    bytes: int
    tokens: int
    in_flight: int


@dataclass(slots=True)
class LoadResult:
    """Outcome of one ticket: ``blocks[i]`` is the block of ``keys[i]`` or None (a miss)."""

    keys: list[BlockKey]
    blocks: list[LoadedBlock | None]
    dram_hits: int = 0
    store_hits: int = 0
    misses: int = 0
    corrupt: int = 0
    cancelled: bool = False
    reasons: dict[int, str] = field(default_factory=dict)  # index -> why it is None
    dram_misses: dict[str, int] = field(default_factory=dict)  # DRAM-buffer misses by reason

    def why(self, index: int) -> str:
        """The miss reason of block ``index`` (one of :data:`MISS_REASONS`), e.g. for the
        engine's read-failed report; a delivered block has none (``""``)."""
        if index < len(self.blocks) and self.blocks[index] is not None:
            return ""
        return self.reasons.get(index, "cancelled" if self.cancelled else "evicted")

    @property
    def hit_prefix(self) -> int:
        """Leading blocks present: the usable cached prefix."""
        n = 0
        for block in self.blocks:
            if block is None:
                break
            n += 1
        return n

    def release(self) -> None:
        """Release every block's buffer."""
        for block in self.blocks:
            if block is not None:
                block.release()


class LoadTicket:
    """Handle of a submitted load: wait on it, cancel it, or attach a callback.

    The loader that issued it settles its blocks (:meth:`settle`, :meth:`claim`, under
    ``lock``, the loader's) and then calls :meth:`finish` outside the lock.
    """

    def __init__(self, keys: list[BlockKey], lock: threading.Lock,
                 cancel: Callable[[LoadTicket], int]) -> None:
        self._lock = lock
        self._cancel = cancel
        self.result = LoadResult(keys, [None] * len(keys))
        self._remaining = len(keys)
        self._completed = False  # set under the loader lock by whoever completes it
        self._event = threading.Event()
        self._callbacks: list[Callable[[LoadResult], None]] = []

    @property
    def remaining(self) -> int:
        """Blocks not yet settled (delivered or missed)."""
        return self._remaining

    def settle(self) -> bool:
        """One of its blocks was delivered or missed (loader lock held); True when it was
        the last: the ticket is then complete, and the caller must :meth:`finish` it."""
        self._remaining -= 1
        if self._remaining == 0:
            self._completed = True
            return True
        return False

    def claim(self) -> bool:
        """Take the completion of this ticket (loader lock held): False when it is already
        complete (its last block settled, or it was cancelled)."""
        if self._completed:
            return False
        self._completed = True
        return True

    def done(self) -> bool:
        """True once every block completed (or the ticket was cancelled)."""
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> LoadResult:
        """Block until done; ``TimeoutError`` after ``timeout`` seconds."""
        if not self._event.wait(timeout):
            raise TimeoutError(f"load of {len(self.result.keys)} blocks not done after "
                               f"{timeout}s")
        return self.result

    def cancel(self) -> int:
        """Drop queued reads no one else waits for; returns how many. Delivered blocks are
        released and the result reports ``cancelled``."""
        return self._cancel(self)

    def add_done_callback(self, fn: Callable[[LoadResult], None]) -> None:
        """Call ``fn(result)`` when done (at once if already done), in the completing thread."""
        with self._lock:
            if not self._event.is_set():
                self._callbacks.append(fn)
                return
        fn(self.result)

    def finish(self) -> None:
        """Wake the waiters and run the callbacks (once complete, outside the loader lock)."""
        self._event.set()
        for fn in self._callbacks:
            try:
                fn(self.result)
            except Exception:  # a callback must not kill a reader thread
                log.exception("load callback failed")
