"""Order-independent arithmetic: the reason the reference model is deterministic by construction.

BLAS results (and numpy's pairwise reductions) depend on the shape of the operands: the same
row summed in a batch of 1 or of 300 can round differently. The engines prefill in batches and
chunks of any size and read the prefix KV back from storage, and the generated tokens must not
depend on any of that. So every reduction the model performs is done on *integers held exactly
in float64*: a sum of integers below 2**53 is the same in any order, on any kernel.

* Activations entering a matmul are quantized per row to int16 range with a power-of-two scale
  (:func:`quantize_rows`); weights are int8-valued with one scale per matrix. The dot products
  are then exact (|sum| < 2**15 * 2**7 * d <= 2**35 for d <= 8192).
* K and V are rounded to fp16 and then to a fixed grid of 2**-14 (:func:`round_kv`), so stored
  KV reads back as exact integers (``k * 2**14``).
* Softmax weights are integers on a 2**-16 grid (:func:`softmax_weights`) read from a table
  built with an exp made only of correctly rounded IEEE operations (:func:`det_exp`), so they
  do not depend on whether a SIMD or scalar libm path served an element.

Everything else is elementwise IEEE arithmetic (+, -, *, /, sqrt, rint, ldexp), which is
correctly rounded and therefore identical whatever the array shape.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "ACT_BITS",
    "KV_GRID_BITS",
    "KV_K_LIMIT",
    "KV_V_LIMIT",
    "PROB_BITS",
    "EXP_STEPS",
    "det_exp",
    "quantize_rows",
    "rms_norm",
    "round_kv",
    "silu",
    "softmax_weights",
]

ACT_BITS = 15  # activations quantize to |q| <= 2**15 before each matmul
KV_GRID_BITS = 14  # K and V live on a grid of 2**-14 (see round_kv)
KV_K_LIMIT = 256.0  # |K| clip: keeps q.k sums < 2**53 (2**15 * 2**22 * head_dim)
KV_V_LIMIT = 32.0  # |V| clip: keeps p.v sums < 2**53 for contexts up to 2**16 tokens
PROB_BITS = 16  # softmax weights are integers in [0, 2**16]

_LN2_HI = 6.93147180369123816490e-01  # fdlibm split of ln 2: k * _LN2_HI is exact for |k| < 2**11
_LN2_LO = 1.90821492927058770002e-10
_INV_LN2 = 1.44269504088896338700e00
# 1/n! for n = 0..11: Taylor series of exp on |r| <= ln2/2, error < 2e-15 relative.
_EXP_COEFFS = (
    1.0, 1.0, 1.0 / 2, 1.0 / 6, 1.0 / 24, 1.0 / 120, 1.0 / 720, 1.0 / 5040, 1.0 / 40320,
    1.0 / 362880, 1.0 / 3628800, 1.0 / 39916800,
)


def det_exp(x: np.ndarray) -> np.ndarray:
    """``exp(x)`` in float64 from correctly rounded operations only (shape-independent bits).

    Arguments are clipped to [-700, 700]; results are accurate to a few ulp.
    """
    x = np.clip(np.asarray(x, dtype=np.float64), -700.0, 700.0)
    k = np.rint(x * _INV_LN2)
    r = (x - k * _LN2_HI) - k * _LN2_LO
    p = np.full_like(r, _EXP_COEFFS[-1])
    for c in _EXP_COEFFS[-2::-1]:
        p = p * r + c
    return np.ldexp(p, k.astype(np.int64))


def silu(x: np.ndarray) -> np.ndarray:
    """``x * sigmoid(x)`` with :func:`det_exp`."""
    return x / (1.0 + det_exp(-x))


def quantize_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Split ``x`` into integer values and a power-of-two scale per row (last axis).

    Returns ``(q, s)`` with ``q`` integer-valued float64, ``|q| <= 2**ACT_BITS`` and
    ``x ~= q * s[..., None]``. The scale depends only on the row's own values.
    """
    x = np.asarray(x, dtype=np.float64)
    peak = np.max(np.abs(x), axis=-1)
    _, exp = np.frexp(peak)  # peak < 2**exp exactly; exp = 0 for an all-zero row
    # keep the scale a normal float (>= 2**-1022) so tiny rows quantize to 0, not inf
    scale = np.ldexp(1.0, np.maximum(exp, ACT_BITS - 1022) - ACT_BITS)
    return np.rint(x / scale[..., None]), scale


def rms_norm(x: np.ndarray, gain: np.ndarray, eps: float) -> np.ndarray:
    """RMSNorm over the last axis; the mean square is an exact integer sum."""
    q, s = quantize_rows(x)
    mean_sq = np.sum(q * q, axis=-1) * (s * s) / x.shape[-1]
    inv = 1.0 / np.sqrt(mean_sq + eps)
    return (x * inv[..., None]) * gain


def round_kv(x: np.ndarray, limit: float) -> np.ndarray:
    """Round K or V to what storage keeps: clip to ``±limit``, fp16, then the 2**-14 grid.

    fp16 values of magnitude >= 2**-4 are already on the grid; smaller ones round to
    ``n * 2**-14`` with ``n <= 2**10``, which fp16 holds exactly. So the result survives an
    fp16 round trip bit for bit and reads back as the exact integer ``x * 2**14``.
    """
    h = np.clip(x, -limit, limit).astype(np.float16).astype(np.float64)
    return (np.rint(h * 2.0**KV_GRID_BITS) * 2.0**-KV_GRID_BITS).astype(np.float16)


def _exp_table() -> np.ndarray:
    """``rint(exp(-i / EXP_STEPS) * 2**PROB_BITS)`` for every index the softmax can use."""
    x = -np.arange(EXP_TABLE_LEN, dtype=np.float64) / EXP_STEPS
    table = np.rint(det_exp(x) * 2.0**PROB_BITS)
    table[-1] = 0.0  # the index of masked (and negligible) entries
    return table


EXP_STEPS = 1024  # softmax exponent grid: scores are compared at 1/1024 resolution
EXP_TABLE_LEN = 13 * EXP_STEPS  # exp(-12.x) * 2**16 < 0.5: every later entry would be 0
_EXP_TABLE = _exp_table()


def softmax_weights(scores: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """Integer softmax numerators in [0, 2**16] (float64); masked entries get 0.

    ``weight = rint(2**16 * exp(-(max - score)))`` with ``max - score`` on a 1/1024 grid, read
    from a table: a few elementwise passes instead of a polynomial, and the same bits on every
    path. The caller divides by the row sum, itself an exact integer sum.
    """
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    top = np.max(scores, axis=-1, keepdims=True)
    gap = np.subtract(top, scores)
    gap *= EXP_STEPS
    np.rint(gap, out=gap)
    np.minimum(gap, EXP_TABLE_LEN - 1, out=gap)
    return _EXP_TABLE.take(gap.astype(np.intp))
