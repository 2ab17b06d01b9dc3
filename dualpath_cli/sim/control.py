"""The dynamic controllers in simulated time: one step of core's :class:`Controllers` every
``control_interval_s``, measured on the simulated SNICs, GPUs and TTFTs, applied to the
run's alpha, beta and compute quota.
"""

from __future__ import annotations

from dataclasses import replace

from mypy_extensions import mypyc_attr

from dualpath_cli.core.controllers import CONTROLLERS, Controllers, ttft_tail
from dualpath_cli.errors import UsageError
from dualpath_cli.sim.decode import DecodeStage

__all__ = ["ControlStage"]


@mypyc_attr(allow_interpreted_subclasses=True)
class ControlStage(DecodeStage):
    """The controller handlers of :class:`~dualpath_cli.sim.cluster.Simulation`."""

    def _init_control(self) -> None:
        """Check the setup's controllers and set up their state (before the run starts)."""
        setup, cal = self.setup, self.setup.calibration
        unknown = sorted(set(setup.controllers) - set(CONTROLLERS))
        if unknown:
            raise UsageError(f"unknown controller {unknown[0]!r}; choose from "
                             f"{', '.join(CONTROLLERS)}")
        if setup.controllers and not setup.control_interval_s > 0:
            raise UsageError(f"control interval {setup.control_interval_s!r}: must be > 0 s")
        self.controllers = Controllers(
            on={name: name in setup.controllers for name in CONTROLLERS},
            bases={"alpha": float(self.alpha), "beta": float(self.beta),
                   "quota": float(cal.quota_s)},
            minimum={"alpha": 0.0, "beta": float(cal.block_tokens)})
        self.control_steps = []
        self._ctl_values = {"alpha": float(self.alpha), "beta": float(self.beta),
                            "quota": float(cal.quota_s)}
        self._ctl_bytes = []
        self._ctl_busy = []
        self._ttfts = [] if self.controllers.any_on else None

    def _start_control(self) -> None:
        if not self.controllers.any_on:
            return
        self._ctl_bytes = [n.read_bytes for n in self.nodes]
        self._ctl_busy = [p.busy_time for p in self.pes]
        self.loop.at(self.loop.now + self.setup.control_interval_s, self.K_CONTROL, None)

    def _control(self, _: object) -> None:
        """One controller interval: measure, step core's controllers, apply, log."""
        dt = self.setup.control_interval_s
        rate = self.cost.snic_rate * dt
        read = [n.read_bytes for n in self.nodes]
        busy = [p.busy_time for p in self.pes]
        snic = max((b - a) / rate for a, b in zip(self._ctl_bytes, read, strict=True))
        gpu = sum(min(1.0, (b - a) / dt) for a, b in zip(self._ctl_busy, busy, strict=True))
        self._ctl_bytes, self._ctl_busy = read, busy
        ttfts = self._ttfts or []
        self._ttfts = []
        signals = {"snic_util": snic if self._io else None, "gpu_util": gpu / len(busy),
                   "ttft_tail": ttft_tail(ttfts)}
        for step in self.controllers.step(self._ctl_values, signals):
            if not step.moved:
                continue
            self._ctl_values[step.name] = step.new
            self.control_steps.append(step)
        beta = self.beta
        self.alpha = int(round(self._ctl_values["alpha"]))
        self.beta = int(round(self._ctl_values["beta"]))
        self._quota = self._ctl_values["quota"]
        self.params = replace(self.params, alpha=self.alpha, beta=self.beta)
        if self.beta > beta and self.pe_queue:  # PEs that were full may take more now
            for grp in self.pe_groups:
                if not grp.idle:
                    self._wake(grp, self.K_PE_FETCH)
        if self.record or self.turns_done < self._total_turns:
            self.loop.at(self.loop.now + dt, self.K_CONTROL, None)
