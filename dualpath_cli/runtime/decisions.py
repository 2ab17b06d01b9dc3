"""The scheduler's decision log: a bounded ring of typed decisions plus counters kept apart.

Why a ring: a launched cluster runs for days and the log used to be a list that grew with
every turn (a leak in a daemon). The ring keeps the last ``size`` decisions, each numbered by
a ``seq`` that only grows, so a reader polls ``since(last_seq)`` and notices a gap when it
fell behind (the first returned ``seq`` is not ``last_seq + 1``). Counts by class and side
are kept independently of the ring, so they cover every decision since start. Each decision
may also be appended to a JSONL file (the ``decision_log`` option).

Why the ring keeps fields, not :class:`Decision` records: the scheduler records one per
dispatched turn (2,400 a second at the paper's 48P96D) and a reader looks at few of them,
so a record is built when it is read. Its ``inputs`` may likewise be a function that
builds the mapping from values captured at the decision (it is called once, when the
decision is first read, written to the file, or packed).

Why packed: kept as objects a decision cost about 3 KB (its fields' dict, its inputs'
snapshots), 30 MB of a launcher for the default 10,000. The ring
(:class:`~dualpath_cli.runtime.packed_ring.PackedRing`) packs each batch of 128 into one
compressed pickle, about 50 bytes a decision at the default configuration, and holds at
most ``budget`` bytes of them (``scheduler.decision_ring_bytes``): with inputs as large as a
1,152-engine group's it keeps fewer than ``size`` decisions rather than grow.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from pathlib import Path
from typing import IO, Any

from dualpath_cli.runtime.packed_ring import PackedRing
from dualpath_cli.telemetry.registry import Counter, MetricsRegistry
from dualpath_cli.telemetry.view import Decision, DecisionCounts

__all__ = ["PE_CLASSES", "DE_CLASSES", "SIDES", "DecisionLog", "RING_BYTES"]

PE_CLASSES: tuple[str, ...] = ("C1", "C2", "C3")
DE_CLASSES: tuple[str, ...] = ("normal", "high_token")
SIDES: tuple[str, ...] = ("pe", "de", "split")
RING_BYTES = 8 << 20
"""The ring's default byte budget (``scheduler.decision_ring_bytes``): 10,000 decisions
at up to about 800 bytes each, packed."""


class DecisionLog:
    """The last ``size`` decisions and counts of all of them.

    Args:
        size: how many decisions the ring keeps (>= 1).
        registry: where ``dualpath_scheduler_decisions_total`` is counted.
        path: a JSONL file every decision is appended to (``None``: memory only).
        budget: bytes the packed decisions may hold (module doc).
    """

    def __init__(self, size: int, registry: MetricsRegistry, path: Path | None = None,
                 budget: int = RING_BYTES) -> None:
        # by seq, keyed by rid: the Decision's other fields, built into a Decision when read
        # (PackedRing checks size and budget: ValueError below 1)
        self._ring = PackedRing(size, budget, settle=_settled)
        self.size = size
        self.budget = budget
        self._lock = threading.Lock()
        self._seq = 0
        self._total = 0
        self._pe = dict.fromkeys(PE_CLASSES, 0)
        self._de = dict.fromkeys(DE_CLASSES, 0)
        self._side = dict.fromkeys(SIDES, 0)
        self._registry = registry
        # (pe_class, de_class, side) -> its decisions counter: the registry's labelled
        # lookup (label check, key tuple, dict) cost a decision more than the record itself
        self._counters: dict[tuple[str, str, str], Counter] = {}
        self._file: IO[str] | None = open(path, "a", encoding="utf-8") if path else None

    def record(self, **fields: Any) -> int:
        """Number, keep and count one decision (``fields``: :class:`Decision` less ``seq``;
        ``inputs`` a mapping or a function returning one); returns its ``seq``."""
        pe_class, de_class, side = fields.get("pe_class"), fields.get("de_class"), fields["side"]
        with self._lock:
            self._seq += 1
            seq = self._seq
            self._ring.append(seq, fields["rid"], fields)
            self._total += 1
            for counts, key in ((self._pe, pe_class), (self._de, de_class),
                                (self._side, side)):
                if key is not None:
                    counts[key] = counts.get(key, 0) + 1
            if self._file is not None:
                self._write(self._decision(seq, fields))
        labels = (pe_class or "", de_class or "", side)
        counter = self._counters.get(labels)
        if counter is None:  # the registry never drops a child: the same one every time
            counter = self._counters[labels] = self._registry.counter(
                "dualpath_scheduler_decisions_total", pe_class=labels[0], de_class=labels[1],
                side=labels[2])
        counter.inc()
        return seq

    @staticmethod
    def _decision(seq: int, fields: dict[str, Any]) -> Decision:
        """The record of a kept entry; a deferred ``inputs`` is built once, here (under
        the lock: the entry's dict is shared with the ring)."""
        return Decision(seq=seq, **_settled(fields))

    def _write(self, d: Decision) -> None:
        assert self._file is not None
        self._file.write(json.dumps(dataclasses.asdict(d)) + "\n")
        self._file.flush()

    def record_control(self, *, at: float, name: str, inputs: dict[str, Any]) -> Decision:
        """Number and keep one controller move (``kind`` ``control``, ``side`` the
        controller's name); it is not counted among the turns' decisions."""
        with self._lock:
            self._seq += 1
            fields: dict[str, Any] = {
                "at": at, "rid": -1, "attempt": 0, "agent": -1, "turn": -1, "length": 0,
                "cached": 0, "pe": -1, "de": -1, "de_group": -1, "side": name, "pe_tokens": 0,
                "de_tokens": 0, "pe_read_q": 0, "de_read_q": 0, "inputs": inputs,
                "kind": "control"}
            self._ring.append(self._seq, -1, fields)
            d = self._decision(self._seq, fields)
            if self._file is not None:
                self._write(d)
        return d

    def since(self, seq: int) -> list[Decision]:
        """Kept decisions with ``seq`` greater than ``seq``, oldest first."""
        with self._lock:
            return [self._decision(s, fields) for s, _, fields in self._ring.after(seq)]

    def of_request(self, rid: int) -> list[Decision]:
        """Kept decisions of request ``rid`` (one per attempt), oldest first (a scan of the
        ring's request ids; only the batches holding ``rid`` are unpacked)."""
        with self._lock:
            return [self._decision(s, fields) for s, _, fields in self._ring.of_key(rid)]

    @property
    def last_seq(self) -> int | None:
        """The newest decision's ``seq`` (``None`` before the first)."""
        with self._lock:
            return self._seq or None

    def continue_after(self, seq: int) -> None:
        """Number the next decisions after ``seq`` (a restored scheduler's log goes on
        from its predecessor's, so a reader polling ``since`` sees no reused numbers)."""
        with self._lock:
            self._seq = max(self._seq, seq)

    def counts(self) -> DecisionCounts:
        """Counts of every decision since start, by class and side."""
        with self._lock:
            return DecisionCounts(self._total, dict(self._pe), dict(self._de),
                                  dict(self._side))

    def __len__(self) -> int:
        with self._lock:
            return len(self._ring)

    @property
    def nbytes(self) -> int:
        """Bytes of the packed decisions (what the budget bounds)."""
        with self._lock:
            return self._ring.nbytes

    def close(self) -> None:
        """Close the JSONL file (the ring stays readable)."""
        with self._lock:
            f, self._file = self._file, None
        if f is not None:
            f.close()


def _settled(fields: dict[str, Any]) -> dict[str, Any]:
    """``fields`` with a deferred ``inputs`` built (once: the dict is the ring's)."""
    inputs = fields.get("inputs")
    if callable(inputs):
        fields["inputs"] = inputs()
    return fields
