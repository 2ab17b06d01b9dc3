"""Resolve the scheduler thresholds into the units the scheduler compares against.

* alpha -> tokens: bytes / KV bytes per token (all layers); or, for seconds, the tokens one
  node's storage NICs read in that window (the paper's rule, ``tokens_readable``).
* beta -> tokens: as given; or, for seconds, the *prompt* tokens one GPU prefills in that
  window (``tokens_processable``) at core's ``HardwareProfile.prompt_tokens_per_s`` for a
  reference turn of ``scheduler.reference_append`` new tokens after
  ``scheduler.reference_context`` cached ones. Prompt tokens because PE fetch charges a
  request's whole prompt to ``tok``; the simulator and ``tune beta`` use the same formula.
* compute quota -> seconds: as given; or FLOPs / achieved GPU FLOP/s (peak x MFU).

Both the given form and the resolved value are kept, so ``config show`` can print both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dualpath_cli.config.model import Config, Threshold
from dualpath_cli.core.profiles import HardwareProfile, ModelProfile
from dualpath_cli.core.thresholds import bytes_to_tokens, tokens_processable, tokens_readable
from dualpath_cli.errors import ConfigError
from dualpath_cli.units import (
    format_bandwidth,
    format_duration,
    format_flops,
    format_tokens,
)

__all__ = [
    "ResolvedValue",
    "ResolvedScheduler",
    "ThresholdError",
    "resolve_alpha",
    "resolve_beta",
    "resolve_quota",
    "resolve_scheduler",
]


class ThresholdError(ConfigError):
    """A threshold that resolves to an impossible value; ``key`` names it."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"{key}: {reason}")
        self.key = key
        self.reason = reason


@dataclass(frozen=True, slots=True)
class ResolvedValue:
    """A threshold as given and as the scheduler uses it."""

    given: str
    form: str
    value: float
    unit: str
    derivation: str

    def to_dict(self) -> dict[str, Any]:
        """JSON form used by ``config show --json``."""
        return {"given": self.given, "form": self.form, "value": self.value,
                "unit": self.unit, "derivation": self.derivation}


@dataclass(frozen=True, slots=True)
class ResolvedScheduler:
    """alpha and beta in tokens, the compute quota in seconds."""

    alpha: ResolvedValue
    beta: ResolvedValue
    compute_quota: ResolvedValue

    @property
    def alpha_tokens(self) -> int:
        """Short-read-queue threshold in tokens."""
        return int(self.alpha.value)

    @property
    def beta_tokens(self) -> int:
        """Unfinished-token limit in tokens."""
        return int(self.beta.value)

    @property
    def compute_quota_s(self) -> float:
        """Compute quota per batch in seconds of predicted attention time."""
        return self.compute_quota.value

    def to_dict(self) -> dict[str, Any]:
        """JSON form used by ``config show --json``."""
        return {"alpha": self.alpha.to_dict(), "beta": self.beta.to_dict(),
                "compute_quota": self.compute_quota.to_dict()}


def resolve_alpha(threshold: Threshold, model: ModelProfile,
                  hardware: HardwareProfile) -> ResolvedValue:
    """Alpha in tokens from bytes, tokens or seconds of reading."""
    per_token = model.kv_bytes_per_token
    if threshold.form == "bytes":
        tokens = bytes_to_tokens(threshold.amount, per_token)
        how = f"{int(threshold.amount)} B / {per_token} B of KV per token"
        if tokens == 0:
            how += " (less than one token: every non-empty read queue counts as long)"
    elif threshold.form == "seconds":
        bandwidth = hardware.snic_bandwidth * hardware.snics_per_node
        tokens = tokens_readable(bandwidth, per_token, threshold.amount)
        how = (f"{format_duration(threshold.amount)} x {format_bandwidth(bandwidth)} "
               f"({hardware.snics_per_node} storage NIC(s)) / {per_token} B of KV per token")
    elif threshold.form == "tokens":
        tokens, how = int(threshold.amount), "given in tokens"
    else:
        raise ThresholdError("scheduler.alpha", f"cannot be given in {threshold.form}")
    return ResolvedValue(threshold.text, threshold.form, tokens, "tokens", how)


def resolve_beta(threshold: Threshold, model: ModelProfile, hardware: HardwareProfile,
                 reference_context: int, reference_append: int = 429) -> ResolvedValue:
    """Beta in tokens from tokens or seconds of one GPU's prefill work (module doc)."""
    if threshold.form == "seconds":
        rate = hardware.prompt_tokens_per_s(model, reference_context, reference_append)
        tokens = tokens_processable(rate, threshold.amount)
        how = (f"{format_duration(threshold.amount)} x {rate:.4g} prompt tokens/s per GPU "
               f"(prefill of {format_tokens(reference_append)} new tokens after "
               f"{format_tokens(reference_context)} cached)")
    elif threshold.form == "tokens":
        tokens, how = int(threshold.amount), "given in tokens"
    else:
        raise ThresholdError("scheduler.beta", f"cannot be given in {threshold.form}")
    return ResolvedValue(threshold.text, threshold.form, tokens, "tokens", how)


def resolve_quota(threshold: Threshold, hardware: HardwareProfile) -> ResolvedValue:
    """Compute quota in seconds from time or FLOPs."""
    if threshold.form == "flops":
        seconds = threshold.amount / hardware.gpu_flops
        how = (f"{format_flops(threshold.amount)} / {format_flops(hardware.gpu_flops)}/s "
               "achieved per GPU")
    elif threshold.form == "seconds":
        seconds, how = threshold.amount, "given in seconds"
    else:
        raise ThresholdError("scheduler.compute_quota", f"cannot be given in {threshold.form}")
    return ResolvedValue(threshold.text, threshold.form, seconds, "seconds", how)


def resolve_scheduler(config: Config) -> ResolvedScheduler:
    """Resolve and check all three thresholds of ``config``.

    Raises:
        ThresholdError: beta below one block (no request could ever be admitted) or a zero
            compute quota.
    """
    model, hardware = config.model_profile, config.hardware_profile
    sched = config.scheduler
    resolved = ResolvedScheduler(
        alpha=resolve_alpha(sched.alpha, model, hardware),
        beta=resolve_beta(sched.beta, model, hardware, sched.reference_context,
                          sched.reference_append),
        compute_quota=resolve_quota(sched.compute_quota, hardware),
    )
    block = config.storage.block_size
    if resolved.beta_tokens < block:
        raise ThresholdError("scheduler.beta", f"{sched.beta.text} resolves to "
                             f"{resolved.beta_tokens} tokens, below one block ({block} tokens): "
                             "no engine could ever take a request")
    if resolved.compute_quota_s <= 0:
        raise ThresholdError("scheduler.compute_quota", f"{sched.compute_quota.text} must be "
                             "greater than zero")
    return resolved
