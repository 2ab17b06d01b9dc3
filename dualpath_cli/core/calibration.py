"""Simulator calibration: the facts profiles do not hold, and the seam for measured ones.

core/profiles.py describes a model's FLOPs and KV bytes and a node's NICs and HBM bandwidth;
the simulator also needs weight bytes per GPU (for the decode roofline and the HBM left for
KV), per-layer collective latency during decode, and the share of a compute NIC that
model traffic keeps busy. These live here, in one object, so a profile measured on a real
deployment (or on the embedded runtime) can replace them wholesale:
:func:`calibrate_from_measurements` builds the pair (hardware, calibration) from measured
prefill throughput, decode step time and NIC rates.

Every default below is a physical estimate with its source in a comment; none is fitted to a
result table.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from dualpath_cli.core.profiles import HardwareProfile, ModelProfile
from dualpath_cli.errors import ConfigError

__all__ = ["ModelFacts", "SimCalibration", "MODEL_FACTS", "facts_for",
           "calibrate_from_measurements"]


@dataclass(frozen=True, slots=True)
class ModelFacts:
    """Deployment facts of a model that the FLOP profile does not carry.

    Attributes:
        weight_bytes: all weights in bytes as served (FP8 for DS models, BF16 for Qwen).
        expert_parallel: weights are sharded over all GPUs of a role (EP); else each GPU
            holds a full copy (pure DP).
        layer_comm_s: per-layer latency of a decode step's collectives (EP dispatch+combine).
    """

    weight_bytes: float
    expert_parallel: bool
    layer_comm_s: float = 0.0


MODEL_FACTS: dict[str, ModelFacts] = {
    # DeepSeek-V3.2: 671B parameters in FP8; EP over every GPU of a role. Two all-to-alls per
    # layer at ~200 us each under DeepEP low-latency mode (public DeepEP numbers, 8-32 ranks).
    "ds660b": ModelFacts(671e9, True, 2 * 200e-6),
    # DS 27B: 27B parameters in FP8, the same EP layout with fewer ranks (smaller messages).
    "ds27b": ModelFacts(27e9, True, 2 * 120e-6),
    # Qwen2.5-32B: 32.5B BF16 parameters, pure DP (paper A.2: DualPath uses DP only).
    "qwen32b": ModelFacts(65e9, False, 0.0),
    # The runtime's reference model: a few MB.
    "reference": ModelFacts(8e6, False, 0.0),
}


def facts_for(model: ModelProfile) -> ModelFacts:
    """Facts for ``model``; unknown models get BF16 weights of their active parameters, DP."""
    return MODEL_FACTS.get(model.name, ModelFacts(2.0 * model.active_params, False, 0.0))


@dataclass(frozen=True, slots=True)
class SimCalibration:
    """Knobs of the simulator's timing model (seconds, bytes, bytes/s, fractions).

    Attributes:
        hbm_bandwidth: override of the hardware profile's HBM read bandwidth per GPU
            (None: use ``HardwareProfile.hbm_bandwidth``, e.g. hopper 3.35 TB/s).
        hbm_reserve: fraction of HBM kept for activations and allocator slack.
        cnic_model_share: fraction of a compute NIC that model collectives occupy while the
            engine computes; KV traffic gets the rest (the VL arbiter reserves ~99% for model
            traffic only when it is sending). Floor: 1% (the low-priority VL's guarantee).
        snic_efficiency: achieved fraction of storage-NIC line rate (1.0 = 3FS saturates it,
            as the paper states).
        fetch_period_s: how often an engine group's leader fetches while work waits.
        prefill_overhead_s: fixed cost per prefill forward (launch, synchronisation).
        quota_s: PE compute quota (paper A.4: 300 ms).
        alpha_window_s: alpha = tokens the node's SNIC reads in this window (paper: 3 s).
        beta_window_s: beta = tokens one PE processes in this window (paper: 5 s).
        z_factor: the DE high-token factor (paper: 1.05).
        block_tokens: storage block size (paper's example: 64 tokens).
        decode_step_s: if set, a measured decode step time that replaces the roofline.
        host_cores: if set, every engine runs on one host with this many CPU cores (the
            embedded runtime on one machine): while more engines compute than there are
            cores, each computes at ``cores / computing engines`` of its speed (processor
            sharing; a prefill batch's share is fixed when it starts, decode steps are
            re-timed whenever the count changes). None (the default): each engine has its own
            GPU and there is no such contention.
        overhead_per_request: ``prefill_overhead_s`` is paid by every request of a prefill
            batch, not once per batch: the embedded runtime runs each request of a batch as
            its own forward (runtime/prefill.py, a loop over the batch per layer), so its
            fixed cost per forward does not shrink as turns are batched; a GPU batch (the
            default, False) launches its kernels once.
        full_blocks_only: a turn's cache hit is its context rounded down to whole blocks
            (the tail of a partial block is recomputed), as the embedded runtime's store
            does; False (the paper-scale default) counts the whole context as a hit.
    """

    hbm_bandwidth: float | None = None
    hbm_reserve: float = 0.10
    cnic_model_share: float = 0.30
    snic_efficiency: float = 1.0
    fetch_period_s: float = 0.05
    prefill_overhead_s: float = 0.0
    quota_s: float = 0.300
    alpha_window_s: float = 3.0
    beta_window_s: float = 5.0
    z_factor: float = 1.05
    block_tokens: int = 64
    decode_step_s: float | None = None
    full_blocks_only: bool = False
    host_cores: int | None = None
    overhead_per_request: bool = False

    def cnic_kv_rate(self, cnic_bandwidth: float) -> float:
        """Bytes/s a compute NIC gives KV traffic."""
        return cnic_bandwidth * max(0.01, 1.0 - self.cnic_model_share)

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the first impossible value."""
        checks = (
            ("hbm_bandwidth", self.hbm_bandwidth is None or self.hbm_bandwidth > 0),
            ("hbm_reserve", 0 <= self.hbm_reserve < 1),
            ("cnic_model_share", 0 <= self.cnic_model_share <= 1),
            ("snic_efficiency", 0 < self.snic_efficiency <= 1),
            ("fetch_period_s", self.fetch_period_s > 0),
            ("quota_s", self.quota_s > 0),
            ("block_tokens", self.block_tokens >= 1),
            ("z_factor", self.z_factor >= 1),
            ("host_cores", self.host_cores is None or self.host_cores >= 1),
        )
        for name, ok in checks:
            if not ok:
                raise ConfigError(f"simulator calibration: invalid {name} "
                                  f"{getattr(self, name)!r}")


def calibrate_from_measurements(
    hardware: HardwareProfile, *, achieved_flops: float | None = None,
    decode_step_s: float | None = None, snic_rate: float | None = None,
    cnic_rate: float | None = None, dram_rate: float | None = None,
    base: SimCalibration | None = None,
) -> tuple[HardwareProfile, SimCalibration]:
    """A (hardware, calibration) pair from measured rates, for predicting real runs.

    Args:
        hardware: the nominal node profile to start from.
        achieved_flops: measured prefill FLOP/s of one engine (replaces peak x MFU).
        decode_step_s: measured decode step time (replaces the decode roofline).
        snic_rate: measured (shaped) storage-NIC read rate in bytes/s.
        cnic_rate: measured (shaped) compute-NIC rate in bytes/s.
        dram_rate: measured DRAM bandwidth in bytes/s.
        base: calibration to start from (defaults otherwise).
    """
    for name, value in (("achieved_flops", achieved_flops), ("decode_step_s", decode_step_s),
                        ("snic_rate", snic_rate), ("cnic_rate", cnic_rate),
                        ("dram_rate", dram_rate)):
        if value is not None and not value > 0:
            raise ConfigError(f"simulator calibration: measured {name} must be > 0, "
                              f"got {value!r}")
    hw = hardware
    if achieved_flops is not None:
        hw = replace(hw, gpu_peak_flops=achieved_flops, mfu=1.0)
    if snic_rate is not None:
        hw = replace(hw, snic_bandwidth=snic_rate)
    if cnic_rate is not None:
        hw = replace(hw, cnic_bandwidth=cnic_rate)
    if dram_rate is not None:
        hw = replace(hw, dram_bandwidth=dram_rate)
    cal = base or SimCalibration()
    if decode_step_s is not None:
        cal = replace(cal, decode_step_s=decode_step_s)
    return hw, cal
