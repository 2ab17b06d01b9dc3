"""The exact-arithmetic building blocks: exp, quantization, RMSNorm, KV rounding, RoPE."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dualpath_cli.runtime.model.numerics import (
    ACT_BITS,
    KV_GRID_BITS,
    KV_K_LIMIT,
    det_exp,
    quantize_rows,
    rms_norm,
    round_kv,
    silu,
    softmax_weights,
)
from dualpath_cli.runtime.model.rope import RopeTable, apply_rope


def test_det_exp_matches_libm() -> None:
    x = np.linspace(-60.0, 60.0, 20001)
    assert np.max(np.abs(det_exp(x) / np.exp(x) - 1.0)) < 1e-13
    assert det_exp(np.array([0.0]))[0] == 1.0


def test_det_exp_bits_do_not_depend_on_array_shape() -> None:
    x = np.random.default_rng(0).uniform(-30, 30, 1001)
    whole = det_exp(x)
    parts = np.concatenate([det_exp(x[i:i + 7]) for i in range(0, x.size, 7)])
    singles = np.array([det_exp(x[i:i + 1])[0] for i in range(x.size)])
    assert np.array_equal(whole, parts) and np.array_equal(whole, singles)


def test_silu() -> None:
    x = np.linspace(-20, 20, 401)
    assert np.allclose(silu(x), x / (1 + np.exp(-x)), rtol=1e-12, atol=1e-300)


@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=64))
def test_quantize_rows_is_exact_integers_within_bound(values: list[float]) -> None:
    x = np.array([values])
    q, s = quantize_rows(x)
    assert np.array_equal(q, np.rint(q))
    assert np.max(np.abs(q)) <= 2**ACT_BITS
    assert math.log2(s[0]).is_integer()
    assert np.allclose(q * s[:, None], x, rtol=0, atol=float(s[0]))


def test_rms_norm_matches_textbook_formula() -> None:
    rng = np.random.default_rng(1)
    x, g = rng.standard_normal((5, 128)) * 3, rng.standard_normal(128)
    want = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-5) * g
    got = rms_norm(x, g, 1e-5)
    assert np.allclose(got, want, rtol=1e-4, atol=1e-4)
    # unit RMS output for unit gain
    assert np.allclose(np.sqrt(np.mean(rms_norm(x, np.ones(128), 1e-9) ** 2, axis=-1)), 1.0,
                       atol=1e-4)


def test_round_kv_survives_fp16_and_reads_back_as_integers() -> None:
    x = np.random.default_rng(2).standard_normal(100000) * np.logspace(-6, 3, 100000)
    k = round_kv(x, KV_K_LIMIT)
    assert k.dtype == np.float16
    back = k.astype(np.float64) * 2.0**KV_GRID_BITS
    assert np.array_equal(back, np.rint(back))
    assert np.array_equal(round_kv(k.astype(np.float64), KV_K_LIMIT), k)  # idempotent
    assert np.max(np.abs(k.astype(np.float64))) <= KV_K_LIMIT
    small = np.abs(x) < 10
    assert np.allclose(k[small].astype(np.float64), x[small], atol=2.0**-KV_GRID_BITS,
                       rtol=2.0**-10)


def test_softmax_weights() -> None:
    scores = np.array([[0.0, 1.0, 2.0, 50.0], [3.0, 3.0, 3.0, 3.0]])
    mask = np.array([[True, True, True, False], [True, True, True, True]])
    p = softmax_weights(scores, mask)
    assert p[0, 3] == 0 and p[0, 2] == 2**16 and p[1].tolist() == [2**16] * 4
    want = np.exp(scores[0, :3] - 2.0)
    assert np.allclose(p[0, :3] / p[0, :3].sum(), want / want.sum(), atol=1e-3)


@settings(max_examples=30)
@given(st.integers(0, 5000), st.integers(0, 5000))
def test_rope_preserves_norm_and_is_relative(m: int, n: int) -> None:
    table = RopeTable(32, 10000.0)
    rng = np.random.default_rng(m * 7919 + n)
    q, k = rng.standard_normal((1, 1, 32)), rng.standard_normal((1, 1, 32))

    def rot(x: np.ndarray, pos: int) -> np.ndarray:
        cos, sin = table.lookup(np.array([pos]))
        return apply_rope(x, cos, sin)

    assert np.isclose(np.linalg.norm(rot(q, m)), np.linalg.norm(q))
    shift = 123
    dot = float(np.sum(rot(q, m) * rot(k, n)))
    dot_shifted = float(np.sum(rot(q, m + shift) * rot(k, n + shift)))
    assert math.isclose(dot, dot_shifted, rel_tol=1e-9, abs_tol=1e-9)
    assert np.allclose(rot(q, 0), q)


def test_rope_table_bits_do_not_depend_on_growth_order() -> None:
    a, b = RopeTable(32, 10000.0), RopeTable(32, 10000.0)
    a.lookup(np.array([5000]))
    b.lookup(np.array([10]))
    b.lookup(np.array([3000]))
    pos = np.arange(0, 3001)
    assert all(np.array_equal(x, y) for x, y in zip(a.lookup(pos), b.lookup(pos), strict=True))
