"""The numpy reference model the embedded engines run.

A small Llama-style decoder (RMSNorm, RoPE, grouped-query attention, SwiGLU) with weights
generated from a seed and a KV byte layout shared with storage. Its outputs are bit-identical
however a sequence is chunked or batched and wherever its prefix KV came from (see
:mod:`.numerics` for why). Its sizes (:mod:`dualpath_cli.core.reference_model`) and its byte
tokenizer (:mod:`dualpath_cli.core.tokenizer`) are pure data in core/, so the scheduler, the
simulator and the API read them without this package.
"""

from dualpath_cli.runtime.model.kvcache import (
    KVCache,
    KVLayoutError,
    LayerKV,
    pack_kv,
    unpack_kv,
)
from dualpath_cli.runtime.model.threads import limit_blas_threads
from dualpath_cli.runtime.model.transformer import PastKV, ReferenceModel, load_model

__all__ = [
    "KVCache",
    "KVLayoutError",
    "LayerKV",
    "PastKV",
    "ReferenceModel",
    "limit_blas_threads",
    "load_model",
    "pack_kv",
    "unpack_kv",
]
