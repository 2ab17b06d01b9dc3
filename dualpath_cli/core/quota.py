"""Compute-quota batching for PEs (paper section 6.5): equal attention time per GPU.

Each queued prefill is a ``(cached, bsz)`` pair: ``cached`` tokens whose KV exists (storage
hits or earlier chunks) and ``bsz`` tokens still to compute. A predictor maps a pair to the
attention layer's time; a batch's time is the sum over its items. Packing is FIFO:

1. while the head fits in the quota left, take it whole;
2. otherwise binary-search the largest ``bsz'`` whose time fits the quota left; if
   ``bsz' >= 1`` take a chunk of ``bsz'`` tokens and leave the remainder at the head of the
   queue as ``(cached + bsz', bsz - bsz')`` (chunked prefill); then the batch is closed.

No batch's predicted time exceeds the quota, with one documented exception that guarantees
progress: when the batch is still empty and even ``bsz = 1`` of the head exceeds the whole
quota, the batch is that single token alone, flagged ``over_quota``.

The seed's pseudo-code ends its binary search with ``low`` = the first ``bsz`` that does *not*
fit and uses it, overshooting the quota by one step; :func:`largest_fitting_bsz` returns the
last one that fits.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from dualpath_cli.core.frozen import by_fields
from dualpath_cli.core.profiles import ModelProfile

__all__ = [
    "Predictor",
    "PrefillWork",
    "QuotaBatch",
    "flops_predictor",
    "largest_fitting_bsz",
    "pack_batch",
]

Predictor = Callable[[int, int], float]
"""``(cached, bsz) -> predicted attention time`` (seconds); must be non-decreasing in bsz."""


@dataclass(frozen=True, slots=True)
class PrefillWork:
    """A request's prefill still to do: ``bsz`` new tokens after ``cached`` existing ones."""

    request_id: int
    cached: int
    bsz: int

    def __post_init__(self) -> None:
        if self.cached < 0 or self.bsz < 1:
            raise ValueError(
                f"request {self.request_id}: need cached >= 0 and bsz >= 1, "
                f"got cached={self.cached}, bsz={self.bsz}")

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return by_fields(self)  # a compiled frozen class pickles by its constructor


@dataclass(frozen=True, slots=True)
class QuotaBatch:
    """One forward batch and what is left.

    Why ``consumed``/``carry`` and not a copied queue: a batch takes a few items from a queue
    that may be long, so copying the rest on every call made packing O(queue). The caller
    drops the first ``consumed`` items of its queue and, if ``carry`` is set, puts it back at
    the head. ``remaining`` still gives that queue as a copy, on demand.

    Attributes:
        items: the batch, FIFO; the last item may be a chunk of its request.
        predicted: sum of predicted attention times of ``items``.
        consumed: how many items from the head of the queue the batch used (a chunked one
            included).
        carry: a chunked item's remainder ``(cached + bsz', bsz - bsz')``, which goes back at
            the head of the queue; None when no item was chunked.
        over_quota: True only for the single-token progress rule (see module doc).
    """

    items: tuple[PrefillWork, ...]
    predicted: float
    consumed: int = 0
    carry: PrefillWork | None = None
    over_quota: bool = False
    source: Iterable[PrefillWork] = field(default=(), repr=False, compare=False)

    @property
    def remaining(self) -> tuple[PrefillWork, ...]:
        """The queue after this batch, copied now (the chunk's remainder first).

        Only meaningful when the queue passed in is a collection not changed since the call.
        """
        head = (self.carry,) if self.carry is not None else ()
        return head + tuple(islice(self.source, self.consumed, None))

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return by_fields(self)  # a compiled frozen class pickles by its constructor


def flops_predictor(model: ModelProfile, flops_per_s: float) -> Predictor:
    """A predictor from the model's attention FLOPs at an achieved rate of ``flops_per_s``.

    The paper fits FLOPs -> time per hardware; a constant rate is the linear fit without an
    intercept. Pass a profiled callable instead when one exists.
    """
    if flops_per_s <= 0:
        raise ValueError(f"flops_per_s must be > 0, got {flops_per_s}")

    def predict(cached: int, bsz: int) -> float:
        return model.attention_flops(cached, bsz) / flops_per_s

    return predict


def largest_fitting_bsz(predict: Predictor, cached: int, bsz: int, budget: float,
                        spent: float = 0.0) -> int:
    """The largest ``b`` in ``[0, bsz]`` with ``spent + predict(cached, b) <= budget``.

    Returns 0 when no ``b >= 1`` fits. Binary search, so ``predict`` must be non-decreasing
    in its second argument. ``spent`` is added (not subtracted from ``budget``) so the test is
    exactly the one the packer applies, with no floating-point slack.
    """
    lo, hi = 0, bsz  # invariant: lo fits (b=0 is taken to fit), everything above hi fails
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if spent + predict(cached, mid) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo


def pack_batch(queue: Iterable[PrefillWork], quota: float,
               predict: Predictor) -> QuotaBatch:
    """Pack one batch from ``queue`` (FIFO) under ``quota`` (see module doc).

    ``queue`` is read lazily from its head (any iterable, not modified); reading stops at the
    first item that does not fit whole, so the cost is O(batch), not O(queue).
    """
    if quota <= 0:
        raise ValueError(f"compute quota must be > 0, got {quota}")
    items: list[PrefillWork] = []
    used = 0.0
    n = 0
    for w in queue:
        t = predict(w.cached, w.bsz)
        if used + t <= quota:
            items.append(w)
            used += t
            n += 1
            continue
        b = largest_fitting_bsz(predict, w.cached, w.bsz - 1, quota, used)
        if b == 0 and not items:
            b, over = 1, True  # progress rule: one token alone, even over the quota
        else:
            over = False
        if b == 0:
            break
        items.append(PrefillWork(w.request_id, w.cached, b))
        used += predict(w.cached, b)
        carry = PrefillWork(w.request_id, w.cached + b, w.bsz - b) if b < w.bsz else None
        return QuotaBatch(tuple(items), used, n + 1, carry, over, queue)
    return QuotaBatch(tuple(items), used, n, None, False, queue)
