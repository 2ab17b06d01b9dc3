"""Typed model of one deployment: cluster shape, hardware, model, storage, scheduler.

Every value here is already parsed into base units (bytes, bytes/s, seconds, FLOP/s, tokens),
so code that receives a :class:`Config` never parses a unit again. The three scheduler
thresholds keep the form they were given in (:class:`Threshold`); ``config.resolve`` turns
them into the unit the scheduler compares against.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from dualpath_cli.core.profiles import HardwareProfile, ModelProfile
from dualpath_cli.errors import UsageError
from dualpath_cli.limits import check

__all__ = [
    "PDSpec",
    "parse_pd",
    "ThresholdForm",
    "Threshold",
    "ClusterConfig",
    "HardwareConfig",
    "ModelConfig",
    "StorageConfig",
    "SchedulerConfig",
    "Config",
]

_PD = re.compile(r"^\s*(\d+)\s*P\s*(\d+)\s*D\s*$", re.IGNORECASE)

#: Longest P/D text read: ``int()`` of thousands of digits raises, and none is a real shape.
_PD_CHARS = 64

ThresholdForm = Literal["bytes", "tokens", "seconds", "flops"]


@dataclass(frozen=True, slots=True)
class PDSpec:
    """Prefill and decode node counts, written like the paper's "2P4D"."""

    prefill_nodes: int
    decode_nodes: int

    def __str__(self) -> str:
        return f"{self.prefill_nodes}P{self.decode_nodes}D"

    @property
    def nodes(self) -> int:
        """Total node count."""
        return self.prefill_nodes + self.decode_nodes

    @property
    def ratio(self) -> float:
        """P/D ratio (prefill nodes per decode node)."""
        return self.prefill_nodes / self.decode_nodes


def parse_pd(text: object) -> PDSpec:
    """Parse "1P2D" / "48P96D" into a :class:`PDSpec`.

    The node count is checked against the ``nodes`` limit here, where every command
    (sim, tune, plan, bench, config) reads a shape, so nothing is sized from it first.

    Raises:
        UsageError: for anything that is not ``<n>P<m>D`` with n, m >= 1 (e.g. "2X4D").
        LimitError: more nodes than the ``nodes`` limit (:mod:`dualpath_cli.limits`).
    """
    match = _PD.match(text) if isinstance(text, str) and len(text) <= _PD_CHARS else None
    if not match:
        shown = repr(text) if not isinstance(text, str) or len(text) <= _PD_CHARS else (
            f"of {len(text):,} characters")
        raise UsageError(f"invalid P/D spec {shown}: expected <prefill nodes>P<decode nodes>D, "
                         "e.g. 1P2D or 2P4D")
    prefill, decode = int(match.group(1)), int(match.group(2))
    if prefill < 1 or decode < 1:
        raise UsageError(f"invalid P/D spec {text!r}: needs at least one prefill and one "
                         "decode node")
    check("nodes", prefill + decode, f"P/D spec {prefill}P{decode}D")
    return PDSpec(prefill, decode)


@dataclass(frozen=True, slots=True)
class Threshold:
    """A scheduler threshold as given: its text, its form and the amount in that form's unit.

    ``amount`` is bytes, tokens, seconds or FLOPs according to ``form``.
    """

    text: str
    form: ThresholdForm
    amount: float

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """How many nodes of each role, GPUs (engines) per node, nodes per engine group."""

    pd: PDSpec
    gpus_per_node: int
    nodes_per_group: int
    curve: str
    api_rate_limit: float
    restart: bool = True
    restart_backoff: float = 0.5

    @property
    def prefill_nodes(self) -> int:
        """Prefill (PE) node count."""
        return self.pd.prefill_nodes

    @property
    def decode_nodes(self) -> int:
        """Decode (DE) node count."""
        return self.pd.decode_nodes

    @property
    def nodes(self) -> int:
        """Total node count."""
        return self.pd.nodes

    @property
    def gpus(self) -> int:
        """Total GPU (engine) count."""
        return self.pd.nodes * self.gpus_per_node


