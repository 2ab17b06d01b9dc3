"""Model and hardware profiles, and the FLOP model derived from them.

A profile is the set of facts every threshold and cost computation needs: KV bytes per
token per layer, layer count, attention shape (dense or sparse top-k) and active
parameters for the linear layers; and for hardware, GPU peak FLOPs with an achieved
fraction (MFU), HBM, NIC and DRAM bandwidths.

FLOP model (2 FLOPs per multiply-accumulate):

* linear layers: ``2 * active_params`` per new token;
* attention, per layer: each new token i (0-based) of a chunk with ``cached`` earlier tokens
  attends to ``cached + i + 1`` tokens, capped at ``attention_topk`` for sparse attention;
  QK^T and AV cost ``4 * n_heads * head_dim`` FLOPs per attended token;
* sparse-attention indexer, per layer: DeepSeek Sparse Attention's lightning indexer scores
  *every* earlier token (it is what picks the top-k, so it is not capped by it):
  ``indexer_flops_per_token_layer`` (``2 x indexer_heads x indexer_dim``) per causally
  attended token, uncapped. Without it attention FLOPs stop growing at top-k while KV keeps
  growing, and the cache-compute ratio (paper Table 1) is far too high at long context.

Beta in seconds ("tokens one GPU processes in 5 s") is converted with
:meth:`HardwareProfile.prompt_tokens_per_s`: core's PE fetch charges a request's *whole
prompt* (cached + appended) to ``tok``, so the rate must count prompt tokens per second of
prefill, ``(context + append) / prefill_time(context, append)``, not new tokens per second.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dualpath_cli.core.frozen import by_fields
from dualpath_cli.errors import pick

__all__ = [
    "ModelProfile",
    "HardwareProfile",
    "MODEL_PROFILES",
    "HARDWARE_PROFILES",
    "attended_tokens",
    "get_model_profile",
    "get_hardware_profile",
]


def attended_tokens(cached: int, bsz: int, topk: int = 0) -> int:
    """Sum over ``bsz`` new tokens of how many tokens each attends to (causal, capped)."""
    if bsz <= 0:
        return 0
    first, last = cached + 1, cached + bsz  # token i attends to cached + i + 1
    if topk <= 0 or last <= topk:
        return (first + last) * bsz // 2
    if first >= topk:
        return topk * bsz
    below = topk - first  # tokens attending to fewer than topk: first .. topk-1
    return (first + topk - 1) * below // 2 + topk * (bsz - below)


@dataclass(frozen=True, slots=True)
class ModelProfile:
    """Facts about a model that scheduling and cost models need."""

    name: str
    n_layers: int
    kv_bytes_per_token_layer: int
    n_heads: int
    head_dim: int
    active_params: float
    attention_topk: int = 0  # 0 = dense attention
    kv_dtype: str = "fp16"
    indexer_flops_per_token_layer: int = 0  # DSA lightning indexer; 0 = none

    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes of one token over all layers."""
        return self.n_layers * self.kv_bytes_per_token_layer

    def attention_flops(self, cached: int, bsz: int) -> float:
        """Attention FLOPs (incl. any sparse-attention indexer) over all layers for ``bsz`` new
        tokens after ``cached`` ones."""
        per_layer = 4.0 * self.n_heads * self.head_dim * attended_tokens(
            cached, bsz, self.attention_topk)
        if self.indexer_flops_per_token_layer:
            per_layer += float(self.indexer_flops_per_token_layer) * attended_tokens(cached, bsz)
        return per_layer * self.n_layers

    def linear_flops(self, bsz: int) -> float:
        """Linear-layer FLOPs (projections, MLP/MoE) for ``bsz`` tokens."""
        return 2.0 * self.active_params * bsz

    def prefill_flops(self, cached: int, bsz: int) -> float:
        """Total prefill FLOPs for a chunk of ``bsz`` new tokens after ``cached`` ones."""
        return self.linear_flops(bsz) + self.attention_flops(cached, bsz)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return by_fields(self)  # a compiled frozen class pickles by its constructor


