"""Control of a running scheduler: what may change, and the checks a change must pass.

Why here and not in services/: the scheduler applies the change and runtime/ imports no
service, so the request type lives beside it; the live-cluster service and the HTTP API only
pass it on (the API maps :class:`~dualpath_cli.errors.UsageError` to 422 with its message).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from dualpath_cli.core.controllers import CONFIG_KEYS
from dualpath_cli.core.policies import ALIASES, POLICIES
from dualpath_cli.errors import UsageError

__all__ = ["SchedulerChange", "Settings", "check_change"]


@dataclass(frozen=True, slots=True)
class SchedulerChange:
    """A requested change of the running scheduler (``None``: leave as is).

    Thresholds in scheduler units: alpha and beta in tokens, the quota in seconds; the read
    side is a policy name of :data:`dualpath_cli.core.policies.POLICIES` (its read rule is
    applied; layerwise prefill and NIC shaping stay as launched); ``dynamic_*`` turn a
    dynamic controller on or off.
    """

    alpha_tokens: int | None = None
    beta_tokens: int | None = None
    quota_s: float | None = None
    read_side: str | None = None
    dynamic_alpha: bool | None = None
    dynamic_beta: bool | None = None
    dynamic_quota: bool | None = None

    def given(self) -> dict[str, Any]:
        """The fields the change sets, by name."""
        return {k: v for k, v in (("alpha_tokens", self.alpha_tokens),
                                  ("beta_tokens", self.beta_tokens),
                                  ("quota_s", self.quota_s),
                                  ("read_side", self.read_side),
                                  ("dynamic_alpha", self.dynamic_alpha),
                                  ("dynamic_beta", self.dynamic_beta),
                                  ("dynamic_quota", self.dynamic_quota)) if v is not None}


@dataclass(frozen=True, slots=True)
class Settings:
    """The values a :class:`SchedulerChange` acts on, as in force now."""

    alpha_tokens: int
    beta_tokens: int
    quota_s: float
    read_side: str
    controllers: dict[str, bool] | None = None  # controller name -> on

    def as_dict(self) -> dict[str, Any]:
        """Plain form (the audit log's old/new)."""
        on = self.controllers or {}
        return {"alpha_tokens": self.alpha_tokens, "beta_tokens": self.beta_tokens,
                "quota_s": self.quota_s, "read_side": self.read_side,
                **{key: bool(on.get(name)) for name, key in CONFIG_KEYS.items()}}


def _int(name: str, value: object, low: int, why: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise UsageError(f"{name}: expected a whole number of tokens, got {value!r}")
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        raise UsageError(f"{name}: expected a whole number of tokens, got {value!r}")
    if value < low:
        raise UsageError(f"{name}: {int(value)} is below {low} ({why})")
    return int(value)


def check_change(change: SchedulerChange, block_tokens: int) -> dict[str, Any]:
    """The validated values ``change`` sets (``{field: value}``).

    Raises:
        UsageError: nothing to change, or a value out of range, with the field and reason.
    """
    given = change.given()
    if not given:
        raise UsageError("nothing to change: give alpha_tokens, beta_tokens, quota_s, "
                         "read_side, dynamic_alpha, dynamic_beta or dynamic_quota")
    out: dict[str, Any] = {}
    if change.alpha_tokens is not None:
        out["alpha_tokens"] = _int("alpha_tokens", change.alpha_tokens, 0,
                                   "a read queue length in tokens")
    if change.beta_tokens is not None:
        out["beta_tokens"] = _int("beta_tokens", change.beta_tokens, block_tokens,
                                  f"beta must allow at least one block of {block_tokens} "
                                  "tokens")
    if change.quota_s is not None:
        q = change.quota_s
        if isinstance(q, bool) or not isinstance(q, int | float) or not math.isfinite(q) \
                or q <= 0:
            raise UsageError(f"quota_s: expected a positive number of seconds, got {q!r}")
        out["quota_s"] = float(q)
    if change.read_side is not None:
        name = ALIASES.get(change.read_side, change.read_side)
        if name not in POLICIES:
            raise UsageError(f"read_side: unknown read-side policy {name!r}; choose one of: "
                             f"{', '.join(POLICIES)}")
        out["read_side"] = name
    for key in CONFIG_KEYS.values():
        value = getattr(change, key)
        if value is not None:
            if not isinstance(value, bool):
                raise UsageError(f"{key}: expected true or false, got {value!r}")
            out[key] = value
    return out