@dataclass(frozen=True, slots=True)
class HardwareConfig:
    """One node type. Bandwidths in bytes/s, capacities in bytes, compute in FLOP/s."""

    profile: str
    gpu_peak_flops: float
    mfu: float
    hbm_per_gpu: int
    snic_bandwidth: float
    snics_per_node: int
    cnic_bandwidth: float
    dram_bandwidth: float
    dram_buffer_per_node: int
    hbm_bandwidth: float

    @property
    def node_read_bandwidth(self) -> float:
        """Storage read bandwidth of one node: all its storage NICs together (bytes/s)."""
        return self.snic_bandwidth * self.snics_per_node

    def to_profile(self, gpus_per_node: int) -> HardwareProfile:
        """The core/ profile that cost models and threshold maths take."""
        return HardwareProfile(
            name=self.profile, gpus_per_node=gpus_per_node, gpu_peak_flops=self.gpu_peak_flops,
            mfu=self.mfu, hbm_bytes=self.hbm_per_gpu, snic_bandwidth=self.snic_bandwidth,
            snics_per_node=self.snics_per_node, cnic_bandwidth=self.cnic_bandwidth,
            dram_bandwidth=self.dram_bandwidth, dram_buffer_bytes=self.dram_buffer_per_node,
            hbm_bandwidth=self.hbm_bandwidth)


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """The model facts scheduling needs: KV size per token and the FLOP model's shape."""

    profile: str
    n_layers: int
    kv_bytes_per_token_layer: int
    n_heads: int
    head_dim: int
    active_params: int
    attention_topk: int
    kv_dtype: str
    indexer_flops_per_token_layer: int

    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes of one token over all layers."""
        return self.n_layers * self.kv_bytes_per_token_layer

    def to_profile(self) -> ModelProfile:
        """The core/ profile that cost models and threshold maths take."""
        return ModelProfile(
            name=self.profile, n_layers=self.n_layers,
            kv_bytes_per_token_layer=self.kv_bytes_per_token_layer, n_heads=self.n_heads,
            head_dim=self.head_dim, active_params=float(self.active_params),
            attention_topk=self.attention_topk, kv_dtype=self.kv_dtype,
            indexer_flops_per_token_layer=self.indexer_flops_per_token_layer)


@dataclass(frozen=True, slots=True)
class StorageConfig:
    """Where and how KV blocks are stored."""

    root: str
    replica_roots: tuple[str, ...]
    block_size: int
    dram_cache: int
    layout: str
    codec: str

    @property
    def root_path(self) -> Path:
        """``root`` with ``~`` expanded (relative paths stay relative to the working dir)."""
        return Path(self.root).expanduser()


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Scheduler knobs; thresholds as given (see ``config.resolve`` for tokens/seconds)."""

    alpha: Threshold
    beta: Threshold
    compute_quota: Threshold
    z_factor: float
    read_side: str
    fetch_period: float
    batch_window: float
    no_engine_wait: float
    reference_context: int
    reference_append: int
    layerwise_prefill: bool
    hierarchical: bool
    sub_schedulers: int
    dynamic_alpha: bool
    dynamic_beta: bool
    dynamic_quota: bool
    random_seed: int
    decision_ring: int
    decision_ring_bytes: int
    prefix_cache_tokens: int


@dataclass(frozen=True, slots=True)
class Config:
    """A whole deployment, every value in base units."""

    preset: str
    cluster: ClusterConfig
    hardware: HardwareConfig
    model: ModelConfig
    storage: StorageConfig
    scheduler: SchedulerConfig

    @property
    def hardware_profile(self) -> HardwareProfile:
        """Hardware as a core/ profile (GPUs per node taken from the cluster section)."""
        return self.hardware.to_profile(self.cluster.gpus_per_node)

    @property
    def model_profile(self) -> ModelProfile:
        """Model as a core/ profile."""
        return self.model.to_profile()