@dataclass(frozen=True, slots=True)
class HardwareProfile:
    """Facts about one node type. Bandwidths in bytes/s, capacities in bytes."""

    name: str
    gpus_per_node: int
    gpu_peak_flops: float
    mfu: float
    hbm_bytes: int
    snic_bandwidth: float
    snics_per_node: int
    cnic_bandwidth: float
    dram_bandwidth: float
    dram_buffer_bytes: int
    hbm_bandwidth: float = 3.35e12  # bytes/s one GPU reads from its HBM (decode roofline)

    @property
    def gpu_flops(self) -> float:
        """Achieved FLOP/s of one GPU (peak x MFU)."""
        return self.gpu_peak_flops * self.mfu

    def prefill_s(self, model: ModelProfile, context: int, append: int) -> float:
        """Seconds one GPU takes to prefill ``append`` new tokens after ``context`` cached."""
        return model.prefill_flops(context, append) / self.gpu_flops

    def prompt_tokens_per_s(self, model: ModelProfile, context: int, append: int) -> float:
        """Prompt tokens per second of one GPU's prefill: ``(context + append) / time``.

        This is the unit of beta: PE fetch charges a request's whole prompt to ``tok``, so
        "tokens one GPU processes in 5 s" is 5 s of this rate at a reference turn with
        ``context`` cached tokens and ``append`` new ones (module doc).

        Raises:
            ValueError: when ``append < 1`` or ``context < 0``.
        """
        if append < 1 or context < 0:
            raise ValueError(f"need append >= 1 and context >= 0, got context={context}, "
                             f"append={append}")
        return (context + append) / self.prefill_s(model, context, append)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return by_fields(self)  # a compiled frozen class pickles by its constructor


MODEL_PROFILES: dict[str, ModelProfile] = {
    # DeepSeek-V3.2 with sparse attention (DSA top-k 2048), FP8 MLA KV: 656 B latent + ~132 B
    # indexer key per token per layer (brief section 11: about 40-48 KB per token).
    # Lightning indexer: 64 heads x 128 dims, 2 FLOPs per MAC, over every earlier token.
    "ds660b": ModelProfile("ds660b", n_layers=61, kv_bytes_per_token_layer=788, n_heads=128,
                           head_dim=576, active_params=37e9, attention_topk=2048,
                           kv_dtype="fp8", indexer_flops_per_token_layer=2 * 64 * 128),
    # The paper's internal DS 27B (Appendix A.2): 30 layers, 32 heads, top-k 1024. KV size is
    # not given; assumed to use the same FP8 MLA format as DS 660B.
    # Indexer assumed 32 heads x 64 dims (half DS 660B's in both), 2 FLOPs per MAC.
    "ds27b": ModelProfile("ds27b", n_layers=30, kv_bytes_per_token_layer=788, n_heads=32,
                          head_dim=576, active_params=4.2e9, attention_topk=1024,
                          kv_dtype="fp8", indexer_flops_per_token_layer=2 * 32 * 64),
    # Qwen2.5-32B: 64 layers, GQA with 8 KV heads x 128 dims, FP16 K and V = 4 KiB/token/layer.
    "qwen32b": ModelProfile("qwen32b", n_layers=64, kv_bytes_per_token_layer=4096, n_heads=40,
                            head_dim=128, active_params=32.5e9, kv_dtype="fp16"),
    # The embedded runtime's numpy reference model: MODEL_CONFIGS["tiny"].to_profile() (4 layers,
    # 2 KV heads x 32 dims, fp16 K and V) and the larger "bench" size. A test keeps them equal.
    "reference": ModelProfile("reference", n_layers=4, kv_bytes_per_token_layer=256,
                              n_heads=4, head_dim=32, active_params=770560.0, kv_dtype="fp16"),
    "reference-bench": ModelProfile("reference-bench", n_layers=8, kv_bytes_per_token_layer=1024,
                                    n_heads=8, head_dim=64, active_params=23726080.0,
                                    kv_dtype="fp16"),
}

HARDWARE_PROFILES: dict[str, HardwareProfile] = {
    # The paper's testbed: 8 Hopper GPUs, one 400 Gbps CNIC per GPU, one 400 Gbps SNIC per
    # node, about 500 GB/s DRAM, 80 GB DualPath buffer per node (DS models).
    "hopper": HardwareProfile("hopper", gpus_per_node=8, gpu_peak_flops=989e12, mfu=0.4,
                              hbm_bytes=80 * 10**9, snic_bandwidth=50e9, snics_per_node=1,
                              cnic_bandwidth=50e9, dram_bandwidth=500e9,
                              dram_buffer_bytes=80 * 10**9, hbm_bandwidth=3.35e12),
    # One CPU machine emulating a small cluster for the embedded runtime; its "HBM" is DRAM,
    # so HBM bandwidth is the DRAM figure (about 10 GB/s one core streams).
    "cpu": HardwareProfile("cpu", gpus_per_node=1, gpu_peak_flops=50e9, mfu=0.3,
                           hbm_bytes=256 * 2**20, snic_bandwidth=200e6, snics_per_node=1,
                           cnic_bandwidth=1e9, dram_bandwidth=10e9,
                           dram_buffer_bytes=512 * 2**20, hbm_bandwidth=10e9),
}


def get_model_profile(name: str) -> ModelProfile:
    """The built-in model profile ``name``, or a UsageError listing the known ones."""
    return pick(MODEL_PROFILES, name, "model profile")


def get_hardware_profile(name: str) -> HardwareProfile:
    """The built-in hardware profile ``name``, or a UsageError listing the known ones."""
    return pick(HARDWARE_PROFILES, name, "hardware profile")
