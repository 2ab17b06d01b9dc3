"""Sizes of the reference model, and the facts the scheduler and simulator derive from them.

One :class:`ModelConfig` fixes the architecture and the weight seed; :meth:`ModelConfig.to_profile`
turns it into the :class:`~dualpath_cli.core.profiles.ModelProfile` the scheduler and the
simulator use, so the runtime and its cost model never disagree about KV bytes or layer counts.
Pure data (it lives in core/): the engines build the model from it, and the API reads the
served model's vocabulary and context from it without loading the model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dualpath_cli.core.profiles import ModelProfile
from dualpath_cli.errors import ConfigError

__all__ = ["KV_DTYPES", "MODEL_CONFIGS", "ModelConfig", "model_config"]

KV_DTYPES: dict[str, int] = {"fp16": 2}  # KV storage dtype -> bytes per element


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Architecture of the Llama-style reference decoder.

    Args:
        name: profile name (``tiny`` for tests and the embedded default, ``bench`` for
            benchmarks).
        n_layers: decoder layers.
        d_model: residual width.
        n_heads: query heads.
        n_kv_heads: key/value heads (grouped-query attention; divides ``n_heads``).
        head_dim: dimension of one head (even, for RoPE).
        d_ff: SwiGLU hidden width.
        vocab_size: 256 byte tokens plus the tokenizer's specials (at least 260).
        rope_theta: RoPE base.
        norm_eps: RMSNorm epsilon.
        tie_embeddings: use the embedding matrix as the output head (off by default: with
            random weights a tied head mostly echoes the last input token).
        kv_dtype: storage dtype of K and V (only ``fp16``).
        seed: seed of the weight generator.
        max_seq_len: longest sequence (keeps the exact-integer attention sums below 2**53).
    """

    name: str = "tiny"
    n_layers: int = 4
    d_model: int = 128
    n_heads: int = 4
    n_kv_heads: int = 2
    head_dim: int = 32
    d_ff: int = 352
    vocab_size: int = 260
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = False
    kv_dtype: str = "fp16"
    seed: int = 0
    max_seq_len: int = 65536

    def __post_init__(self) -> None:
        where = f"model config {self.name!r}"
        positive = ("n_layers", "d_model", "n_heads", "n_kv_heads", "head_dim", "d_ff",
                    "vocab_size", "max_seq_len")
        for field in positive:
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"{where}: {field} must be a positive integer, got {value!r}")
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(f"{where}: n_heads ({self.n_heads}) must be a multiple of "
                              f"n_kv_heads ({self.n_kv_heads})")
        if self.head_dim % 2:
            raise ConfigError(f"{where}: head_dim must be even for RoPE, got {self.head_dim}")
        if max(self.d_model, self.d_ff, self.n_heads * self.head_dim) > 8192:
            raise ConfigError(f"{where}: widths above 8192 break the exact-integer matmul bound")
        if not 260 <= self.vocab_size <= 65536:
            raise ConfigError(f"{where}: vocab_size must be in [260, 65536] (256 bytes + "
                              f"specials), got {self.vocab_size}")
        if self.kv_dtype not in KV_DTYPES:
            raise ConfigError(f"{where}: kv_dtype must be one of {sorted(KV_DTYPES)}, "
                              f"got {self.kv_dtype!r}")
        if not 1 <= self.max_seq_len <= 65536:
            raise ConfigError(f"{where}: max_seq_len must be in [1, 65536], "
                              f"got {self.max_seq_len}")
        for field in ("rope_theta", "norm_eps"):
            value = getattr(self, field)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"{where}: {field} must be a positive number, got {value!r}")
        if self.rope_theta <= 1.0:
            raise ConfigError(f"{where}: rope_theta must be > 1, got {self.rope_theta}")
        if not isinstance(self.tie_embeddings, bool):
            raise ConfigError(f"{where}: tie_embeddings must be true or false")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise ConfigError(f"{where}: seed must be a non-negative integer, got {self.seed!r}")

    @property
    def kv_dtype_bytes(self) -> int:
        """Bytes of one K or V element in storage."""
        return KV_DTYPES[self.kv_dtype]

    @property
    def kv_bytes_per_token_layer(self) -> int:
        """Bytes of one token's K and V in one layer (one row of a Layer Block)."""
        return 2 * self.n_kv_heads * self.head_dim * self.kv_dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of one token's KV over all layers."""
        return self.n_layers * self.kv_bytes_per_token_layer

    @property
    def params_per_layer(self) -> int:
        """Weights of one decoder layer's linear maps (attention + SwiGLU)."""
        q_out, kv_out = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        attn = self.d_model * (q_out + 2 * kv_out) + q_out * self.d_model
        return attn + 3 * self.d_model * self.d_ff

    @property
    def active_params(self) -> int:
        """Weights touched per token by matmuls: all layers plus the output head."""
        return self.n_layers * self.params_per_layer + self.vocab_size * self.d_model

    def to_profile(self, name: str | None = None) -> ModelProfile:
        """The scheduler/simulator view of this model (dense attention)."""
        return ModelProfile(
            name=name or ("reference" if self.name == "tiny" else f"reference-{self.name}"),
            n_layers=self.n_layers,
            kv_bytes_per_token_layer=self.kv_bytes_per_token_layer,
            n_heads=self.n_heads,
            head_dim=self.head_dim,
            active_params=float(self.active_params),
            kv_dtype=self.kv_dtype,
        )


MODEL_CONFIGS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(),
    "bench": ModelConfig(name="bench", n_layers=8, d_model=512, n_heads=8, n_kv_heads=4,
                         head_dim=64, d_ff=1408),
}


def model_config(name: str = "tiny", overrides: Mapping[str, Any] | None = None) -> ModelConfig:
    """A built-in profile by name, with optional field overrides (e.g. from a YAML file).

    Raises:
        ConfigError: unknown profile or field, or an invalid value.
    """
    if name not in MODEL_CONFIGS:
        raise ConfigError(f"unknown model profile {name!r}: expected one of "
                          f"{', '.join(sorted(MODEL_CONFIGS))}")
    base = MODEL_CONFIGS[name]
    if not overrides:
        return base
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ConfigError(f"model config {name!r}: unknown field(s) {', '.join(unknown)}; "
                          f"expected some of {', '.join(sorted(fields))}")
    return dataclasses.replace(base, **dict(overrides))
