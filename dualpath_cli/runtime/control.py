"""Control of a running scheduler: what may change, and the checks a change must pass.

Why here and not in services/: the scheduler applies the change and runtime/ imports no
service, so the request type lives beside it; the live-cluster service and the HTTP API only
pass it on (the API maps :class:`~dualpath_cli.errors.UsageError` to 422 with its message).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from dualpath_cli.core.policies import POLICIES
from dualpath_cli.errors import UsageError

__all__ = ["SchedulerChange", "Settings", "check_change"]


@dataclass(frozen=True, slots=True)
class SchedulerChange:
    """A requested change of the running scheduler (``None``: leave as is).

    Thresholds in scheduler units: alpha and beta in tokens, the quota in seconds; the read
    side is a read-path policy name of :data:`dualpath_cli.core.policies.POLICIES`.
    """

    alpha_tokens: int | None = None
    beta_tokens: int | None = None
    quota_s: float | None = None
    read_side: str | None = None

    def given(self) -> dict[str, Any]:
        """The fields the change sets, by name."""
        return {k: v for k, v in (("alpha_tokens", self.alpha_tokens),
                                  ("beta_tokens", self.beta_tokens),
                                  ("quota_s", self.quota_s),
                                  ("read_side", self.read_side)) if v is not None}


@dataclass(frozen=True, slots=True)
class Settings:
    """The values a :class:`SchedulerChange` acts on, as in force now."""

    alpha_tokens: int
    beta_tokens: int
    quota_s: float
    read_side: str

    def as_dict(self) -> dict[str, Any]:
        """Plain form (the audit log's old/new)."""
        return {"alpha_tokens": self.alpha_tokens, "beta_tokens": self.beta_tokens,
                "quota_s": self.quota_s, "read_side": self.read_side}


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
        raise UsageError("nothing to change: give alpha_tokens, beta_tokens, quota_s or "
                         "read_side")
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
        name = change.read_side
        if name not in POLICIES:
            raise UsageError(f"read_side: unknown read-side policy {name!r}; choose one of: "
                             f"{', '.join(POLICIES)}")
        out["read_side"] = name
    return out
