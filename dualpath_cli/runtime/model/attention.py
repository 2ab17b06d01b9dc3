"""Causal grouped-query attention over exact integers (see :mod:`.numerics`).

Each query row's output depends only on that row's query and the keys/values it may see:
scores are exact integer dot products, softmax weights are integers whose row sums are exact,
and the weighted sum of V is exact. So the result is the same whether a token is computed
alone, in a chunk, in a batch, or after a prefix that was loaded from storage.
"""

from __future__ import annotations

import math

import numpy as np

from dualpath_cli.runtime.model.numerics import KV_GRID_BITS, quantize_rows, softmax_weights

__all__ = ["attend", "naive_attend"]

_BLOCK_ELEMS = 1 << 22  # at most this many score elements per query block (memory bound)
_BLOCK_ROWS = 256  # at most this many query rows per block (skips more masked keys)


def _as_int(kv16: np.ndarray) -> np.ndarray:
    """fp16 K or V on the 2**-14 grid -> exact integers in float64, ``[heads, S, dim]``."""
    return np.ascontiguousarray(kv16.astype(np.float64).transpose(1, 0, 2)) * 2.0**KV_GRID_BITS


def attend(q: np.ndarray, k16: np.ndarray, v16: np.ndarray, n_past: int) -> np.ndarray:
    """Attention of ``T`` new queries over ``n_past + T`` keys (causal among the new ones).

    Args:
        q: queries after RoPE, float64 ``[T, n_heads, head_dim]``.
        k16: keys (past then new) fp16 ``[n_past + T, n_kv_heads, head_dim]``.
        v16: values, same shape as ``k16``.
        n_past: tokens before the first query; query ``i`` sees keys ``0 .. n_past + i``.

    Returns:
        float64 ``[T, n_heads * head_dim]``.
    """
    t, n_heads, hd = q.shape
    if t == 0:
        return np.zeros((0, n_heads * hd))
    n_kv = k16.shape[1]
    group = n_heads // n_kv
    qi, qs = quantize_rows(q)  # per (token, head): [T, H, hd], [T, H]
    qi = qi.transpose(1, 0, 2).reshape(n_kv, group, t, hd)
    factor = (qs.T * (2.0**-KV_GRID_BITS / math.sqrt(hd))).reshape(n_kv, group, t)
    ki, vi = _as_int(k16), _as_int(v16)
    out = np.empty((n_kv, group, t, hd))
    rows = max(1, min(_BLOCK_ROWS, _BLOCK_ELEMS // (n_heads * (n_past + t))))
    for a in range(0, t, rows):
        b = min(t, a + rows)
        s = n_past + b  # keys visible to the last query of this block
        scores = qi[:, :, a:b] @ ki[:, None, :s].transpose(0, 1, 3, 2)
        scores *= factor[:, :, a:b, None]
        # only the block's diagonal part needs the causal mask: earlier keys are all visible
        hidden = np.arange(n_past + a, s)[None, :] > (n_past + np.arange(a, b))[:, None]
        np.copyto(scores[..., n_past + a:], -np.inf, where=hidden)
        p = softmax_weights(scores, None)
        z = np.sum(p, axis=-1, keepdims=True)
        o = p @ vi[:, None, :s]
        o /= z
        o *= 2.0**-KV_GRID_BITS
        out[:, :, a:b] = o
    return out.reshape(n_heads, t, hd).transpose(1, 0, 2).reshape(t, n_heads * hd)


def naive_attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, n_past: int) -> np.ndarray:
    """Plain float64 per-head softmax attention, the textbook reference for tests."""
    t, n_heads, hd = q.shape
    group = n_heads // k.shape[1]
    out = np.zeros((t, n_heads, hd))
    k64, v64 = k.astype(np.float64), v.astype(np.float64)
    for h in range(n_heads):
        kh, vh = k64[:, h // group], v64[:, h // group]
        for i in range(t):
            s = kh[: n_past + i + 1] @ q[i, h] / math.sqrt(hd)
            w = np.exp(s - s.max())
            out[i, h] = (w / w.sum()) @ vh[: n_past + i + 1]
    return out.reshape(t, n_heads * hd)
