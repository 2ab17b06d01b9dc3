"""Turn a PATCH /api/v1/scheduler body into a SchedulerChange, accepting the CLI's units.

Why its own module: the API, ``dualpath tune`` and tests share one reading of "alpha 200K",
"quota 300ms" or "alpha 8KiB", and it needs no server. Values are parsed by
:mod:`dualpath_cli.config.quantities` (the config's own threshold parser, which uses
:mod:`dualpath_cli.units`) and resolved against the *running* system: bytes of KV per token of
its model, its storage-NIC bandwidth (alpha given in seconds of reading), its achieved
FLOP/s (a quota given in FLOPs). A form the running system cannot resolve (beta in seconds of
prefill needs the hardware profile) is refused with the reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from dualpath_cli.config.quantities import parse_alpha, parse_beta, parse_quota
from dualpath_cli.core.policies import ALIASES, POLICIES
from dualpath_cli.core.thresholds import bytes_to_tokens, tokens_readable
from dualpath_cli.errors import UsageError, pick
from dualpath_cli.services.live import SchedulerChange

__all__ = ["SystemUnits", "parse_scheduler_change", "FIELDS"]

#: Fields a PATCH may carry (the ``dynamic_*`` switches turn a dynamic controller on or off).
FIELDS = ("alpha", "beta", "quota", "read_side", "dynamic_alpha", "dynamic_beta",
          "dynamic_quota")


@dataclass(frozen=True, slots=True)
class SystemUnits:
    """What converting thresholds to scheduler units needs to know about the running system.

    Args:
        kv_bytes_per_token: KV bytes of one token over all layers.
        block_tokens: KV block size (beta below one block admits nothing).
        snic_bytes_per_s: a node's storage-NIC bandwidth (0: unshaped, unknown).
        flops_per_s: achieved FLOP/s of the PE predictor (0: unknown).
    """

    kv_bytes_per_token: int
    block_tokens: int
    snic_bytes_per_s: float = 0.0
    flops_per_s: float = 0.0


def _alpha(value: object, u: SystemUnits) -> int:
    t = parse_alpha(value)
    if t.form == "tokens":
        return int(t.amount)
    if t.form == "bytes":
        return bytes_to_tokens(t.amount, u.kv_bytes_per_token)
    if u.snic_bytes_per_s <= 0:
        raise UsageError(f"alpha {value!r}: seconds of reading need the storage-NIC "
                         "bandwidth, and this cluster's is unshaped; give alpha in tokens "
                         "(200K) or bytes (8KiB)")
    return tokens_readable(u.snic_bytes_per_s, u.kv_bytes_per_token, t.amount)


def _beta(value: object, u: SystemUnits) -> int:
    t = parse_beta(value)
    if t.form != "tokens":
        raise UsageError(f"beta {value!r}: the running scheduler takes beta in tokens "
                         "(1M, 800000); seconds of prefill depend on the hardware profile "
                         "(dualpath config show resolves them)")
    tokens = int(t.amount)
    if tokens < u.block_tokens:
        raise UsageError(f"beta {value!r}: {tokens} tokens is below one block "
                         f"({u.block_tokens} tokens), so no request could be admitted")
    return tokens


def _quota(value: object, u: SystemUnits) -> float:
    t = parse_quota(value)
    if t.form == "flops":
        if u.flops_per_s <= 0:
            raise UsageError(f"quota {value!r}: FLOPs need the achieved FLOP/s, which this "
                             "cluster has not measured; give the quota as time (300ms)")
        seconds = t.amount / u.flops_per_s
    else:
        seconds = t.amount
    if not seconds > 0:
        raise UsageError(f"quota {value!r}: the compute quota must be more than zero")
    return seconds


def parse_scheduler_change(body: Mapping[str, object], units: SystemUnits) -> SchedulerChange:
    """The change a PATCH body asks for, in scheduler units.

    Raises:
        UsageError: an unknown field, no field at all, or a bad value (the message names the
            field, the value and what is accepted).
    """
    unknown = sorted(set(body) - set(FIELDS))
    if unknown:
        raise UsageError(f"unknown field {unknown[0]!r}; a change may set: "
                         f"{', '.join(FIELDS)}")
    given = {k: v for k, v in body.items() if v is not None}
    if not given:
        raise UsageError(f"nothing to change; set one or more of: {', '.join(FIELDS)}")
    read_side = given.get("read_side")
    if read_side is not None:
        if not isinstance(read_side, str):
            raise UsageError(f"read_side {read_side!r}: expected a policy name")
        if read_side not in ALIASES:
            pick(POLICIES, read_side, "read-side policy")
    switches: dict[str, bool] = {}
    for key in ("dynamic_alpha", "dynamic_beta", "dynamic_quota"):
        if key in given:
            if not isinstance(given[key], bool):
                raise UsageError(f"{key} {given[key]!r}: expected true or false")
            switches[key] = bool(given[key])
    return SchedulerChange(
        alpha_tokens=_alpha(given["alpha"], units) if "alpha" in given else None,
        beta_tokens=_beta(given["beta"], units) if "beta" in given else None,
        quota_s=_quota(given["quota"], units) if "quota" in given else None,
        read_side=read_side, **switches)
