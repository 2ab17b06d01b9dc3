"""The dynamic controllers, on a schedule and bounded: alpha, beta and the compute quota.

Pure (no clock, no threads): the caller says when an interval has passed and hands in what it
measured over it. The runtime's scheduler (``runtime/scheduler.py``) and the simulator
(``sim/control.py``) both call :meth:`Controllers.step` once per interval, so a controller is
written once and measured in both worlds.

Each controller applies its rule from :mod:`.thresholds` to the value in force, then bounds
the step: never below the floor or above the ceiling (fractions of the base value, the
configured or last operator-set one), and never more than ``max_change`` of the value per
interval. A step is returned with its inputs whether or not it moved the value; callers log
the moves (the decision log) and show the last step of each (``/api/v1/status``).

========  ===================  ===========================================================
name      signal               rule (per interval)
========  ===================  ===========================================================
alpha     ``snic_util``        x0.9 above 80% busiest storage-NIC utilisation, x1.1 below
                               50% (the seed's ``dynamic_alpha``)
beta      ``gpu_util``         x0.9 above 90% mean PE GPU utilisation, x1.1 below 60% (seed
                               5.3: "adjust the unfinished-token limit from GPU utilisation")
quota     ``ttft_tail``        x0.9 when TTFT p99/p50 of the interval's turns is above 4,
                               x1.1 below 2 (seed 6.2: "dynamic quota adjustment")
========  ===================  ===========================================================
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from dualpath_cli.core.thresholds import dynamic_alpha, dynamic_beta, dynamic_quota

__all__ = ["ControllerRule", "CONTROLLERS", "CONFIG_KEYS", "Bounds", "ControlStep",
           "Controllers", "ttft_tail", "TAIL_MIN_TURNS"]

TAIL_MIN_TURNS = 8
"""Fewest finished turns in an interval for a TTFT tail ratio (fewer: no signal)."""


@dataclass(frozen=True, slots=True)
class ControllerRule:
    """One controller: the value it moves, its signal, its rule and its default bounds.

    ``floor_x``/``ceiling_x`` are multiples of the base value; ``max_change`` the largest
    relative change of one step; ``minimum`` an absolute floor (beta: one block).
    """

    name: str
    signal: str
    rule: Callable[..., float]
    floor_x: float = 0.25
    ceiling_x: float = 4.0
    max_change: float = 0.1
    doc: str = ""


CONTROLLERS: Mapping[str, ControllerRule] = MappingProxyType({
    "alpha": ControllerRule("alpha", "snic_util", dynamic_alpha,
                            doc="alpha follows the busiest storage NIC's utilisation"),
    "beta": ControllerRule("beta", "gpu_util", dynamic_beta,
                           doc="beta follows the prefill engines' GPU utilisation"),
    "quota": ControllerRule("quota", "ttft_tail", dynamic_quota,
                            doc="the compute quota follows the TTFT tail (p99/p50)"),
})
"""Every controller, by the value it moves."""

CONFIG_KEYS: Mapping[str, str] = MappingProxyType({
    "alpha": "dynamic_alpha", "beta": "dynamic_beta", "quota": "dynamic_quota"})
"""The on/off switch of each controller (config key in ``scheduler.``, PATCH field)."""


@dataclass(frozen=True, slots=True)
class Bounds:
    """Where a controller may take its value: ``[floor, ceiling]``, ``max_change`` per step."""

    floor: float
    ceiling: float
    max_change: float

    @classmethod
    def around(cls, rule: ControllerRule, base: float, minimum: float = 0.0) -> Bounds:
        """The bounds of ``rule`` around ``base`` (never below ``minimum``)."""
        floor = max(minimum, base * rule.floor_x)
        return cls(floor, max(floor, base * rule.ceiling_x), rule.max_change)


@dataclass(frozen=True, slots=True)
class ControlStep:
    """One controller step: its inputs (signal, value, bounds) and what it decided."""

    name: str
    signal_name: str
    signal: float | None
    old: float
    new: float
    floor: float
    ceiling: float
    max_change: float
    reason: str

    @property
    def moved(self) -> bool:
        """Whether the value changed."""
        return self.new != self.old

    def to_dict(self) -> dict[str, Any]:
        """Plain form (decision-log inputs, status)."""
        return {"controller": self.name, "signal_name": self.signal_name,
                "signal": self.signal, "old": self.old, "new": self.new,
                "floor": self.floor, "ceiling": self.ceiling,
                "max_change": self.max_change, "reason": self.reason}


def _bounded(rule: ControllerRule, current: float, signal: float | None,
             b: Bounds) -> tuple[float, str]:
    """The rule's value clamped to ``[floor, ceiling]``, then at most ``max_change`` away
    from ``current`` (a value outside the bounds walks back in, one bounded step at a time)."""
    if signal is None or not math.isfinite(signal) or signal < 0:
        return current, "hold: no signal"
    wanted = rule.rule(current, signal, lo=0.0, hi=math.inf)
    target = min(b.ceiling, max(b.floor, wanted))
    step = b.max_change * current
    new = min(current + step, max(current - step, target))
    if new == current:
        return new, "hold: at bound" if wanted != current else "hold: signal in band"
    if wanted != current and (new > current) == (wanted > current):
        return new, "up: signal below band" if new > current else "down: signal above band"
    return new, "up: back above the floor" if new > current else "down: back below the ceiling"


@dataclass
class Controllers:
    """Which controllers are on, their bounds, and their last steps.

    Args:
        on: controller name -> on (names of :data:`CONTROLLERS`; missing: off).
        bases: controller name -> base value (the configured one); sets the bounds.
        minimum: controller name -> absolute floor (beta: one block of tokens).
    """

    on: dict[str, bool] = field(default_factory=dict)
    bases: dict[str, float] = field(default_factory=dict)
    minimum: dict[str, float] = field(default_factory=dict)
    last: dict[str, ControlStep] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = sorted(set(self.on) - set(CONTROLLERS))
        if unknown:
            raise ValueError(f"unknown controller {unknown[0]!r}; known: "
                             f"{', '.join(CONTROLLERS)}")

    @property
    def any_on(self) -> bool:
        """Whether at least one controller is on."""
        return any(self.on.values())

    def bounds(self, name: str) -> Bounds:
        """The bounds of controller ``name`` around its base."""
        return Bounds.around(CONTROLLERS[name], self.bases[name], self.minimum.get(name, 0.0))

    def rebase(self, name: str, base: float) -> None:
        """A new base value (an operator set it): the bounds follow it."""
        self.bases[name] = base

    def step(self, values: Mapping[str, float],
             signals: Mapping[str, float | None]) -> list[ControlStep]:
        """One interval: a step of every controller that is on (``values``: in force now).

        ``signals`` maps a signal name (``snic_util``, ``gpu_util``, ``ttft_tail``) to what
        was measured over the interval, ``None`` when nothing was (the value then holds).
        """
        out = []
        for name, rule in CONTROLLERS.items():
            if not self.on.get(name):
                continue
            b = self.bounds(name)
            current = values[name]
            signal = signals.get(rule.signal)
            new, why = _bounded(rule, current, signal, b)
            s = ControlStep(name, rule.signal, signal, current, new, b.floor, b.ceiling,
                            b.max_change, why)
            self.last[name] = s
            out.append(s)
        return out

    def state(self) -> dict[str, dict[str, Any]]:
        """Each controller: on/off, its bounds and its last step (status, view)."""
        out: dict[str, dict[str, Any]] = {}
        for name in CONTROLLERS:
            entry: dict[str, Any] = {"on": bool(self.on.get(name))}
            if name in self.bases:
                b = self.bounds(name)
                entry.update(floor=b.floor, ceiling=b.ceiling, max_change=b.max_change)
            last = self.last.get(name)
            entry["last"] = last.to_dict() if last is not None else None
            out[name] = entry
        return out


def ttft_tail(ttfts: Iterable[float]) -> float | None:
    """p99 / p50 of ``ttfts`` (nearest rank); ``None`` under :data:`TAIL_MIN_TURNS` turns or
    a zero median."""
    xs = sorted(ttfts)
    n = len(xs)
    if n < TAIL_MIN_TURNS:
        return None
    p50 = xs[(n - 1) // 2]
    p99 = xs[min(n - 1, math.ceil(0.99 * n) - 1)]
    return p99 / p50 if p50 > 0 else None
