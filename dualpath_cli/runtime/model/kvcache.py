"""The KV byte layout shared with storage, and a growable per-sequence KV cache.

Layout contract (with ``core/layout.py`` and ``storage/``): one token's KV in one layer is a
row of ``kv_bytes_per_token_layer`` bytes: that token's K (``[n_kv_heads, head_dim]``,
little-endian fp16, C order) followed by its V in the same form. A Layer Block is
``[block_tokens, bytes_per_token_layer]`` uint8; a Full Block is
``[n_layers, block_tokens, bytes_per_token_layer]`` uint8, layer-major. :func:`pack_kv` and
:func:`unpack_kv` are the only code that knows the order of K and V inside a row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dualpath_cli.core.reference_model import ModelConfig
from dualpath_cli.errors import DualPathError

__all__ = ["KV_NP_DTYPE", "KVLayoutError", "LayerKV", "KVCache", "pack_kv", "unpack_kv"]

KV_NP_DTYPE = np.dtype("<f2")


class KVLayoutError(DualPathError, ValueError):
    """KV bytes whose shape or dtype does not match the model's layout."""


def pack_kv(k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Rows of K-then-V bytes: ``[T, n_kv, hd]`` fp16 twice -> ``[T, 2*n_kv*hd*2]`` uint8."""
    if k.shape != v.shape or k.ndim != 3:
        raise KVLayoutError(f"pack_kv: K {k.shape} and V {v.shape} must both be [T, heads, dim]")
    t, width = k.shape[0], k.shape[1] * k.shape[2]
    kb = np.ascontiguousarray(k, dtype=KV_NP_DTYPE).reshape(t, width).view(np.uint8)
    vb = np.ascontiguousarray(v, dtype=KV_NP_DTYPE).reshape(t, width).view(np.uint8)
    return np.concatenate([kb, vb], axis=1)


def unpack_kv(data: np.ndarray, n_kv_heads: int, head_dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of :func:`pack_kv`: ``[T, bytes]`` uint8 -> ``(K, V)`` fp16 ``[T, n_kv, hd]``."""
    width = 2 * n_kv_heads * head_dim * KV_NP_DTYPE.itemsize
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != width:
        raise KVLayoutError(f"KV layer bytes must be uint8 [tokens, {width}], "
                            f"got {data.dtype} {list(data.shape)}")
    half = width // 2
    rows = np.ascontiguousarray(data)
    k = rows[:, :half].copy().view(KV_NP_DTYPE).reshape(-1, n_kv_heads, head_dim)
    v = rows[:, half:].copy().view(KV_NP_DTYPE).reshape(-1, n_kv_heads, head_dim)
    return k, v


@dataclass(frozen=True, slots=True)
class LayerKV:
    """K and V of some tokens in one layer, fp16 ``[T, n_kv_heads, head_dim]`` each."""

    k: np.ndarray
    v: np.ndarray

    @property
    def n_tokens(self) -> int:
        """Tokens held."""
        return int(self.k.shape[0])

    def pack(self) -> np.ndarray:
        """The Layer Block rows of these tokens (uint8 ``[T, bytes_per_token_layer]``)."""
        return pack_kv(self.k, self.v)

    @classmethod
    def unpack(cls, data: np.ndarray, cfg: ModelConfig) -> LayerKV:
        """From Layer Block rows."""
        return cls(*unpack_kv(data, cfg.n_kv_heads, cfg.head_dim))


class KVCache:
    """All layers' KV of one sequence, stored packed as ``[n_layers, capacity, bytes]`` uint8.

    Storing the packed form makes exporting Full Blocks a copy of a slice and importing
    loaded blocks a single memcpy; the model unpacks a layer when it attends to it.
    """

    def __init__(self, cfg: ModelConfig, capacity: int = 0) -> None:
        self.cfg = cfg
        self._buf = np.zeros((cfg.n_layers, max(capacity, 0), cfg.kv_bytes_per_token_layer),
                             dtype=np.uint8)
        self._n = 0

    @property
    def n_tokens(self) -> int:
        """Tokens cached (the same in every layer)."""
        return self._n

    def __len__(self) -> int:
        return self._n

    def _range(self, start: int, stop: int | None) -> tuple[int, int]:
        stop = self._n if stop is None else stop
        if not 0 <= start <= stop <= self._n:
            raise KVLayoutError(f"token range [{start}, {stop}) is outside the cache's "
                                f"{self._n} tokens")
        return start, stop

    def layer_bytes(self, layer: int, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Rows ``[start, stop)`` of layer ``layer`` as uint8 ``[T, bytes]`` (a read-only view)."""
        a, b = self._range(start, stop)
        view = self._buf[layer, a:b]
        view.flags.writeable = False
        return view

    def layer(self, layer: int, start: int = 0, stop: int | None = None) -> LayerKV:
        """Unpacked K/V of layer ``layer`` for tokens ``[start, stop)``."""
        return LayerKV.unpack(self.layer_bytes(layer, start, stop), self.cfg)

    def export(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """A copy ``[n_layers, T, bytes]`` uint8: a Full Block when ``T`` is the block size."""
        a, b = self._range(start, stop)
        return self._buf[:, a:b].copy()

    def _reserve(self, n: int) -> None:
        if n <= self._buf.shape[1]:
            return
        cap = max(n, 2 * self._buf.shape[1], 64)
        grown = np.zeros((self.cfg.n_layers, cap, self._buf.shape[2]), dtype=np.uint8)
        grown[:, : self._n] = self._buf[:, : self._n]
        self._buf = grown

    def append_bytes(self, data: np.ndarray) -> None:
        """Append tokens given as ``[n_layers, T, bytes]`` uint8 (e.g. loaded Full Blocks)."""
        want = (self.cfg.n_layers, self.cfg.kv_bytes_per_token_layer)
        if data.dtype != np.uint8 or data.ndim != 3 or (data.shape[0], data.shape[2]) != want:
            raise KVLayoutError(f"KV bytes must be uint8 [{want[0]}, tokens, {want[1]}], "
                                f"got {data.dtype} {list(data.shape)}")
        t = data.shape[1]
        self._reserve(self._n + t)
        self._buf[:, self._n : self._n + t] = data
        self._n += t

    def extend(self, layers: Sequence[LayerKV | np.ndarray]) -> None:
        """Append the same new tokens to every layer (one entry per layer, LayerKV or bytes)."""
        if len(layers) != self.cfg.n_layers:
            raise KVLayoutError(f"extend needs {self.cfg.n_layers} layers, got {len(layers)}")
        rows = [x.pack() if isinstance(x, LayerKV) else x for x in layers]
        counts = {r.shape[0] for r in rows}
        if len(counts) != 1:
            raise KVLayoutError(f"extend got different token counts per layer: {sorted(counts)}")
        self.append_bytes(np.stack(rows))

    def truncate(self, n_tokens: int) -> None:
        """Keep only the first ``n_tokens`` tokens."""
        self._range(0, n_tokens)
        self._n = n_tokens

    def copy(self) -> KVCache:
        """An independent cache with the same tokens."""
        out = KVCache(self.cfg, self._n)
        out.append_bytes(self._buf[:, : self._n])
        return out

    @classmethod
    def from_bytes(cls, cfg: ModelConfig, data: np.ndarray) -> KVCache:
        """A cache holding ``[n_layers, T, bytes]`` uint8 (e.g. concatenated Full Blocks)."""
        out = cls(cfg, data.shape[1] if data.ndim == 3 else 0)
        out.append_bytes(data)
        return out
