"""Live tuning of a running cluster: what is in force, change it, undo it, guard a change.

Why a service and not the CLI: ``dualpath tune show/set/rollback/auto`` and the TUI make the
same decisions (which audit entry a rollback undoes, when a guarded change is rolled back),
and they are tested against :class:`~dualpath_cli.api.fake.FakeClient` without a terminal.
Everything goes through the API client (a :class:`TuneClient`), never the runtime.

Units: a PATCH takes the CLI's forms (``200K``, ``300ms``, ``3s`` of reading); the audit log
and ``/api/v1/status`` give scheduler units (tokens, seconds), which a rollback sends back as
plain numbers.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from dualpath_cli.errors import DualPathError, UsageError
from dualpath_cli.telemetry.status import Status
from dualpath_cli.telemetry.view import AuditEntry, ClusterView, Thresholds

__all__ = ["TuneClient", "LIVE_KEYS", "CONTROLLER_FIELDS", "live_body", "scheduler_audit",
           "rollback_body", "restore_body", "Throughput", "GuardResult", "guard_change",
           "client_controller_step", "settings_of"]

#: ``tune set`` names -> PATCH /api/v1/scheduler fields (what a running scheduler changes).
LIVE_KEYS: dict[str, str] = {"alpha": "alpha", "beta": "beta", "compute_quota": "quota",
                             "quota": "quota", "read_side": "read_side"}

#: Controller switches ``tune auto`` asks the server for (runtime/control.py's names).
CONTROLLER_FIELDS = ("dynamic_alpha", "dynamic_beta", "dynamic_quota")

#: Audit/old-value keys (server: scheduler units; the fake: field names) -> PATCH fields.
_OLD_TO_FIELD = {"alpha_tokens": "alpha", "alpha": "alpha", "beta_tokens": "beta",
                 "beta": "beta", "quota_s": "quota", "quota": "quota",
                 "read_side": "read_side"}


class TuneClient(Protocol):
    """What live tuning needs of a client: a structural subset of the API's
    ``ClusterClient`` (api/protocol.py; services cannot import the API), which
    DualPathClient and FakeClient both implement."""

    def status(self) -> Status: ...

    def view(self) -> ClusterView: ...

    def metrics_text(self) -> str: ...

    def patch_scheduler(self, body: Mapping[str, object]) -> AuditEntry: ...


def settings_of(th: Thresholds) -> dict[str, Any]:
    """The PATCH body that would restore ``th`` (scheduler units)."""
    return {"alpha": int(th.alpha_tokens), "beta": int(th.beta_tokens),
            "quota": float(th.quota_s), "read_side": th.read_side}


def live_body(assignments: Mapping[str, str]) -> dict[str, str]:
    """PATCH fields from ``tune set`` KEY=VALUE texts (names as :data:`LIVE_KEYS`).

    Raises:
        UsageError: a key a running scheduler cannot change (``z_factor``: it is read once
            at launch), naming what can.
    """
    body: dict[str, str] = {}
    for key, text in assignments.items():
        name = key.removeprefix("scheduler.")
        if name not in LIVE_KEYS:
            raise UsageError(f"tune set: {name} cannot change on a running cluster (set it in "
                             f"the config and relaunch, or use --config FILE); live keys: "
                             f"{', '.join(k for k in LIVE_KEYS if k != 'quota')}")
        body[LIVE_KEYS[name]] = text
    return body


def scheduler_audit(audit: Sequence[AuditEntry]) -> list[AuditEntry]:
    """The audit entries that changed the scheduler, oldest first."""
    return [a for a in audit if a.action == "scheduler"]


def restore_body(old: Mapping[str, Any]) -> dict[str, Any]:
    """The PATCH body that puts back an audit entry's ``old`` values (unknown keys, such as
    a controller switch, pass through as they are)."""
    return {_OLD_TO_FIELD.get(k, k): v for k, v in old.items() if v is not None}


def rollback_body(audit: Sequence[AuditEntry]) -> tuple[AuditEntry, dict[str, Any]]:
    """The last scheduler change and the body that undoes it.

    A rollback is itself a change, so a second rollback undoes the first (as ``git revert``
    does); the audit log keeps both.

    Raises:
        UsageError: no scheduler change in the audit log.
    """
    changes = scheduler_audit(audit)
    if not changes:
        raise UsageError("tune rollback: the audit log has no scheduler change to undo "
                         "(the thresholds are still the launch's)")
    last = changes[-1]
    body = restore_body(last.old)
    if not body:
        raise UsageError(f"tune rollback: audit entry {last.seq} recorded no previous values")
    return last, body


# --- throughput and TTFT over a window -------------------------------------------------------
@dataclass(frozen=True, slots=True)
class _Point:
    at: float
    turns: float          # cumulative turns served (first tokens), or decisions made
    ttft_sum: float | None
    ttft_count: float | None


@dataclass
class Throughput:
    """Turns per second and mean TTFT over the last ``window_s`` of samples.

    Turns are counted by the TTFT histogram's count (first tokens sent) when ``/metrics``
    has it, else by the scheduler's decision count.
    """

    window_s: float
    points: deque[_Point] = field(default_factory=deque)

    def add(self, view: ClusterView, metrics_text: str | None) -> None:
        """Add one sample (a view and, when fetched, the ``/metrics`` page)."""
        from dualpath_cli.telemetry.recording import extras_from_metrics_text

        ex = extras_from_metrics_text(metrics_text) if metrics_text else None
        count = ex.ttft_count if ex is not None else None
        turns = float(count) if count is not None else float(view.scheduler.decisions.total)
        self.points.append(_Point(view.at, turns, ex.ttft_sum if ex else None,
                                  float(count) if count is not None else None))
        while len(self.points) > 2 and self.points[-1].at - self.points[1].at >= self.window_s:
            self.points.popleft()

    @property
    def span_s(self) -> float:
        """Seconds the window covers now."""
        return self.points[-1].at - self.points[0].at if len(self.points) > 1 else 0.0

    def rate(self) -> float | None:
        """Turns per second over the window (``None``: fewer than two samples)."""
        if self.span_s <= 0:
            return None
        return (self.points[-1].turns - self.points[0].turns) / self.span_s

    def ttft_mean(self) -> float | None:
        """Mean TTFT of the turns served in the window (``None``: none, or no histogram)."""
        a, b = self.points[0], self.points[-1]
        if None in (a.ttft_sum, b.ttft_sum, a.ttft_count, b.ttft_count):
            return None
        n = b.ttft_count - a.ttft_count  # type: ignore[operator]
        return (b.ttft_sum - a.ttft_sum) / n if n > 0 else None  # type: ignore[operator]


# --- a guarded change ---------------------------------------------------------------------
@dataclass
class GuardResult:
    """What ``tune auto`` did: the mode, the rates, each step and whether it rolled back."""

    mode: str                       # "server" (controllers in the scheduler) or "client"
    baseline_rate: float | None
    baseline_ttft: float | None
    final_rate: float | None = None
    final_ttft: float | None = None
    rolled_back: bool = False
    reason: str = ""
    restored: dict[str, Any] = field(default_factory=dict)
    steps: list[dict[str, Any]] = field(default_factory=list)
    audit: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Plain form (``--json``)."""
        return {"mode": self.mode, "baseline_turns_per_s": self.baseline_rate,
                "baseline_ttft_s": self.baseline_ttft, "final_turns_per_s": self.final_rate,
                "final_ttft_s": self.final_ttft, "rolled_back": self.rolled_back,
                "reason": self.reason, "restored": self.restored, "steps": self.steps,
                "audit_seqs": self.audit}


