"""The scheduler's thresholds while it runs: an operator's changes and the controllers' steps.

:meth:`ThresholdControl.update` changes alpha, beta, the PE quota, the read side and which
dynamic controllers are on; every ``control_interval_s`` the loop calls
:meth:`ThresholdControl._control`, which measures (the busiest storage NIC's utilisation, the
PEs' GPU utilisation, the TTFT tail), steps core's controllers and logs each move.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from typing import Any

from dualpath_cli.core.controllers import CONFIG_KEYS, CONTROLLERS, ControlStep, ttft_tail
from dualpath_cli.core.policies import get_policy
from dualpath_cli.core.types import Role
from dualpath_cli.errors import UsageError
from dualpath_cli.runtime.control import SchedulerChange, Settings, check_change
from dualpath_cli.runtime.sched_core import SchedulerCore
from dualpath_cli.runtime.wire import SetQuota

__all__ = ["ThresholdControl"]


class ThresholdControl(SchedulerCore):
    """Settings, updates and controller steps of a scheduler (module doc)."""

    def settings(self) -> Settings:
        """The values a :class:`SchedulerChange` acts on, as in force now."""
        with self._lock:
            return Settings(self.params.alpha, self.params.beta, self.quota_s, self.read_side,
                            {name: bool(self.controllers.on.get(name)) for name in CONTROLLERS})

    def update(self, change: SchedulerChange) -> tuple[dict[str, Any], dict[str, Any]]:
        """Apply ``change``; returns ``(old, new)`` of the fields it set.

        Decisions after this one use the new values (and log them in their inputs); their
        source becomes ``api``. A new quota is sent to every live PE.

        Raises:
            UsageError: nothing to change, or a bad value (the message says which and why).
        """
        values = check_change(change, self.bt)
        if "read_side" in values:
            row = get_policy(values["read_side"])
            if row.shaped != self.shaped:
                raise UsageError(f"read_side: {row.name!r} "
                                 f"{'shapes' if row.shaped else 'does not shape'} the NICs, "
                                 "which is fixed at launch; choose a policy that "
                                 f"{'shapes' if self.shaped else 'does not shape'} them")
        with self._lock:
            before = self.settings().as_dict()
            params = self.params
            if "alpha_tokens" in values:
                params = dataclasses.replace(params, alpha=values["alpha_tokens"])
                self.sources["alpha"] = "api"
                self._rebase("alpha", values["alpha_tokens"])
            if "beta_tokens" in values:
                params = dataclasses.replace(params, beta=values["beta_tokens"])
                self.sources["beta"] = "api"
                self._rebase("beta", values["beta_tokens"])
            self.params = params
            if "read_side" in values:
                self.read_side = values["read_side"]
                self.policy = get_policy(self.read_side)
                self.sources["read_side"] = "api"
            if "quota_s" in values:
                self._set_quota(values["quota_s"], "api")
                self._rebase("quota", values["quota_s"])
            for name, key in CONFIG_KEYS.items():
                if key in values:
                    if values[key] and not self.controllers.on.get(name):
                        self._ctl_next = time.monotonic() + self.control_interval_s
                    self.controllers.on[name] = values[key]
            after = self.settings().as_dict()
        return {k: before[k] for k in values}, {k: after[k] for k in values}

    def _rebase(self, name: str, value: float) -> None:
        """An operator set ``name``: its controller starts from it, bounded around it."""
        self._ctl_values[name] = float(value)
        self.controllers.rebase(name, float(value))

    def _set_quota(self, quota_s: float, source: str) -> None:
        self.quota_s = quota_s
        self.sources["quota"] = source
        for e in self.engines.values():
            if e.alive and e.address and e.role == Role.PREFILL.value:
                self._send(e.address, SetQuota(self.quota_s))

    # -- dynamic controllers ------------------------------------------------------------
    def control_signals(self) -> dict[str, float | None]:
        """What the controllers see now: the busiest storage NIC's utilisation, the PEs'
        mean GPU utilisation (heartbeat windows) and the TTFT tail of the turns finished
        since the last step (``None``: not measured)."""
        with self._lock:
            return self._signals(consume=False)

    def _signals(self, consume: bool) -> dict[str, float | None]:
        by_node: dict[int, list[float | None]] = collections.defaultdict(list)
        gpu: list[float] = []
        for e in self.engines.values():
            if not e.alive or e.hb is None:
                continue
            by_node[e.node].append(e.snic_rate.rate)
            if e.role == Role.PREFILL.value and e.gpu_rate.rate is not None:
                gpu.append(min(1.0, e.gpu_rate.rate))
        snic: float | None = None
        if self.snic_bw > 0 and by_node:
            utils = [sum(r for r in rates if r is not None)
                     / (self.snic_bw * self.snic_scale.get(node, 1.0))
                     for node, rates in by_node.items() if any(r is not None for r in rates)]
            snic = max(utils) if utils else None
        tail = ttft_tail(self._ttfts)
        if consume:
            self._ttfts = []
        return {"snic_util": snic, "gpu_util": sum(gpu) / len(gpu) if gpu else None,
                "ttft_tail": tail}

    def _control(self, now: float) -> list[ControlStep]:
        """One controller interval: measure, step core's controllers, apply and log moves."""
        self._ctl_next = now + self.control_interval_s
        signals = self._signals(consume=True)
        steps = self.controllers.step(self._ctl_values, signals)
        for step in steps:
            if not step.moved:
                continue
            self._ctl_values[step.name] = step.new
            if step.name == "alpha":
                self.params = dataclasses.replace(self.params, alpha=int(round(step.new)))
                self.sources["alpha"] = "controller"
            elif step.name == "beta":
                self.params = dataclasses.replace(self.params, beta=int(round(step.new)))
                self.sources["beta"] = "controller"
            else:
                self._set_quota(step.new, "controller")
            self.log.record_control(
                at=time.time(), name=step.name, inputs={
                    **step.to_dict(), "signals": dict(signals),
                    "alpha": self.params.alpha, "beta": self.params.beta,
                    "quota_s": self.quota_s, "interval_s": self.control_interval_s})
        return steps
