"""Deterministic weights of the reference model, generated from ``ModelConfig.seed``.

Every matrix is int8-valued (held in float64 so BLAS can multiply it exactly, see
:mod:`.numerics`) with one float scale per matrix. Scales follow the usual fan-in rule, with
the residual-branch outputs shrunk by ``1/sqrt(2 * n_layers)``, so activations keep unit size
through the stack and greedy decoding does not collapse onto one token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dualpath_cli.core.reference_model import ModelConfig
from dualpath_cli.runtime.model.numerics import quantize_rows

__all__ = ["QuantLinear", "LayerWeights", "ModelWeights", "init_weights", "linear"]

_INT_STD = 32.0  # standard deviation of the int8 weight values before clipping at 127
LOGIT_SCALE = 4.0  # multiplies the cosine-like output logits: peaked, but not one-hot


@dataclass(frozen=True, slots=True)
class QuantLinear:
    """``y = x @ (w * scale)`` with integer-valued ``w`` of shape ``[d_in, d_out]``."""

    w: np.ndarray
    scale: float


@dataclass(frozen=True, slots=True)
class LayerWeights:
    """One decoder layer: pre-norm attention and pre-norm SwiGLU MLP."""

    attn_norm: np.ndarray
    wq: QuantLinear
    wk: QuantLinear
    wv: QuantLinear
    wo: QuantLinear
    mlp_norm: np.ndarray
    w_gate: QuantLinear
    w_up: QuantLinear
    w_down: QuantLinear


@dataclass(frozen=True, slots=True)
class ModelWeights:
    """All weights; ``embed`` is integer-valued ``[vocab, d_model]`` times ``embed_scale``."""

    embed: np.ndarray
    embed_scale: float
    layers: tuple[LayerWeights, ...]
    final_norm: np.ndarray
    lm_head: QuantLinear


def linear(x: np.ndarray, lin: QuantLinear) -> np.ndarray:
    """Apply ``lin`` to rows of ``x`` ``[N, d_in]``; each row's result is independent of N."""
    q, s = quantize_rows(x)
    return (q @ lin.w) * (s * lin.scale)[:, None]


def _int_matrix(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    return np.clip(np.rint(rng.standard_normal(shape) * _INT_STD), -127.0, 127.0)


def _lin(rng: np.random.Generator, d_in: int, d_out: int, std: float) -> QuantLinear:
    return QuantLinear(_int_matrix(rng, (d_in, d_out)), std / _INT_STD)


def _gain(rng: np.random.Generator, d: int) -> np.ndarray:
    return 1.0 + 0.1 * rng.standard_normal(d)


def init_weights(cfg: ModelConfig) -> ModelWeights:
    """Weights drawn in a fixed order from ``numpy.random.default_rng(cfg.seed)``."""
    rng = np.random.default_rng(cfg.seed)
    d, q_out, kv_out = cfg.d_model, cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    branch = 1.0 / math.sqrt(2 * cfg.n_layers)
    embed = _int_matrix(rng, (cfg.vocab_size, d))
    layers = []
    for _ in range(cfg.n_layers):
        layers.append(LayerWeights(
            attn_norm=_gain(rng, d),
            wq=_lin(rng, d, q_out, 1.0 / math.sqrt(d)),
            wk=_lin(rng, d, kv_out, 1.0 / math.sqrt(d)),
            wv=_lin(rng, d, kv_out, 1.0 / math.sqrt(d)),
            wo=_lin(rng, q_out, d, branch / math.sqrt(q_out)),
            mlp_norm=_gain(rng, d),
            w_gate=_lin(rng, d, cfg.d_ff, 1.0 / math.sqrt(d)),
            w_up=_lin(rng, d, cfg.d_ff, 1.0 / math.sqrt(d)),
            w_down=_lin(rng, cfg.d_ff, d, 2.0 * branch / math.sqrt(cfg.d_ff)),
        ))
    final_norm = _gain(rng, d)
    head_std = LOGIT_SCALE / math.sqrt(d)
    if cfg.tie_embeddings:
        lm_head = QuantLinear(np.ascontiguousarray(embed.T), head_std / _INT_STD)
    else:
        lm_head = _lin(rng, d, cfg.vocab_size, head_std)
    return ModelWeights(embed=embed, embed_scale=1.0 / _INT_STD, layers=tuple(layers),
                        final_norm=final_norm, lm_head=lm_head)
