"""A ring of the newest entries kept packed: compressed batches under a byte budget.

Why: the scheduler keeps its last 10,000 decisions and as many finished requests' timelines
for ``dualpath explain``, the API and recordings. Kept as objects (a dict of fields, its
inputs' dicts, lists and snapshots) they cost about 4.5 KB a turn, 45 MB of a launcher
that starts at 90 MB. Readers look at few of them, so the ring keeps the newest ``batch``
entries as they were given and packs each full batch into one zlib-compressed pickle (the
batch's repeated keys and strings are written once): about 50 bytes a decision at the
default configuration. An entry is unpacked when it is read, into objects equal to those
given (pickle round-trips every value exactly), so a reader's JSON is the same bytes.

Each entry has a ``seq`` (increasing in append order) and a ``key`` (a request id), kept
unpacked beside each batch (16 bytes an entry) so a reader finds what to unpack. The ring
shows the newest ``size`` entries; packed batches go, oldest first, once they hold none of
those or while the packed bytes exceed ``budget`` (then it shows fewer than ``size``).

Not thread-safe: its owner holds its own lock around every call.
"""

from __future__ import annotations

import array
import bisect
import pickle
import sys
import zlib
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["PackedRing", "BATCH"]

BATCH = 128
"""Entries packed together: fewer repeat keys and strings once compressed, and a reader of
one entry unpacks at most this many."""


@dataclass(frozen=True, slots=True)
class _Packed:
    """One packed batch: its entries' seqs and keys, and their values, pickled and
    compressed."""

    seqs: array.array[int]
    keys: array.array[int]
    blob: bytes

    @property
    def nbytes(self) -> int:
        return len(self.blob) + sys.getsizeof(self.seqs) + sys.getsizeof(self.keys)


class PackedRing:
    """The newest ``size`` entries (module doc).

    Args:
        size: entries shown (>= 1).
        budget: bytes the packed batches may hold (>= 1); the unpacked newest batch is
            not counted (at most ``batch`` entries).
        settle: turns an entry's value into what is packed (a plain, picklable value),
            called once when its batch is packed (a deferred part of it built then).
        batch: entries packed together.
    """

    def __init__(self, size: int, budget: int,
                 settle: Callable[[Any], Any] = lambda value: value,
                 batch: int = BATCH) -> None:
        if size < 1:
            raise ValueError(f"ring size must be >= 1, got {size}")
        if budget < 1:
            raise ValueError(f"ring byte budget must be >= 1, got {budget}")
        self.size = size
        self.budget = budget
        self._settle = settle
        self._batch = max(1, batch)
        self._packed: deque[_Packed] = deque()
        self._packed_n = 0  # entries in the packed batches
        self._packed_bytes = 0
        self._hot: list[tuple[int, int, Any]] = []  # (seq, key, value), oldest first
        self._cache: tuple[_Packed, list[Any]] | None = None  # a batch, its values

    def append(self, seq: int, key: int, value: Any) -> None:
        """Keep ``value`` as the newest entry (``seq`` above every kept one)."""
        self._hot.append((seq, key, value))
        if len(self._hot) >= self._batch:
            self._pack()

    def _pack(self) -> None:
        hot, self._hot = self._hot, []
        values = [self._settle(v) for _, _, v in hot]
        packed = _Packed(array.array("q", [e[0] for e in hot]),
                         array.array("q", [e[1] for e in hot]),
                         zlib.compress(pickle.dumps(values, pickle.HIGHEST_PROTOCOL), 1))
        self._packed.append(packed)
        self._packed_n += len(hot)
        self._packed_bytes += packed.nbytes
        while self._packed and (
                self._packed_bytes > self.budget
                or self._packed_n - len(self._packed[0].seqs) + len(self._hot) >= self.size):
            old = self._packed.popleft()
            self._packed_n -= len(old.seqs)
            self._packed_bytes -= old.nbytes

    def _values(self, packed: _Packed) -> list[Any]:
        """A batch's values, unpacked (the last batch unpacked is kept for the next read:
        a reader polling for new entries unpacks each batch once)."""
        if self._cache is not None and self._cache[0] is packed:
            return self._cache[1]
        values: list[Any] = pickle.loads(zlib.decompress(packed.blob))
        self._cache = (packed, values)
        return values

    def _first_shown(self) -> int:
        """How many of the oldest kept entries are not shown (beyond ``size``)."""
        return max(0, self._packed_n + len(self._hot) - self.size)

    def __len__(self) -> int:
        """Entries shown."""
        return min(self.size, self._packed_n + len(self._hot))

    @property
    def nbytes(self) -> int:
        """Bytes of the packed batches (what the budget bounds)."""
        return self._packed_bytes

    @property
    def first_seq(self) -> int | None:
        """The oldest shown entry's ``seq`` (``None`` when empty)."""
        for seq, _, _ in self._entries_after(None, keys=None):
            return seq
        return None

    def after(self, seq: int | None) -> Iterator[tuple[int, int, Any]]:
        """Shown entries ``(seq, key, value)`` with a ``seq`` above ``seq`` (all when
        ``None``), oldest first; a settled value when packed, as given when not."""
        return self._entries_after(seq, keys=None)

    def of_key(self, key: int) -> Iterator[tuple[int, int, Any]]:
        """Shown entries with ``key``, oldest first."""
        return self._entries_after(None, keys=key)

    def newest(self, key: int) -> tuple[int, int, Any] | None:
        """The newest shown entry with ``key`` (``None``: none shown)."""
        skip = self._first_shown()
        hot_from = max(0, skip - self._packed_n)
        for entry in reversed(self._hot[hot_from:]):
            if entry[1] == key:
                return entry
        start = self._packed_n
        for packed in reversed(self._packed):
            start -= len(packed.seqs)
            if key not in packed.keys:
                continue
            values = self._values(packed)
            for i in range(len(packed.keys) - 1, max(0, skip - start) - 1, -1):
                if packed.keys[i] == key:
                    return packed.seqs[i], key, values[i]
        return None

    def _entries_after(self, seq: int | None, keys: int | None
                       ) -> Iterator[tuple[int, int, Any]]:
        skip = self._first_shown()
        start = 0
        for packed in list(self._packed):
            n = len(packed.seqs)
            lo = max(0, skip - start)
            start += n
            if lo >= n or (seq is not None and packed.seqs[-1] <= seq) \
                    or (keys is not None and keys not in packed.keys):
                continue
            if seq is not None:
                lo = max(lo, bisect.bisect_right(packed.seqs, seq))
            values = self._values(packed)
            for i in range(lo, n):
                if keys is None or packed.keys[i] == keys:
                    yield packed.seqs[i], packed.keys[i], values[i]
        hot_from = max(0, skip - self._packed_n)
        for entry in list(self._hot[hot_from:]):
            if (seq is None or entry[0] > seq) and (keys is None or entry[1] == keys):
                yield entry