def _mean(values: Sequence[float | None]) -> float | None:
    got = [v for v in values if v is not None and math.isfinite(v)]
    return sum(got) / len(got) if got else None


def client_controller_step(view: ClusterView, start: Thresholds,
                           spread: float = 4.0) -> dict[str, int]:
    """One step of the dynamic alpha/beta controllers run by the client (core/thresholds.py
    rules: alpha from storage-NIC utilisation, beta from prefill GPU utilisation), bounded
    to ``[start / spread, start * spread]``; only the thresholds that move are returned.

    Why the client may run them: a server without the controller switches still takes the
    thresholds they compute, so ``tune auto`` works against it, guarded the same way.
    """
    from dualpath_cli.core.thresholds import dynamic_alpha, dynamic_beta

    th = view.scheduler.thresholds
    out: dict[str, int] = {}
    snic = _mean([n.snic_utilization for n in view.nodes])
    if snic is not None and start.alpha_tokens > 0:
        a = round(dynamic_alpha(th.alpha_tokens, snic, lo=start.alpha_tokens / spread,
                                hi=start.alpha_tokens * spread))
        if a != th.alpha_tokens:
            out["alpha"] = a
    gpu = _mean([e.gpu_utilization for e in view.engines if e.role == "prefill"])
    if gpu is not None and start.beta_tokens > 0:
        b = max(1, round(dynamic_beta(th.beta_tokens, gpu, lo=start.beta_tokens / spread,
                                      hi=start.beta_tokens * spread)))
        if b != th.beta_tokens:
            out["beta"] = b
    return out


