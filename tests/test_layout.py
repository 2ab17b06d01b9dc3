"""Block layouts and prefix-hash-chain keys (paper 4.1, checklist B1/B2)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dualpath_cli.core.layout import (
    LAYOUTS,
    BlockKey,
    BlockShape,
    Namespace,
    assemble_full_block,
    block_key,
    full_block_shape,
    layer_view,
    layer_views,
    longest_cached_prefix,
    prefix_keys,
    to_layer_major,
)

SHAPE = BlockShape(n_layers=4, block_tokens=8, bytes_per_token_layer=32)
NS = Namespace("tiny", "layer_major", SHAPE, "fp16")


def test_shape_sizes() -> None:
    assert SHAPE.layer_nbytes == 8 * 32
    assert SHAPE.full_nbytes == 4 * 8 * 32
    assert full_block_shape(SHAPE, "layer_major", 2) == (4, 8, 16)
    assert full_block_shape(SHAPE, "token_major", 2) == (8, 4, 16)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_shape_rejects_bad_values(bad: object) -> None:
    with pytest.raises(ValueError, match="n_layers"):
        BlockShape(bad, 8, 32)  # type: ignore[arg-type]


def test_unknown_layout_named() -> None:
    with pytest.raises(ValueError, match="unknown layout 'diagonal'"):
        full_block_shape(SHAPE, "diagonal")


def test_layer_blocks_are_contiguous_zero_copy_views() -> None:
    full = np.arange(4 * 8 * 16, dtype=np.float16).reshape(4, 8, 16)
    for i, layer in enumerate(layer_views(full)):
        assert layer.shape == (1, 8, 16)
        assert layer.flags["C_CONTIGUOUS"]
        assert np.shares_memory(layer, full)
        assert layer.base is full or layer.base is full.base
        np.testing.assert_array_equal(layer[0], full[i])


def test_concatenating_layer_blocks_is_byte_identical_to_the_full_block() -> None:
    rng = np.random.default_rng(1)
    full = rng.standard_normal((4, 8, 16)).astype(np.float16)
    again = assemble_full_block(layer_views(full))
    assert again.tobytes() == full.tobytes()


def test_token_major_layer_views_are_strided_and_convert() -> None:
    lm = np.arange(4 * 8 * 16, dtype=np.float32).reshape(4, 8, 16)
    tm = np.ascontiguousarray(lm.transpose(1, 0, 2))
    view = layer_view(tm, 2, "token_major")
    assert view.shape == (1, 8, 16)
    assert not view.flags["C_CONTIGUOUS"]
    assert np.shares_memory(view, tm)
    np.testing.assert_array_equal(view[0], lm[2])
    np.testing.assert_array_equal(to_layer_major(tm, "token_major"), lm)


def test_layer_out_of_range() -> None:
    with pytest.raises(IndexError, match="layer 4 out of range"):
        layer_view(np.zeros((4, 8, 16)), 4)


def test_keys_chain_over_the_prefix() -> None:
    tokens = list(range(40))
    keys = prefix_keys(tokens, NS)
    assert len(keys) == 5  # 40 tokens / 8 per block
    assert keys[0] == block_key(None, tokens[:8], NS)
    assert keys[1] == block_key(keys[0], tokens[8:16], NS)
    # a partial trailing block has no key
    assert len(prefix_keys(tokens + [1, 2, 3], NS)) == 5


def test_a_different_earlier_token_changes_every_later_key() -> None:
    a = list(range(32))
    b = [999] + a[1:]
    ka, kb = prefix_keys(a, NS), prefix_keys(b, NS)
    assert all(x != y for x, y in zip(ka, kb, strict=True))


def test_namespace_separates_models_and_layouts() -> None:
    tokens = list(range(8))
    other_model = Namespace("big", "layer_major", SHAPE, "fp16")
    other_layout = Namespace("tiny", "token_major", SHAPE, "fp16")
    keys = {prefix_keys(tokens, ns)[0] for ns in (NS, other_model, other_layout)}
    assert len(keys) == 3


def test_key_hex_round_trip_and_errors() -> None:
    key = prefix_keys(list(range(8)), NS)[0]
    assert BlockKey.from_hex(key.hex) == key
    assert len(key.hex) == 32
    with pytest.raises(ValueError, match="not a block key"):
        BlockKey.from_hex("zz")


def test_longest_cached_prefix_stops_at_first_miss() -> None:
    keys = prefix_keys(list(range(64)), NS)
    present = {keys[0], keys[1], keys[2], keys[5]}
    assert longest_cached_prefix(keys, present.__contains__) == 3
    assert longest_cached_prefix(keys, lambda k: False) == 0


def test_appending_a_block_extends_the_cached_path() -> None:
    tokens = list(range(24))
    stored = set(prefix_keys(tokens, NS))
    longer = tokens + list(range(100, 108))
    assert longest_cached_prefix(prefix_keys(longer, NS), stored.__contains__) == 3
    stored |= set(prefix_keys(longer, NS))
    assert longest_cached_prefix(prefix_keys(longer, NS), stored.__contains__) == 4


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 2**31), min_size=0, max_size=80),
       st.lists(st.integers(0, 2**31), min_size=0, max_size=80))
def test_shared_prefix_means_shared_keys(a: list[int], b: list[int]) -> None:
    common = 0
    while common < min(len(a), len(b)) and a[common] == b[common]:
        common += 1
    ka, kb = prefix_keys(a, NS), prefix_keys(b, NS)
    shared = sum(1 for x, y in zip(ka, kb, strict=False) if x == y)
    assert shared == min(common // 8, len(ka), len(kb))


def test_layouts_constant() -> None:
    assert LAYOUTS == ("layer_major", "token_major")
