"""The KV byte layout contract: pack/unpack, Layer and Full Block shapes, the cache."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dualpath_cli.core.reference_model import ModelConfig
from dualpath_cli.runtime.model import KVCache, KVLayoutError, LayerKV, pack_kv, unpack_kv

CFG = ModelConfig()


def _kv(t: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    shape = (t, CFG.n_kv_heads, CFG.head_dim)
    return (rng.standard_normal(shape).astype(np.float16),
            rng.standard_normal(shape).astype(np.float16))


@given(st.integers(0, 40), st.integers(0, 2**32 - 1))
def test_pack_unpack_round_trip(t: int, seed: int) -> None:
    k, v = _kv(t, seed)
    rows = pack_kv(k, v)
    assert rows.dtype == np.uint8 and rows.shape == (t, CFG.kv_bytes_per_token_layer)
    k2, v2 = unpack_kv(rows, CFG.n_kv_heads, CFG.head_dim)
    assert k2.tobytes() == k.tobytes() and v2.tobytes() == v.tobytes()
    assert np.array_equal(LayerKV.unpack(rows, CFG).pack(), rows)


def test_row_is_k_then_v_little_endian_fp16() -> None:
    k, v = _kv(3, 0)
    rows = pack_kv(k, v)
    half = CFG.kv_bytes_per_token_layer // 2
    for t in range(3):
        assert rows[t, :half].tobytes() == k[t].astype("<f2").tobytes()
        assert rows[t, half:].tobytes() == v[t].astype("<f2").tobytes()


def test_unpack_rejects_wrong_shapes() -> None:
    with pytest.raises(KVLayoutError, match=r"uint8 \[tokens, 256\]"):
        unpack_kv(np.zeros((2, 255), np.uint8), CFG.n_kv_heads, CFG.head_dim)
    with pytest.raises(KVLayoutError):
        unpack_kv(np.zeros((2, 256), np.float32), CFG.n_kv_heads, CFG.head_dim)
    with pytest.raises(KVLayoutError):
        pack_kv(np.zeros((2, 2, 32)), np.zeros((3, 2, 32)))


def test_cache_export_is_a_layer_major_full_block() -> None:
    cache = KVCache(CFG)
    per_layer = [pack_kv(*_kv(10, seed)) for seed in range(CFG.n_layers)]
    cache.extend(per_layer)
    block = cache.export(2, 6)
    assert block.shape == (CFG.n_layers, 4, CFG.kv_bytes_per_token_layer)
    assert block.dtype == np.uint8 and block.flags.c_contiguous
    for layer in range(CFG.n_layers):
        # each layer's slice is contiguous and equals that layer's rows: a Layer Block
        assert np.array_equal(block[layer], per_layer[layer][2:6])
        assert block[layer].flags.c_contiguous
        assert np.array_equal(cache.layer_bytes(layer, 2, 6), per_layer[layer][2:6])
        k, v = unpack_kv(per_layer[layer], CFG.n_kv_heads, CFG.head_dim)
        got = cache.layer(layer, 2, 6)
        assert np.array_equal(got.k, k[2:6]) and np.array_equal(got.v, v[2:6])
    # concatenating Layer Blocks gives the Full Block's bytes
    assert np.concatenate([block[i] for i in range(CFG.n_layers)]).tobytes() == block.tobytes()


def test_cache_grows_imports_truncates_and_copies() -> None:
    cache = KVCache(CFG)
    for seed in range(100):  # one token at a time, as decode does
        cache.extend([LayerKV(*_kv(1, seed * 10 + i)) for i in range(CFG.n_layers)])
    assert len(cache) == 100
    data = cache.export()
    again = KVCache.from_bytes(CFG, data[:, :64])
    again.append_bytes(data[:, 64:])
    assert np.array_equal(again.export(), data)
    clone = cache.copy()
    cache.truncate(10)
    assert cache.n_tokens == 10 and clone.n_tokens == 100
    assert np.array_equal(clone.export(0, 10), cache.export())
    with pytest.raises(ValueError):
        cache.layer_bytes(0)[0, 0] = 1  # views handed out are read-only


def test_cache_errors() -> None:
    cache = KVCache(CFG)
    with pytest.raises(KVLayoutError, match=r"token range \[0, 5\) is outside"):
        cache.export(0, 5)
    with pytest.raises(KVLayoutError, match="needs 4 layers"):
        cache.extend([pack_kv(*_kv(1, 0))])
    with pytest.raises(KVLayoutError, match="different token counts"):
        cache.extend([pack_kv(*_kv(1 + (i == 2), 0)) for i in range(4)])
    with pytest.raises(KVLayoutError, match=r"uint8 \[4, tokens, 256\]"):
        cache.append_bytes(np.zeros((3, 1, 256), np.uint8))
