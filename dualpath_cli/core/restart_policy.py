"""When a dead engine restarts, and when it stays down: the supervisor's policy, pure.

Why a pure function: the launcher's supervisor (cluster/supervisor.py) only measures time and
spawns processes; the rule itself (exponential backoff, its reset after stable service, the
crash-loop cut-off) is tested here without a process, as a service manager's restart policy
would be (systemd's ``RestartSec``/``StartLimitBurst``, Kubernetes' CrashLoopBackOff).

The rule: the first restart waits ``base_s`` (0.5 s), each further one twice the last, up to
``cap_s`` (30 s). An engine that served ``stable_s`` (60 s) since its last start before it
died again starts the doubling afresh. ``loop_deaths`` (5) deaths within ``loop_window_s``
(60 s) is a crash loop: the engine stays down until the cluster is restarted.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RestartPolicy", "EngineRecord", "RestartDecision", "decide_restart", "CAP_S"]

#: The longest wait between restarts (seconds).
CAP_S = 30.0


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    """The numbers of the rule (seconds and counts)."""

    base_s: float = 0.5
    cap_s: float = CAP_S
    stable_s: float = 60.0
    loop_deaths: int = 5
    loop_window_s: float = 60.0

    def __post_init__(self) -> None:
        if not (self.base_s > 0 and self.cap_s >= self.base_s):
            raise ValueError(f"restart backoff: base {self.base_s!r} s must be more than 0 "
                             f"and at most the cap {self.cap_s!r} s")
        if self.loop_deaths < 1 or not self.loop_window_s > 0 or self.stable_s < 0:
            raise ValueError("restart policy: loop_deaths at least 1, loop_window_s more "
                             "than 0, stable_s at least 0")

    def delay(self, streak: int) -> float:
        """The wait before the restart that follows ``streak`` earlier quick deaths."""
        if streak >= 64:  # 2**64 * base is past any cap; avoid a float overflow
            return self.cap_s
        return min(self.cap_s, self.base_s * 2.0 ** streak)


@dataclass(frozen=True, slots=True)
class EngineRecord:
    """One engine's history as the rule needs it: its recent deaths (monotonic times), the
    restarts since it last served stably, and when its current process started."""

    deaths: tuple[float, ...] = ()
    streak: int = 0
    started_at: float = 0.0


@dataclass(frozen=True, slots=True)
class RestartDecision:
    """``restart`` after ``delay_s``, or not (``crash_loop``: it stays down), with the
    engine's record after this death and the deaths counted in the window."""

    restart: bool
    delay_s: float
    record: EngineRecord
    recent_deaths: int

    @property
    def crash_loop(self) -> bool:
        """It died too often: it stays down."""
        return not self.restart


def decide_restart(policy: RestartPolicy, record: EngineRecord, now: float) -> RestartDecision:
    """The decision for an engine that died at ``now`` (monotonic seconds).

    Deaths older than the window are forgotten; an engine that ran ``stable_s`` since its
    last start starts the backoff afresh (streak 0).
    """
    recent = tuple(t for t in record.deaths if now - t < policy.loop_window_s) + (now,)
    stable = record.started_at > 0 and now - record.started_at >= policy.stable_s
    streak = 0 if stable else record.streak
    if len(recent) >= policy.loop_deaths:
        return RestartDecision(False, 0.0, EngineRecord(recent, streak, record.started_at),
                               len(recent))
    return RestartDecision(True, policy.delay(streak),
                           EngineRecord(recent, streak + 1, record.started_at), len(recent))
