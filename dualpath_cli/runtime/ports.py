"""What the engines need from the model, as a small Protocol (storage is ``storage.KVStore``).

Why: the engines are written against this seam so that the numpy reference model or a torch
backend plug in unchanged. KV crosses every seam as
packed bytes, one row per token: ``uint8 [tokens, kv_bytes_per_token_layer]`` for one layer,
which is exactly a Layer Block's payload (paper section 3.5).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

__all__ = ["ModelPort"]


class ModelPort(Protocol):
    """A layerwise decoder whose outputs do not depend on batch or chunk shapes."""

    n_layers: int
    kv_bytes_per_token_layer: int

    def embed(self, tokens: np.ndarray) -> np.ndarray:
        """Hidden states ``[T, d]`` of ``tokens``."""

    def forward_layer_batch(self, layer: int, hiddens: Sequence[np.ndarray],
                            pasts: Sequence[np.ndarray]) -> tuple[list[np.ndarray], list[Any]]:
        """:meth:`forward_layer` of several sequences at once, bit-identical to single runs.

        The new KV comes back as objects whose ``pack()`` gives the packed rows.
        """

    def forward_layer(self, layer: int, hidden: np.ndarray, past_kv: np.ndarray,
                      start: int) -> tuple[np.ndarray, np.ndarray]:
        """Run ``layer`` on ``hidden`` (positions ``start..``) after ``past_kv`` (``start`` rows).

        Returns the new hidden states and the new tokens' packed KV ``uint8 [T, bytes]``.
        """

    def next_token(self, hidden_last: np.ndarray) -> int:
        """Greedy next token from the last position's hidden state."""
