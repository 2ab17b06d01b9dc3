"""Where the cockpit's data comes from: a live cluster (the API client) or a recording.

Why an adapter: the screens render one :class:`Frame` (the newest view, a window of recent
samples for sparklines and rules, the decision log, the audit trail, the diagnose findings)
and must not care whether it came from a live cluster, last night's recording or the shipped
:class:`~dualpath_cli.api.fake.FakeClient`. The requests screen's list is the API's in-flight
listing (``GET /api/v1/requests?state=inflight``, or the recorded one at the cursor) and a
request's story is diagnose/explain.py's, fetched by :meth:`Source.story`. Both sources
are plain Python (no Textual), so they are tested and benchmarked without a terminal.
Findings come from diagnose/rules.py over the window; this module only collects the window
and calls them.

A live source never raises on a failed poll: the frame carries the error (the cockpit shows
a banner) and the next poll connects again, so a cluster that goes away and comes back is a
banner, not a crash.
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from dualpath_cli.errors import DualPathError, UsageError
from dualpath_cli.faultspec import Fault
from dualpath_cli.telemetry.recording import Extras, Recording, Sample
from dualpath_cli.telemetry.stories import RequestListing, RequestStory
from dualpath_cli.telemetry.view import AuditEntry, ClusterView, Decision

if TYPE_CHECKING:
    from dualpath_cli.api.protocol import ClusterClient

__all__ = ["Frame", "ReplayPos", "Source", "LiveSource", "ReplaySource", "WINDOW",
           "MAX_DECISIONS", "MAX_INFLIGHT", "RULES_DUTY", "Predictor"]

#: Samples kept for sparklines and for the diagnose rules' window.
WINDOW = 60
#: Decisions kept for the requests screen (newest last).
MAX_DECISIONS = 500
#: In-flight turns the requests screen lists (the oldest).
MAX_INFLIGHT = 200
#: The rules take at most this share of a live source's time: at 1,152 engines they cost
#: a few hundred ms over the window, so they run every few polls there (every poll on a
#: small cluster, where they take milliseconds).
RULES_DUTY = 0.1


@dataclass(frozen=True, slots=True)
class ReplayPos:
    """Where a replay stands: sample ``index`` of ``total``, playing or not, at ``speed``."""

    index: int
    total: int
    playing: bool
    speed: float
    start_at: float
    end_at: float


@dataclass(frozen=True)
class Frame:
    """Everything one refresh of the cockpit shows.

    Args:
        view: the newest view (``None`` before the first answer).
        history: recent samples, oldest first (sparklines, the rules' window).
        decisions: recent logged decisions, oldest first.
        audit: accepted control changes (live; a recording's up to the cursor, where it
            recorded them).
        reports: the diagnose workflows' reports over ``history``.
        error: why the last poll failed (the cluster went away), else ``None``.
        source: the URL or the recording's path.
        replay: the scrubber's position (``None`` when live).
        token_id: ``tok-xxxxxxxx`` of the token control calls send (``None``: read-only).
        faults: injected faults in force (live: the cluster's status; a replay: the
            recorded audit trail's at the cursor).
        inflight: the in-flight listing (``total``, ``requests`` rows; ``None``: the source
            serves none: an older server or recording).
    """

    view: ClusterView | None
    history: tuple[Sample, ...] = ()
    decisions: tuple[Decision, ...] = ()
    audit: tuple[AuditEntry, ...] = ()
    reports: tuple[Any, ...] = ()
    error: str | None = None
    source: str = ""
    replay: ReplayPos | None = None
    token_id: str | None = None
    faults: tuple[Fault, ...] = field(default_factory=tuple)
    inflight: RequestListing | None = None


class Source(Protocol):
    """What the cockpit polls."""

    label: str
    read_only: bool
    token_id: str | None

    def poll(self) -> Frame:
        """The frame to show now (never raises for a cluster that went away)."""
        ...

    def tune(self, **change: str) -> AuditEntry:
        """Apply a scheduler change (``alpha``, ``beta``, ``quota``) through the API."""
        ...

    def story(self, rid: int) -> RequestStory:
        """Request ``rid``'s story (diagnose/explain.py tells it; raises DualPathError)."""
        ...

    def close(self) -> None:
        """Release the connection."""
        ...


def _reports(history: Sequence[Sample], decisions: Sequence[Decision],
             audit: Sequence[AuditEntry] | None = None,
             alpha_s_per_token: float | None = None) -> tuple[Any, ...]:
    """The diagnose workflows over the window (diagnose/rules.py does all the judging).

    ``decisions`` before the window are the rules' earlier reads (a change of alpha made
    shortly before the window is judged against the reads before it); ``audit``: the audit
    log (``None``: not known, an older recording: changes are read off the samples), so a
    change is named by its audit entry, alpha in seconds with ``alpha_s_per_token``.
    """
    if not history:
        return ()
    from dualpath_cli.diagnose import rules
    from dualpath_cli.diagnose.model import Evidence

    first = history[0].at
    window = [d for d in decisions if d.at >= first]
    back = _earliest_needed(history)
    earlier = [d for d in decisions if back <= d.at < first]
    return tuple(rules.run_all(Evidence(history, window, audit=audit, earlier=earlier,
                                        alpha_s_per_token=alpha_s_per_token)))


def _earliest_needed(history: Sequence[Sample]) -> float:
    """How far before the window the rules look at reads: a change in reach before it
    (``change_reach_s``) is judged over as long before the change as has passed since."""
    from dualpath_cli.diagnose.workflows.snic_imbalance import change_reach_s

    window_s = history[-1].at - history[0].at
    return history[0].at - window_s - 2 * change_reach_s(window_s)


def _inflight(client: ClusterClient) -> RequestListing | None:
    """The in-flight listing, or ``None`` from a server without it."""
    try:
        return client.requests("inflight", MAX_INFLIGHT)
    except DualPathError as err:
        if getattr(err, "status", None) in (404, 405, 422):  # an older server
            return None
        raise


class LiveSource:
    """Polls a cluster's API through a client (DualPathClient or FakeClient).

    Args:
        connect: makes a client (called again after a failure, so a restarted cluster found
            through the state file is picked up).
        label: what the status line names (the URL).
        token_id: ``tok-xxxxxxxx`` of the client's token, ``None`` when it has none.
        with_metrics: also read ``/metrics`` each poll (TTFT histogram, NIC errors for the
            long-tail rule).
        clock: wall-clock seconds (tests).
    """

    read_only = False

    def __init__(self, connect: Callable[[], ClusterClient], label: str,
                 token_id: str | None = None,
                 *, with_metrics: bool = True) -> None:
        self._connect = connect
        self.label = label
        self.token_id = token_id
        self.with_metrics = with_metrics
        self._client: ClusterClient | None = None
        self._history: deque[Sample] = deque(maxlen=WINDOW)
        self._decisions: deque[Decision] = deque(maxlen=MAX_DECISIONS)
        self._since = -1
        self._audit: tuple[AuditEntry, ...] = ()
        self._alpha_s_per_token: float | None = None
        self._faults: tuple[Fault, ...] = ()
        self._inflight: RequestListing | None = None
        self._reports: tuple[Any, ...] = ()
        self._rules_at = -1e18
        self._rules_cost = 0.0

    def _get_client(self) -> ClusterClient:
        if self._client is None:
            self._client = self._connect()
            self.label = self._client.url or self.label
        return self._client

    def poll(self) -> Frame:
        """Ask the cluster; on failure keep the last data and say why in ``error``."""
        from dualpath_cli.telemetry.recording import extras_from_metrics_text

        try:
            client = self._get_client()
            view = client.view()
            extras = (extras_from_metrics_text(client.metrics_text()) if self.with_metrics
                      else Extras())
            new = client.decisions(self._since)
            status = client.status()
            self._inflight = _inflight(client)
        except DualPathError as err:
            self._drop_client()
            return self._frame(error=str(err))
        if new:
            self._since = max(d.seq for d in new)
            self._decisions.extend(new)
        self._audit = tuple(status.audit)
        self._alpha_s_per_token = status.thresholds.alpha_s_per_token
        self._faults = tuple(status.faults)
        self._history.append(Sample(view.at, view, extras))
        now = time.monotonic()
        if now - self._rules_at >= self._rules_cost / RULES_DUTY:
            self._reports = _reports(tuple(self._history), tuple(self._decisions),
                                     self._audit, self._alpha_s_per_token)
            self._rules_at = now
            self._rules_cost = time.monotonic() - now
        return self._frame()

    def _frame(self, error: str | None = None) -> Frame:
        return Frame(self._history[-1].view if self._history else None,
                     tuple(self._history), tuple(self._decisions), self._audit,
                     self._reports, error, self.label, None, self.token_id, self._faults,
                     self._inflight)

    def _drop_client(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            try:
                client.close()
            except Exception:  # noqa: BLE001 - a broken connection may fail to close
                pass

    def story(self, rid: int) -> RequestStory:
        """``GET /api/v1/requests/{rid}`` (errors are one line: DualPathError)."""
        return self._get_client().request(rid)

    def tune(self, **change: str) -> AuditEntry:
        """PATCH the scheduler (the client checks the token; errors are one line)."""
        entry = self._get_client().update_scheduler(**change)
        self._audit = (*self._audit, entry)
        return entry

    def close(self) -> None:
        """Close the client."""
        self._drop_client()


class ReplaySource:
    """Plays a recording: a cursor over its samples that the scrubber keys move.

    The decisions shown are those logged up to the cursor's time; the findings are the
    rules over the :data:`WINDOW` samples ending at the cursor (cached per position), with
    the recording's audit entries where it has them (so far as the cursor).
    """

    read_only = True

    def __init__(self, recording: Recording, label: str) -> None:
        if not recording.samples:
            raise UsageError(f"{label}: the recording holds no samples to replay")
        self.rec = recording
        self.label = label
        self.token_id: str | None = None
        self.index = len(recording.samples) - 1
        self.playing = False
        self.speed = 1.0
        self._times = [s.at for s in recording.samples]
        self._dtimes = [d.at for d in recording.decisions]
        self._audit = recording.audit
        self._cache: dict[int, tuple[Any, ...]] = {}

    @property
    def total(self) -> int:
        """Samples in the recording."""
        return len(self.rec.samples)

    @property
    def interval_s(self) -> float:
        """Seconds between samples (the header's, else measured)."""
        value = self.rec.header.get("interval_s")
        if isinstance(value, (int, float)) and value > 0:
            return float(value)
        return self.rec.window_s / (self.total - 1) if self.total > 1 else 1.0

    def seek(self, index: int) -> int:
        """Move the cursor to ``index`` (clamped); returns where it landed."""
        self.index = max(0, min(self.total - 1, index))
        return self.index

    def step(self, n: int) -> int:
        """Move ``n`` samples (negative: back); at the end, playing stops."""
        landed = self.seek(self.index + n)
        if landed == self.total - 1 and n > 0:
            self.playing = False
        return landed

    def jump(self, fraction: float) -> int:
        """Move by ``fraction`` of the recording (at least one sample)."""
        n = int(round(fraction * self.total)) or (1 if fraction > 0 else -1)
        return self.step(n)

    def poll(self) -> Frame:
        """The frame at the cursor."""
        i = self.index
        lo = max(0, i - WINDOW + 1)
        history = self.rec.samples[lo:i + 1]
        at = self._times[i]
        hi = bisect.bisect_right(self._dtimes, at)
        decisions = self.rec.decisions[max(0, hi - MAX_DECISIONS):hi]
        audit = (None if self._audit is None else
                 tuple(a for a in self._audit if a.at <= at))
        if i not in self._cache:
            if len(self._cache) > 256:
                self._cache.clear()
            back = bisect.bisect_left(self._dtimes, _earliest_needed(history))
            self._cache[i] = _reports(history, self.rec.decisions[back:hi], audit,
                                      self.rec.alpha_s_per_token)
        pos = ReplayPos(i, self.total, self.playing, self.speed, self._times[0],
                        self._times[-1])
        recorded = history[-1].inflight
        from dualpath_cli.diagnose.degraded import faults_at

        return Frame(history[-1].view, history, decisions, audit or (), self._cache[i], None,
                     self.label, pos, None, faults_at(audit, at),
                     None if recorded is None else RequestListing.from_dict(recorded))

    def story(self, rid: int) -> RequestStory:
        """Request ``rid``'s story as the recording tells it at the cursor."""
        from dualpath_cli.diagnose.explain import story_from_recording

        return story_from_recording(self.rec, rid, self._times[self.index])

    def tune(self, **change: str) -> AuditEntry:
        """A recording cannot be changed."""
        raise UsageError("a recording is read-only: tune a live cluster (dualpath top "
                         "--url URL)")

    def close(self) -> None:
        """Nothing to close."""


#: ``predict(view, decisions, change) -> text``: the predicted effect of a change. The CLI
#: hands the cockpit the tuning twin's (services/twin.py ``cockpit_predictor``): the cockpit
#: never imports a service.
Predictor = Callable[[ClusterView, Sequence[Decision], dict[str, str]], str]
