"""The GPU timing model: roofline prefill, layerwise overlap, memory-bound decode.

Why these shapes (paper sections 2, 4, 6.5):

* prefill is compute-bound: ``time = FLOPs / (peak x MFU)`` with the FLOP model of
  :mod:`dualpath_cli.core.profiles` (linear layers plus attention over the cached context);
* layerwise prefill loads layer ``l+1``'s KV while layer ``l`` computes, so a batch takes the
  first layer's load plus ``n_layers x max(load per layer, compute per layer)``;
* without layerwise prefill the whole batch's KV must be copied into HBM first, so loading
  and compute add up (the paper's Basic);
* decode is memory-bound: each step reads the GPU's weights and the attended KV of every
  request in the batch from HBM, plus per-layer collective latency for EP models.

Pure, so it lives in core/: the simulator runs on it and the emulated cluster
(``cluster/emulated.py``) times its engines with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dualpath_cli.core.calibration import SimCalibration, facts_for
from dualpath_cli.core.frozen import by_fields
from dualpath_cli.core.profiles import HardwareProfile, ModelProfile
from dualpath_cli.core.quota import Predictor, flops_predictor
from dualpath_cli.errors import ConfigError

__all__ = ["CostModel", "build_cost_model"]


@dataclass(frozen=True, slots=True)
class CostModel:
    """Pre-computed rates for one (model, hardware, cluster) combination.

    All times in seconds, sizes in bytes, capacities in tokens.
    """

    model: ModelProfile
    hardware: HardwareProfile
    calibration: SimCalibration
    flops: float                   # achieved FLOP/s of one GPU
    kv_bytes_per_token: int        # all layers
    n_layers: int
    pe_hbm_tokens: int             # KV capacity of one PE's HBM
    de_hbm_tokens: int             # KV capacity of one DE's HBM
    snic_rate: float               # bytes/s one node's storage NIC reads
    dram_bandwidth: float          # bytes/s one node's DRAM moves (reads + writes)
    cnic_kv_rate: float            # bytes/s of a compute NIC left for KV
    decode_base_s: float           # weights read + collectives per decode step
    hbm_bandwidth: float           # bytes/s one GPU reads from HBM
    topk: int                      # 0 = dense attention
    predictor: Predictor           # (cached, bsz) -> attention time, for the quota

    def prefill_s(self, cached: int, bsz: int) -> float:
        """Compute time of a chunk of ``bsz`` new tokens after ``cached`` ones."""
        return self.model.prefill_flops(cached, bsz) / self.flops

    def batch_s(self, compute_s: float, load_bytes: float, layerwise: bool) -> float:
        """A prefill forward: compute plus loading ``load_bytes`` of KV into HBM.

        Layerwise: first layer's load, then each layer at max(load, compute). Otherwise the
        load precedes the compute.
        """
        load_s = load_bytes / self.cnic_kv_rate
        overhead = self.calibration.prefill_overhead_s
        if not layerwise:
            return overhead + load_s + compute_s
        return overhead + load_s / self.n_layers + max(load_s, compute_s)

    def decode_step_s(self, batch: int, attended_tokens: int) -> float:
        """One decode step of ``batch`` requests attending to ``attended_tokens`` in total."""
        fixed = self.calibration.decode_step_s
        if fixed is not None:
            return fixed
        kv = attended_tokens * self.kv_bytes_per_token / self.hbm_bandwidth
        linear = self.model.linear_flops(batch) / self.flops
        return self.decode_base_s + max(kv, linear)

    def attended(self, context: int) -> int:
        """Tokens one decode step of a request with ``context`` tokens attends to."""
        return min(context, self.topk) if self.topk > 0 else context

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return by_fields(self)  # a compiled frozen class pickles by its constructor


def _kv_tokens(hbm: int, reserve: float, weights: float, kv_per_token: int) -> int:
    free = hbm * (1.0 - reserve) - weights
    return int(free // kv_per_token) if free > 0 else 0


def build_cost_model(model: ModelProfile, hardware: HardwareProfile,
                     calibration: SimCalibration, prefill_nodes: int,
                     decode_nodes: int) -> CostModel:
    """Resolve every rate the simulator needs for a ``prefill_nodes``P``decode_nodes``D cluster.

    Raises:
        ConfigError: when the weights leave no HBM for KV on either role.
    """
    calibration.validate()
    facts = facts_for(model)
    g = hardware.gpus_per_node
    kvpt = model.kv_bytes_per_token
    if facts.expert_parallel:
        pe_w = facts.weight_bytes / (prefill_nodes * g)
        de_w = facts.weight_bytes / (decode_nodes * g)
    else:
        pe_w = de_w = facts.weight_bytes
    pe_tokens = _kv_tokens(hardware.hbm_bytes, calibration.hbm_reserve, pe_w, kvpt)
    de_tokens = _kv_tokens(hardware.hbm_bytes, calibration.hbm_reserve, de_w, kvpt)
    if de_tokens <= 0 or pe_tokens <= 0:
        raise ConfigError(
            f"model {model.name!r} leaves no HBM for KV on {hardware.name!r} at "
            f"{prefill_nodes}P{decode_nodes}D (weights {pe_w / 1e9:.1f} GB per PE, "
            f"{de_w / 1e9:.1f} GB per DE, HBM {hardware.hbm_bytes / 1e9:.0f} GB)")
    flops = hardware.gpu_flops
    hbm_bw = (calibration.hbm_bandwidth if calibration.hbm_bandwidth is not None
              else hardware.hbm_bandwidth)
    base = de_w / hbm_bw + model.n_layers * facts.layer_comm_s
    return CostModel(
        model=model, hardware=hardware, calibration=calibration, flops=flops,
        kv_bytes_per_token=kvpt, n_layers=model.n_layers, pe_hbm_tokens=pe_tokens,
        de_hbm_tokens=de_tokens,
        snic_rate=hardware.snic_bandwidth * hardware.snics_per_node
        * calibration.snic_efficiency,
        dram_bandwidth=hardware.dram_bandwidth,
        cnic_kv_rate=calibration.cnic_kv_rate(hardware.cnic_bandwidth),
        decode_base_s=base, hbm_bandwidth=hbm_bw, topk=model.attention_topk,
        predictor=flops_predictor(model, flops),
    )
