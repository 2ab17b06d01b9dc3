"""The emulated GPU's "HBM": a paged block pool with a real allocator.

Why paged: decode engines hold the KV of many requests whose lengths differ; a paged pool
(like vLLM's) never needs one contiguous region per request, but free space still breaks
into runs as requests come and go. Operators troubleshoot that with the numbers tracked
here: used and free blocks, the largest free run and a fragmentation score, and they can
``compact`` the pool (moving live blocks to the front, data included).

The pool owns real bytes: one ``uint8`` array of shape ``[n_blocks, n_layers, block_tokens,
bytes_per_token_layer]`` so that a block is a Full Block (layer-major) and ``[:, l]`` gives
its Layer Block for layer ``l``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from dualpath_cli.errors import DualPathError

__all__ = ["HbmExhausted", "HbmStats", "HbmPool", "Compact"]


class HbmExhausted(DualPathError):
    """Not enough free HBM blocks for an allocation."""


@dataclass(frozen=True, slots=True)
class HbmStats:
    """A snapshot of the pool for metrics and diagnose."""

    capacity_blocks: int
    used_blocks: int
    free_blocks: int
    largest_free_run: int
    fragmentation: float  # 0 = all free space is one run, ->1 = scattered single blocks

    @property
    def usage(self) -> float:
        """Used fraction 0..1."""
        return self.used_blocks / self.capacity_blocks if self.capacity_blocks else 0.0


@dataclass(frozen=True, slots=True)
class Compact:
    """Ask engine ``engine`` to compact its HBM pool now (the wire kind ``compact``).

    Why a message: compaction is the remedy ``dualpath diagnose hbm-frag --fix`` applies
    (``POST /api/v1/engines/{id}/compact``); the pool lives in the engine's process.
    """

    KIND: ClassVar[str] = "compact"
    engine: int


def fragmentation_score(free_blocks: int, largest_free_run: int) -> float:
    """``1 - largest_run / free``: 0 when free space is contiguous (or empty)."""
    if free_blocks <= 0:
        return 0.0
    return 1.0 - largest_free_run / free_blocks


class HbmPool:
    """A thread-safe paged KV pool of ``capacity_blocks`` blocks of ``block_tokens`` tokens.

    Args:
        capacity_blocks: number of blocks (HBM capacity / block bytes).
        block_tokens: tokens per block (the KV block size, 64 in the paper).
        n_layers: model layers (blocks are layer-major Full Blocks).
        bytes_per_token_layer: KV bytes per token per layer.
        with_data: allocate the backing byte array (False: bookkeeping only, for tests).
    """

    def __init__(self, capacity_blocks: int, block_tokens: int, n_layers: int = 1,
                 bytes_per_token_layer: int = 1, *, with_data: bool = True) -> None:
        if capacity_blocks <= 0 or block_tokens <= 0:
            raise ValueError("HBM pool needs a positive capacity and block size")
        self.capacity_blocks = capacity_blocks
        self.block_tokens = block_tokens
        self._owner: list[int | None] = [None] * capacity_blocks
        self._by_owner: dict[int, list[int]] = {}
        self._lock = threading.Lock()
        self.data: np.ndarray | None = None
        if with_data:
            self.data = np.zeros((capacity_blocks, n_layers, block_tokens,
                                  bytes_per_token_layer), dtype=np.uint8)

    # -- allocation ---------------------------------------------------------------------
    def blocks_for_tokens(self, tokens: int) -> int:
        """Blocks needed to hold ``tokens`` tokens."""
        return -(-max(tokens, 0) // self.block_tokens)

    def allocate(self, owner: int, n_blocks: int) -> list[int]:
        """Give ``owner`` ``n_blocks`` more blocks (first fit, lowest ids first).

        Raises:
            HbmExhausted: fewer than ``n_blocks`` blocks are free (nothing is allocated).
        """
        with self._lock:
            free = [i for i, o in enumerate(self._owner) if o is None]
            if n_blocks > len(free):
                raise HbmExhausted(
                    f"HBM: need {n_blocks} blocks, {len(free)} of {self.capacity_blocks} free")
            got = free[:n_blocks]
            for i in got:
                self._owner[i] = owner
            self._by_owner.setdefault(owner, []).extend(got)
            return list(got)

    def free(self, owner: int) -> int:
        """Release every block of ``owner``; returns how many were freed."""
        with self._lock:
            blocks = self._by_owner.pop(owner, [])
            for i in blocks:
                self._owner[i] = None
            return len(blocks)

    def pin_stride(self, owner: int, stride: int) -> int:
        """Give ``owner`` every ``stride``-th free block (fault injection: fragments the
        free space into runs of ``stride - 1``); returns how many blocks it took."""
        with self._lock:
            free = [i for i, o in enumerate(self._owner) if o is None]
            got = free[stride - 1::stride] if stride > 1 else []
            for i in got:
                self._owner[i] = owner
            self._by_owner.setdefault(owner, []).extend(got)
            return len(got)

    def blocks_of(self, owner: int) -> list[int]:
        """The blocks of ``owner`` in allocation order (its logical block table)."""
        with self._lock:
            return list(self._by_owner.get(owner, []))

    def owners(self) -> list[int]:
        """Owners holding blocks."""
        with self._lock:
            return list(self._by_owner)

    # -- data, under the pool lock ------------------------------------------------------
    # Why here: compaction moves blocks (data included) while the engine's workers run, so
    # a block table looked up outside the lock could point at a block that moved meanwhile.
    # Every read and write of KV rows looks its table up and copies under the same lock.
    def write_rows(self, owner: int, layer: int, start: int, rows: np.ndarray) -> None:
        """Write packed KV ``rows`` for tokens ``start..`` of ``owner`` at ``layer``."""
        assert self.data is not None
        bt = self.block_tokens
        with self._lock:
            blocks = self._by_owner.get(owner, [])
            pos, row = start, 0
            while row < rows.shape[0]:
                b, off = divmod(pos, bt)
                n = min(bt - off, rows.shape[0] - row)
                self.data[blocks[b], layer, off:off + n] = rows[row:row + n]
                pos += n
                row += n

    def read_rows(self, owner: int, layer: int, n_tokens: int) -> np.ndarray:
        """A copy of ``owner``'s first ``n_tokens`` packed KV rows at ``layer``."""
        assert self.data is not None
        with self._lock:
            blocks = self._by_owner.get(owner, [])[: -(-n_tokens // self.block_tokens)]
            rows = self.data[blocks, layer]  # fancy indexing: a copy
        return rows.reshape(-1, rows.shape[-1])[:n_tokens]

    def copy_block(self, owner: int, index: int) -> np.ndarray:
        """A copy of ``owner``'s ``index``-th block (every layer)."""
        assert self.data is not None
        with self._lock:
            return self.data[self._by_owner[owner][index]].copy()

    # -- statistics ---------------------------------------------------------------------
    def stats(self) -> HbmStats:
        """Used/free blocks, the largest free run and the fragmentation score."""
        with self._lock:
            free = run = best = 0
            for o in self._owner:
                if o is None:
                    free += 1
                    run += 1
                    best = max(best, run)
                else:
                    run = 0
            return HbmStats(self.capacity_blocks, self.capacity_blocks - free, free, best,
                            fragmentation_score(free, best))

    @property
    def free_blocks(self) -> int:
        """Free blocks now."""
        return self.stats().free_blocks

    # -- compaction ---------------------------------------------------------------------
    def compact(self) -> dict[int, int]:
        """Move live blocks to the front (owner by owner, order kept), data included.

        Returns the moves as ``{old_block: new_block}`` (blocks that stayed are omitted).
        Afterwards all free space is one run, so the fragmentation score is 0.
        """
        with self._lock:
            moves: dict[int, int] = {}
            order = sorted(self._by_owner.items(), key=lambda kv: min(kv[1]))
            new_owner: list[int | None] = [None] * self.capacity_blocks
            new_by_owner: dict[int, list[int]] = {}
            nxt = 0
            for owner, blocks in order:
                table = []
                for old in blocks:
                    if old != nxt:
                        moves[old] = nxt
                    table.append(nxt)
                    new_owner[nxt] = owner
                    nxt += 1
                new_by_owner[owner] = table
            if self.data is not None and moves:
                src = np.fromiter(moves.keys(), dtype=np.int64)
                dst = np.fromiter(moves.values(), dtype=np.int64)
                self.data[dst] = self.data[src].copy()
            self._owner, self._by_owner = new_owner, new_by_owner
            return moves