def guard_change(client: TuneClient, *, duration_s: float, window_s: float,
                 interval_s: float, max_drop: float,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep,
                 on_step: Callable[[dict[str, Any]], None] | None = None) -> GuardResult:
    """Turn the dynamic controllers on for ``duration_s``, rolling back on a throughput drop.

    1. Measure turns/s and TTFT over ``window_s`` with the settings in force (the baseline).
    2. Ask the scheduler to run its controllers (:data:`CONTROLLER_FIELDS`); a server that
       does not know them (422 unknown field) gets the client's controller steps instead.
    3. Every ``interval_s``, compare turns/s over the last ``window_s`` with the baseline;
       below ``(1 - max_drop)`` of it the previous thresholds are restored and the
       controllers turned off, and the run stops.

    Raises:
        UsageError: a bad fraction or window.
    """
    if not 0 < max_drop < 1:
        raise UsageError(f"--max-drop {max_drop:g}: expected a fraction between 0 and 1")
    if window_s < interval_s:
        raise UsageError("the window must be at least one interval")
    st = client.status()
    start = st.thresholds
    saved = settings_of(start)
    tp = Throughput(window_s)
    t0 = clock()
    while True:  # baseline
        tp.add(client.view(), client.metrics_text())
        if clock() - t0 >= window_s:
            break
        sleep(interval_s)
    res = GuardResult("server", tp.rate(), tp.ttft_mean())
    try:
        entry = client.patch_scheduler(dict.fromkeys(CONTROLLER_FIELDS, True))
        res.audit.append(entry.seq)
    except DualPathError as err:  # the client's Rejected (api/ sits above services/)
        if getattr(err, "status", None) not in (400, 422) or "unknown field" not in str(err):
            raise
        res.mode = "client"
    tp = Throughput(window_s)
    t1 = clock()
    while clock() - t1 < duration_s:
        sleep(interval_s)
        view = client.view()
        tp.add(view, client.metrics_text())
        step: dict[str, Any] = {"t_s": round(clock() - t1, 3), "turns_per_s": tp.rate(),
                                "ttft_s": tp.ttft_mean(),
                                "alpha": view.scheduler.thresholds.alpha_tokens,
                                "beta": view.scheduler.thresholds.beta_tokens}
        if res.mode == "client":
            change = client_controller_step(view, start)
            if change:
                res.audit.append(client.patch_scheduler(change).seq)
                step["set"] = change
        res.steps.append(step)
        if on_step is not None:
            on_step(step)
        rate = tp.rate()
        if (tp.span_s >= window_s and rate is not None and res.baseline_rate
                and rate < (1.0 - max_drop) * res.baseline_rate):
            body = dict(saved)
            if res.mode == "server":
                body.update(dict.fromkeys(CONTROLLER_FIELDS, False))
            res.audit.append(client.patch_scheduler(body).seq)
            res.rolled_back, res.restored = True, body
            res.reason = (f"throughput fell to {rate:.3g} turns/s over {window_s:g} s, "
                          f"{1 - rate / res.baseline_rate:.0%} below the baseline "
                          f"{res.baseline_rate:.3g} (limit {max_drop:.0%})")
            break
    res.final_rate, res.final_ttft = tp.rate(), tp.ttft_mean()
    if not res.rolled_back:
        kept = ("the scheduler's controllers stay on" if res.mode == "server" else
                "the thresholds the client's controllers set last stay in force")
        res.reason = (f"no baseline traffic, so nothing to compare; {kept}"
                      if not res.baseline_rate else
                      f"throughput held within {max_drop:.0%} of the baseline for "
                      f"{duration_s:g} s; {kept}")
    return res
