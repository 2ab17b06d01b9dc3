"""Which node's storage NIC reads a request's cached KV (paper section 6.4), or both.

* :func:`choose_read_side`: the side whose node has the shorter read queue (the paper's rule).
  A tie (typically both queues empty, when the run is not I/O-bound) goes to the **PE side**.
  Measured in the simulator with bench/reproduce.py: sending ties to the DE side instead
  spreads reads over more NICs (DS 660B 2P4D offline: storage-NIC Max/Avg 1.83 -> 1.63 at
  equal JCT) but cut DS 660B 2P4D online capacity under the SLO from 0.91 to 0.59 agents/s
  (probably because the DE path adds a compute-network hop before prefill can start, which
  costs TTFT exactly when the system is idle). Capacity is the headline number, so ties stay
  on the PE side (docs/reproduction.md).
* :func:`split_read`: the paper's future work. The cached prefix, in blocks of
  ``block_tokens``, is cut once: the PE node reads blocks ``[0, k)`` and the DE node reads
  ``[k, n)``. ``k`` minimises the later of the two drain times ``(read_q + share) / rate``, so
  both queues empty at (as nearly as block granularity allows) the same time. Every block is
  read exactly once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from dualpath_cli.core.frozen import by_fields
from dualpath_cli.core.types import ReadSide

__all__ = ["choose_read_side", "SplitRead", "split_read", "DEFAULT_BLOCK_TOKENS"]

DEFAULT_BLOCK_TOKENS = 64


def choose_read_side(pe_read_q: int, de_read_q: int) -> ReadSide:
    """The side with the shorter read queue (tokens); PE on a tie (module doc)."""
    return ReadSide.DE if de_read_q < pe_read_q else ReadSide.PE


@dataclass(frozen=True, slots=True)
class SplitRead:
    """A request's cached blocks divided between the PE node and the DE node.

    Attributes:
        block_tokens: block size in tokens; the last block may be partial.
        pe_blocks: block indices the PE node reads (a prefix of the blocks).
        de_blocks: block indices the DE node reads (the rest).
        pe_tokens: tokens in ``pe_blocks``.
        de_tokens: tokens in ``de_blocks``.
        pe_drain: time for the PE node's queue (including its share) to empty, in the unit
            of ``tokens / rate`` (seconds when rates are tokens per second).
        de_drain: the same for the DE node.
    """

    block_tokens: int
    pe_blocks: range
    de_blocks: range
    pe_tokens: int
    de_tokens: int
    pe_drain: float
    de_drain: float

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return by_fields(self)  # a compiled frozen class pickles by its constructor


def split_read(cached: int, pe_read_q: int, de_read_q: int, *, pe_rate: float = 1.0,
               de_rate: float = 1.0,
               block_tokens: int = DEFAULT_BLOCK_TOKENS) -> SplitRead:
    """Divide ``cached`` tokens so the PE and DE read queues drain together.

    Args:
        cached: tokens of the cached prefix to read (>= 0).
        pe_read_q: tokens already queued on the PE node.
        de_read_q: tokens already queued on the DE node.
        pe_rate: PE node read rate (tokens per unit time, > 0).
        de_rate: DE node read rate (same unit, > 0).
        block_tokens: block granularity (>= 1); default 64 tokens.

    The continuous optimum ``x = (pe_rate*(de_read_q+cached) - de_rate*pe_read_q) /
    (pe_rate+de_rate)`` PE tokens is rounded to the better of the two neighbouring block
    counts (fewer PE blocks on a tie); it is clamped to ``[0, cached]``.
    """
    if block_tokens < 1:
        raise ValueError(f"block_tokens must be >= 1, got {block_tokens}")
    if cached < 0 or pe_read_q < 0 or de_read_q < 0:
        raise ValueError("cached and read queues must be >= 0")
    if not (pe_rate > 0 and de_rate > 0):
        raise ValueError("read rates must be > 0")
    n = -(-cached // block_tokens)
    x = (pe_rate * (de_read_q + cached) - de_rate * pe_read_q) / (pe_rate + de_rate)
    k0 = min(n, max(0, math.floor(x / block_tokens)))
    best_k, best_t = 0, math.inf
    for k in (k0, min(n, k0 + 1)):
        pe_tok = min(k * block_tokens, cached)
        t = max((pe_read_q + pe_tok) / pe_rate, (de_read_q + cached - pe_tok) / de_rate)
        if t < best_t:
            best_k, best_t = k, t
    pe_tok = min(best_k * block_tokens, cached)
    de_tok = cached - pe_tok
    return SplitRead(block_tokens, range(0, best_k), range(best_k, n), pe_tok, de_tok,
                     (pe_read_q + pe_tok) / pe_rate, (de_read_q + de_tok) / de_rate)
