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
decision is first read or written to the file).
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import json
import threading
from pathlib import Path
from typing import IO, Any

from dualpath_cli.telemetry.registry import Counter, MetricsRegistry
from dualpath_cli.telemetry.view import Decision, DecisionCounts

__all__ = ["PE_CLASSES", "DE_CLASSES", "SIDES", "DecisionLog"]

PE_CLASSES: tuple[str, ...] = ("C1", "C2", "C3")
DE_CLASSES: tuple[str, ...] = ("normal", "high_token")
SIDES: tuple[str, ...] = ("pe", "de", "split")


class DecisionLog:
    """The last ``size`` decisions and counts of all of them.

    Args:
        size: how many decisions the ring keeps (>= 1).
        registry: where ``dualpath_scheduler_decisions_total`` is counted.
        path: a JSONL file every decision is appended to (``None``: memory only).
    """

    def __init__(self, size: int, registry: MetricsRegistry, path: Path | None = None) -> None:
        if size < 1:
            raise ValueError(f"decision ring size must be >= 1, got {size}")
        self.size = size
        # (seq, the Decision's other fields): built into a Decision when read
        self._ring: collections.deque[tuple[int, dict[str, Any]]] = collections.deque(
            maxlen=size)
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
            self._ring.append((seq, fields))
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
        inputs = fields.get("inputs")
        if callable(inputs):
            fields["inputs"] = inputs()
        return Decision(seq=seq, **fields)

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
            self._ring.append((self._seq, fields))
            d = self._decision(self._seq, fields)
            if self._file is not None:
                self._write(d)
        return d

    def since(self, seq: int) -> list[Decision]:
        """Kept decisions with ``seq`` greater than ``seq``, oldest first."""
        with self._lock:
            if not self._ring:
                return []
            # at most the ring's length: islice refuses a start past sys.maxsize
            skip = min(len(self._ring), max(0, seq + 1 - self._ring[0][0]))
            return [self._decision(*e) for e in itertools.islice(self._ring, skip, None)]

    def of_request(self, rid: int) -> list[Decision]:
        """Kept decisions of request ``rid`` (one per attempt), oldest first (a scan of the
        ring: about a millisecond at its default 10,000)."""
        with self._lock:
            found = [self._decision(*e) for e in reversed(self._ring) if e[1]["rid"] == rid]
        return found[::-1]

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

    def close(self) -> None:
        """Close the JSONL file (the ring stays readable)."""
        with self._lock:
            f, self._file = self._file, None
        if f is not None:
            f.close()
