"""The numpy reference model the embedded engines run.

A small Llama-style decoder (RMSNorm, RoPE, grouped-query attention, SwiGLU) with weights
generated from a seed, a byte-level tokenizer, and a KV byte layout shared with storage. Its
outputs are bit-identical however a sequence is chunked or batched and wherever its prefix KV
came from (see :mod:`.numerics` for why).
"""

from dualpath_cli.runtime.model.config import MODEL_CONFIGS, ModelConfig, model_config
from dualpath_cli.runtime.model.kvcache import (
    KVCache,
    KVLayoutError,
    LayerKV,
    pack_kv,
    unpack_kv,
)
from dualpath_cli.runtime.model.threads import limit_blas_threads
from dualpath_cli.runtime.model.tokenizer import BOS, EOS, PAD, SEP, ByteTokenizer
from dualpath_cli.runtime.model.transformer import PastKV, ReferenceModel, load_model

__all__ = [
    "BOS",
    "EOS",
    "PAD",
    "SEP",
    "MODEL_CONFIGS",
    "ByteTokenizer",
    "KVCache",
    "KVLayoutError",
    "LayerKV",
    "ModelConfig",
    "PastKV",
    "ReferenceModel",
    "limit_blas_threads",
    "load_model",
    "model_config",
    "pack_kv",
    "unpack_kv",
]
