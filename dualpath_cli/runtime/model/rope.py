"""Rotary position embedding (RoPE), rotate-half form as in Llama.

The cos/sin tables are built in fixed-size chunks of positions, always with the same array
shape, so a position's angle has the same bits in every process whatever the longest sequence
it has seen (transcendental ufuncs may take SIMD or scalar paths depending on array shape).
"""

from __future__ import annotations

import numpy as np

__all__ = ["RopeTable", "apply_rope"]

_CHUNK = 1024  # positions per table chunk; every chunk is computed with this exact shape


class RopeTable:
    """cos/sin of ``position * theta**(-2i/head_dim)``, grown on demand, chunk by chunk."""

    def __init__(self, head_dim: int, theta: float) -> None:
        half = head_dim // 2
        self.inv_freq = theta ** (-np.arange(half, dtype=np.float64) * 2.0 / head_dim)
        # (cos, sin) replaced as one tuple, so a reader in another thread sees a matched pair
        self._tables = (np.empty((0, half)), np.empty((0, half)))

    def _grow(self, n_positions: int) -> None:
        cos, sin = self._tables
        chunks_cos, chunks_sin = [cos], [sin]
        start = cos.shape[0]
        while start < n_positions:
            angles = np.arange(start, start + _CHUNK, dtype=np.float64)[:, None] * self.inv_freq
            chunks_cos.append(np.cos(angles))
            chunks_sin.append(np.sin(angles))
            start += _CHUNK
        self._tables = (np.concatenate(chunks_cos), np.concatenate(chunks_sin))

    def lookup(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(cos, sin)``, each ``[len(positions), head_dim // 2]``."""
        top = int(positions.max()) + 1 if positions.size else 0
        if top > self._tables[0].shape[0]:
            self._grow(top)
        cos, sin = self._tables
        return cos[positions], sin[positions]


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate ``x`` of shape ``[T, heads, head_dim]`` by the per-token angles ``[T, head_dim/2]``.

    Pairs dimension ``i`` with ``i + head_dim/2`` (rotate-half). Norms are preserved and
    ``<rope(q, m), rope(k, n)>`` depends only on ``m - n``.
    """
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos[:, None, :], sin[:, None, :]
    return np.concatenate([x1 * c - x2 * s, x1 * s + x2 * c], axis=-1)
