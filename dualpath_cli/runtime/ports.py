"""What the engines need from the model and from storage, as small Protocols.

Why: the engines are written against these seams so that the numpy reference model, a torch
backend, the POSIX store or the in-memory fake plug in unchanged. KV crosses every seam as
packed bytes, one row per token: ``uint8 [tokens, kv_bytes_per_token_layer]`` for one layer,
which is exactly a Layer Block's payload (paper section 3.5).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from dualpath_cli.core.layout import BlockKey

__all__ = ["ModelPort", "StorePort"]


class ModelPort(Protocol):
    """A layerwise decoder whose outputs do not depend on batch or chunk shapes."""

    n_layers: int
    kv_bytes_per_token_layer: int

    def embed(self, tokens: np.ndarray) -> np.ndarray:
        """Hidden states ``[T, d]`` of ``tokens``."""

    def forward_layer(self, layer: int, hidden: np.ndarray, past_kv: np.ndarray,
                      start: int) -> tuple[np.ndarray, np.ndarray]:
        """Run ``layer`` on ``hidden`` (positions ``start..``) after ``past_kv`` (``start`` rows).

        Returns the new hidden states and the new tokens' packed KV ``uint8 [T, bytes]``.
        """

    def next_token(self, hidden_last: np.ndarray) -> int:
        """Greedy next token from the last position's hidden state."""


class StorePort(Protocol):
    """Full Blocks by prefix key. ``get`` raises ``CorruptBlockError`` on a bad block."""

    def get(self, key: BlockKey) -> np.ndarray | None:
        """The Full Block ``uint8 [n_layers, block_tokens, bytes]`` or None when missing."""

    def put(self, key: BlockKey, block: np.ndarray) -> None:
        """Store a Full Block (atomically)."""

    def contains(self, key: BlockKey) -> bool:
        """Whether ``key`` is stored."""
