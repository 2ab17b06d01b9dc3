"""Warm-up (seed 8.3, cold start): read stored KV blocks into a loader's DRAM cache,
progressively and under a bandwidth cap of its own.

Why: after a restart every loader's DRAM cache is empty, so the first requests that start
with a common prompt (a system prompt, an agent's tool preamble) all cross the storage NIC
at once. A warm-up reads those prefixes' blocks ahead, while the cluster serves.

How it keeps out of serving's way:

* its reads queue at the loader's prefetch priority, below every request's (a request that
  wants a block being warmed joins that read instead of queueing a second one);
* it submits one small chunk at a time (about ``chunk_s`` of its cap) and waits for the
  chunk, so at most one chunk of warm reads ever sits in the node's read queue, the read_q
  the scheduler compares with alpha;
* its bytes are paced by a :class:`~dualpath_cli.storage.shaper.TokenBucket` at
  ``rate_bps``: chunk ``k`` is submitted only once the bytes of chunks ``0..k-1`` fit in
  ``rate_bps`` x the time since the start (:attr:`Warmer.submits` records it, so the cap is
  checked on the limiter's accounting, not on a wall clock). The node's storage-NIC shaper
  still paces the reads themselves, so warm bytes count against the NIC like any read.

The engine runs one :class:`Warmer` per ``warm`` wire message (:class:`Warm`); ``dualpath
storage warm`` runs one against a store directory.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

from dualpath_cli.core.layout import BlockKey
from dualpath_cli.storage.loader import StorageLoader
from dualpath_cli.storage.shaper import TokenBucket
from dualpath_cli.telemetry.registry import MetricsRegistry

__all__ = ["Warm", "WarmProgress", "Warmer", "MAX_CHUNK_BLOCKS"]

#: Most blocks one chunk submits (a chunk's reads sit in the node's read queue together).
MAX_CHUNK_BLOCKS = 64


@dataclass(frozen=True, slots=True)
class Warm:
    """Warm this engine's DRAM cache with ``keys`` (hex) at ``rate_bps`` at most (the wire
    kind ``warm``); no keys stops a warm-up in progress."""

    KIND: ClassVar[str] = "warm"
    keys: tuple[str, ...]
    rate_bps: float


@dataclass(frozen=True, slots=True)
class WarmProgress:
    """Where one warm-up stands.

    Attributes:
        state: ``running``, ``done`` or ``stopped``.
        blocks: blocks it was asked to warm.
        done: blocks handled so far (read, already cached, or missing).
        read: blocks read from the store into the cache.
        cached: blocks that were already in the cache.
        missing: blocks the store did not deliver (gone, or corrupt and quarantined).
        bytes: block-file bytes read.
        elapsed_s: seconds since it started (until it ended, once ended).
        rate_bps: its cap.
    """

    state: str
    blocks: int
    done: int
    read: int
    cached: int
    missing: int
    bytes: int
    elapsed_s: float
    rate_bps: float

    @property
    def remaining(self) -> int:
        """Blocks not handled yet."""
        return self.blocks - self.done

    def to_dict(self) -> dict[str, float | int | str]:
        """JSON form."""
        return {"state": self.state, "blocks": self.blocks, "done": self.done,
                "remaining": self.remaining, "read": self.read, "cached": self.cached,
                "missing": self.missing, "bytes": self.bytes,
                "elapsed_s": round(self.elapsed_s, 6), "rate_bps": self.rate_bps}


class Warmer:
    """Reads ``keys`` into ``loader``'s DRAM cache in order, at ``rate_bps`` at most.

    Args:
        loader: the loader whose cache to warm (it must have one).
        keys: blocks to warm, in order (the most valuable first: it is progressive).
        rate_bps: the warm-up's bandwidth cap, bytes/s (> 0).
        block_nbytes: expected bytes of one block file (sizes the chunks).
        chunk_s: seconds of the cap one chunk is worth (at least one block).
        registry: where ``dualpath_storage_warm_bytes_total`` and
            ``dualpath_storage_warm_blocks_remaining`` go (default: none).
        clock, sleep: injectable time (tests use a fake clock; sleeps are interruptible by
            :meth:`stop` when left at their default).
    """

    def __init__(self, loader: StorageLoader, keys: Sequence[BlockKey], rate_bps: float, *,
                 block_nbytes: int, chunk_s: float = 0.1,
                 registry: MetricsRegistry | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] | None = None) -> None:
        if not rate_bps > 0:
            raise ValueError(f"warm-up rate must be > 0 bytes/s, got {rate_bps!r}")
        if block_nbytes < 1:
            raise ValueError(f"block_nbytes must be >= 1, got {block_nbytes}")
        if loader.cache.capacity_bytes <= 0:
            raise ValueError("the loader has no DRAM cache: nothing to warm into")
        self.loader = loader
        self.keys = list(keys)
        self.rate_bps = float(rate_bps)
        self.clock = clock
        self._stop = threading.Event()
        self.bucket = TokenBucket(self.rate_bps, 0, clock,
                                  sleep if sleep is not None else self._interruptible)
        self.chunk = max(1, min(MAX_CHUNK_BLOCKS, int(self.rate_bps * chunk_s // block_nbytes)))
        #: (time chunk k was submitted, bytes read by chunks 0..k-1): the limiter's accounting
        self.submits: list[tuple[float, int]] = []
        self._lock = threading.Lock()
        self._state = "running"
        self._done = self._read = self._cached = self._missing = self._bytes = 0
        self._t0: float | None = None
        self._t1: float | None = None
        self._thread: threading.Thread | None = None
        self._m_bytes = self._m_left = None
        if registry is not None:
            node = loader.node
            self._m_bytes = registry.counter("dualpath_storage_warm_bytes_total", node=node)
            self._m_left = registry.gauge("dualpath_storage_warm_blocks_remaining", node=node)
            self._m_left.set(len(self.keys))

    def _interruptible(self, seconds: float) -> None:
        """The limiter's sleep: returns early when :meth:`stop` is called."""
        self._stop.wait(seconds)

    # -- control --------------------------------------------------------------------------
    def start(self) -> Warmer:
        """Run in a daemon thread; returns self."""
        self._thread = threading.Thread(target=self.run, daemon=True,
                                        name=f"dp-warm-{self.loader.node}")
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop after the chunk in hand (its reads are cancelled) and wait for the thread."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def wait(self, timeout: float | None = None) -> WarmProgress:
        """Wait for the thread to end (``TimeoutError`` after ``timeout`` seconds)."""
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise TimeoutError(f"warm-up not done after {timeout}s")
        return self.progress()

    def progress(self) -> WarmProgress:
        """A snapshot of where it stands."""
        with self._lock:
            now = self._t1 if self._t1 is not None else self.clock()
            elapsed = 0.0 if self._t0 is None else max(0.0, now - self._t0)
            return WarmProgress(self._state, len(self.keys), self._done, self._read,
                                self._cached, self._missing, self._bytes, elapsed,
                                self.rate_bps)

    # -- the work -------------------------------------------------------------------------
    def run(self) -> WarmProgress:
        """Warm every key (or until stopped); returns the final progress."""
        with self._lock:
            self._t0 = self.clock()
        try:
            for start in range(0, len(self.keys), self.chunk):
                if self._stop.is_set():
                    break
                chunk = self.keys[start:start + self.chunk]
                submitted = self.clock()
                with self._lock:
                    self.submits.append((submitted, self._bytes))
                nbytes = self._warm_chunk(chunk)
                if nbytes is None:  # stopped while its reads were in flight
                    break
                # chunk k+1 waits until chunks 0..k fit under the cap since the start
                self.bucket.wait_until(self.bucket.reserve(nbytes, submitted))
        finally:
            with self._lock:
                self._state = "done" if self._done == len(self.keys) else "stopped"
                self._t1 = self.clock()
        return self.progress()

    def _warm_chunk(self, chunk: list[BlockKey]) -> int | None:
        """Read one chunk into the cache; its bytes read (None when stopped meanwhile)."""
        try:
            ticket = self.loader.warm(chunk)
        except RuntimeError:  # the loader closed under us (the engine is stopping)
            self._stop.set()
            return None
        while True:
            try:
                result = ticket.wait(0.25)
                break
            except TimeoutError:
                if self._stop.is_set():
                    ticket.cancel()
                    return None
        read = cached = missing = nbytes = 0
        for block in result.blocks:
            if block is None:
                missing += 1
            elif block.tier == "dram":
                cached += 1
            else:
                read += 1
                nbytes += block.header.file_nbytes
        result.release()
        with self._lock:
            self._done += len(chunk)
            self._read += read
            self._cached += cached
            self._missing += missing
            self._bytes += nbytes
            left = len(self.keys) - self._done
        if self._m_bytes is not None and self._m_left is not None:
            if nbytes:
                self._m_bytes.inc(nbytes)
            self._m_left.set(left)
        return nbytes
