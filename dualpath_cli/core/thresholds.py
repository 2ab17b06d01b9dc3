"""Threshold maths: alpha and beta by the seed's rule and by the paper's rule.

* Seed rule: alpha = storage-NIC bandwidth x expected latency (a bandwidth-delay product, in
  bytes). Note that 400 Gbps x 50 us is 2.5 MB, not the 8 KB the seed quotes.
* Paper rule: alpha = tokens the node's storage NIC reads in a window (3 s); beta = tokens one
  GPU processes in a window (5 s).
The scheduler compares both in tokens, so bytes are converted with the model's KV bytes per
token (all layers).
"""

from __future__ import annotations

import math

__all__ = [
    "alpha_bytes_from_bdp",
    "bytes_to_tokens",
    "tokens_readable",
    "tokens_processable",
]


def alpha_bytes_from_bdp(bandwidth: float, latency: float) -> float:
    """The seed's rule: bytes in flight on a link of ``bandwidth`` B/s over ``latency`` s."""
    return bandwidth * latency


def bytes_to_tokens(amount: float, bytes_per_token: int) -> int:
    """Whole tokens whose KV fits in ``amount`` bytes (at least 0)."""
    if bytes_per_token <= 0:
        raise ValueError("bytes_per_token must be positive")
    return max(0, math.floor(amount / bytes_per_token))


def tokens_readable(bandwidth: float, bytes_per_token: int, window: float) -> int:
    """The paper's alpha: tokens of KV a ``bandwidth`` B/s storage NIC reads in ``window`` s."""
    return bytes_to_tokens(bandwidth * window, bytes_per_token)


def tokens_processable(tokens_per_s: float, window: float) -> int:
    """The paper's beta: tokens one GPU processes in ``window`` seconds."""
    return max(0, math.floor(tokens_per_s * window))
