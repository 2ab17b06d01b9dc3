"""A shipped fake of :class:`~dualpath_cli.api.client.DualPathClient` for front-end tests.

Why: the monitor, the TUI and diagnose read a cluster only through the client, so they are
tested by handing them a :class:`FakeClient` holding views (a sequence plays like a cluster
changing over time: each ``view()`` returns the next one, then the last one again),
decisions and a metrics page. Control calls are checked like the server checks them (token,
field names) and recorded, and every failure mode of the real client can be injected.
In-flight turns are given as ``inflight`` rows in the API's form (diagnose/explain.py's
``inflight_row`` makes them); finished requests' stories come from ``outcomes``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dualpath_cli.api.errors import ApiError, Forbidden, Rejected, Unauthorized, Unreachable
from dualpath_cli.faultspec import Fault
from dualpath_cli.telemetry.request_ids import RequestAliases
from dualpath_cli.telemetry.status import Status
from dualpath_cli.telemetry.stories import RequestListing, RequestStory
from dualpath_cli.telemetry.view import AuditEntry, ClusterView, Decision, EngineView, NodeView
from dualpath_cli.telemetry.warmup import Template, WarmPlanSummary, WarmProgress, WarmUp

__all__ = ["FakeClient"]

_THRESHOLD_FIELDS = ("alpha", "beta", "quota", "read_side")


class FakeClient:
    """Serves given views and decisions through the client's interface.

    Args:
        views: one view or a sequence played in order (the last one repeats).
        decisions: the decision log (``decisions(since)`` filters it by ``seq``).
        metrics_text: what ``metrics_text()`` returns (default: rendered from the view).
        token: the cluster's token; ``client_token`` the one this client sends.
        unreachable: every call raises :class:`Unreachable` (a cluster that went away).
        inflight: the turns in flight, oldest first (``GET /api/v1/requests`` rows).
        ready_s: reported in ``status()``.
        url: shown in error messages.
    """

    def __init__(self, views: ClusterView | Sequence[ClusterView],
                 decisions: Iterable[Decision] = (), *, metrics_text: str | None = None,
                 token: str = "fake-token", client_token: str | None = "fake-token",
                 unreachable: bool = False, ready_s: float | None = 0.5,
                 url: str = "http://fake", inflight: Iterable[dict[str, Any]] = ()) -> None:
        self._views = [views] if isinstance(views, ClusterView) else list(views)
        if not self._views:
            raise ValueError("FakeClient needs at least one view")
        self._i = 0
        self._decisions = list(decisions)
        self.outcomes: dict[int, dict[str, Any]] = {}  # rid -> outcome, in finish order
        self.inflight: list[dict[str, Any]] = [dict(r) for r in inflight]
        self.aliases = RequestAliases()  # a turn's other ids, as the server keeps them
        self._metrics_text = metrics_text
        self._token = token
        self.client_token = client_token
        self.unreachable = unreachable
        self.ready_s = ready_s
        self.url = url
        self.audit: list[AuditEntry] = []
        self.faults: list[Fault] = []  # injected faults, as status lists them
        self._fault_ids = 0  # the last id given to an injected fault
        self.warmed: WarmUp | None = None  # the last warm-up started
        self.calls: list[str] = []
        self.fail_next: ApiError | None = None
        #: Fields PATCH /api/v1/scheduler accepts (a test adds a server's newer ones).
        self.scheduler_fields: tuple[str, ...] = _THRESHOLD_FIELDS
        #: Values of accepted fields that are not thresholds (controller switches), by name.
        self.switches: dict[str, Any] = {}
        #: The store's replica roots (none: replicate_blocks is refused, as the server's).
        self.replica_roots: list[str] = []

    def __enter__(self) -> FakeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Nothing to close."""

    def _call(self, name: str) -> None:
        self.calls.append(name)
        if self.unreachable:
            raise Unreachable(f"cannot reach the dualpath API at {self.url}: connection "
                              "refused (is `dualpath launch` running there?)")
        if self.fail_next is not None:
            err, self.fail_next = self.fail_next, None
            raise err

    def _current(self) -> ClusterView:
        return self._views[min(self._i, len(self._views) - 1)]

    # -- read ---------------------------------------------------------------------------
    def healthz(self) -> bool:
        """True unless unreachable."""
        self._call("healthz")
        return True

    def readyz(self) -> bool:
        """Whether the current view is ready."""
        self._call("readyz")
        return self._current().state == "ready"

    def view(self) -> ClusterView:
        """The next view of the sequence (the last one repeats)."""
        self._call("view")
        view = self._current()
        self._i += 1
        return view

    def engines(self) -> list[EngineView]:
        """The current view's engines."""
        self._call("engines")
        return list(self._current().engines)

    def nodes(self) -> list[NodeView]:
        """The current view's nodes."""
        self._call("nodes")
        return list(self._current().nodes)

    def decisions(self, since: int = -1) -> list[Decision]:
        """Decisions with ``seq > since``."""
        self._call("decisions")
        return [d for d in self._decisions if d.seq > since]

    def request(self, request_id: int | str) -> RequestStory:
        """The story of a request (the integer id, a body id or an alias in ``aliases``)
        from the given decisions (and ``outcomes``), like the server; 404
        (:class:`Rejected`) when none is kept."""
        from dualpath_cli.diagnose.explain import RequestNotFound, explain_request, unknown_id

        self._call("request")
        rid = self.aliases.resolve(request_id)
        if rid is None:
            raise Rejected(f"{self.url}: HTTP 404: {unknown_id(request_id)}", 404)
        row = None if rid in self.outcomes else next(
            (r for r in self.inflight if r.get("rid") == rid), None)
        try:
            return RequestStory.from_dict(explain_request(
                rid, self._decisions, self.outcomes.get(rid), progress=row,
                aliases=self.aliases.of(rid)))
        except RequestNotFound as err:
            raise Rejected(f"{self.url}: HTTP 404: {err}", 404) from None

    def requests(self, state: str = "inflight", limit: int = 100,
                 after: int | None = None) -> RequestListing:
        """``inflight``: the given rows (oldest ``limit``); ``finished``: the stories of
        ``outcomes`` in their order (the newest ``limit``, or the first after ``after``).
        Bad parameters are refused like the server refuses them (422)."""
        from dualpath_cli.diagnose.explain import finished_stories

        self._call("requests")
        path = f"{self.url}/api/v1/requests"
        if state not in ("inflight", "finished"):
            raise Rejected(f"{path}: HTTP 422: state: String should match pattern "
                           "'^(inflight|finished)$'", 422)
        if not 1 <= limit <= 1000 or (after is not None and after < 0):
            raise Rejected(f"{path}: HTTP 422: limit: must be 1..1000, after >= 0", 422)
        at = self._current().at
        if state == "inflight":
            return RequestListing.from_dict({"state": state, "at": at,
                                             "total": len(self.inflight),
                                             "requests": self.inflight[:limit]})
        rids = list(self.outcomes)
        if after is None:
            rids = rids[-limit:]
        else:
            rids = (rids[rids.index(after) + 1:] if after in rids else rids)[:limit]
        return RequestListing.from_dict({"state": state, "at": at, "requests": finished_stories(
            [(rid, self.outcomes[rid]) for rid in rids], self._decisions,
            aliases=self.aliases.of)})

    def status(self) -> Status:
        """Status derived from the current view and the audit so far."""
        self._call("status")
        v = self._current()
        s = v.scheduler
        return Status(
            state=v.state, pd=v.pd, model=v.model, policy=s.policy,
            engines_healthy=sum(1 for e in v.engines if e.state == "ready"),
            engines_total=sum(1 for e in v.engines if e.state != "left"),
            queue={"fifo": s.fifo_length, "private": sum(s.private_queues.values()),
                   "pe": s.pe_queue_length, "in_flight": s.in_flight},
            thresholds=s.thresholds, decisions=s.decisions.total, ready_s=self.ready_s,
            uptime_s=v.uptime_s, audit=tuple(self.audit), faults=tuple(self.faults),
            version="fake")

    def metrics_text(self) -> str:
        """The given page, or the exposition of the current view."""
        self._call("metrics_text")
        if self._metrics_text is not None:
            return self._metrics_text
        from dualpath_cli.telemetry.exposition import render_prometheus

        return render_prometheus(self._current())

    # -- control ------------------------------------------------------------------------
    def update_scheduler(self, *, alpha: str | int | None = None,
                         beta: str | int | None = None, quota: str | float | None = None,
                         read_side: str | None = None) -> AuditEntry:
        """Check the token like the server, record the change, apply it to later views.

        Values are recorded as given (the fake does not resolve units); ``alpha``/``beta``
        given as plain integers also change the thresholds of the views served after it.
        """
        self._call("update_scheduler")
        return self._patch({k: v for k, v in (("alpha", alpha), ("beta", beta),
                                                ("quota", quota), ("read_side", read_side))
                            if v is not None})

    def patch_scheduler(self, body: Mapping[str, object]) -> AuditEntry:
        """Like :meth:`update_scheduler`, with the body as given: a field outside
        :attr:`scheduler_fields` is rejected as the server rejects it (422, one line), so a
        front-end's fallback for an older server can be tested; extra fields tests allow
        are recorded and kept in :attr:`switches`.
        """
        self._call("patch_scheduler")
        return self._patch(dict(body))

    def _patch(self, new: dict[str, Any]) -> AuditEntry:
        self._check_token("/api/v1/scheduler")
        unknown = sorted(set(new) - set(self.scheduler_fields))
        if unknown:
            raise Rejected(f"{self.url}/api/v1/scheduler: HTTP 422: unknown field "
                           f"{unknown[0]!r}; a change may set: "
                           f"{', '.join(self.scheduler_fields)}")
        if not new:
            raise Rejected(f"{self.url}/api/v1/scheduler: HTTP 422: nothing to change")
        th = self._current().scheduler.thresholds
        old: dict[str, Any] = {"alpha": th.alpha_tokens, "beta": th.beta_tokens,
                               "quota": th.quota_s, "read_side": th.read_side,
                               **self.switches}
        self._apply(new)
        self.switches.update({k: v for k, v in new.items() if k not in _THRESHOLD_FIELDS})
        entry = AuditEntry(len(self.audit) + 1, time.time(), "tok-fake",
                           "scheduler", {k: old.get(k) for k in new}, new)
        self.audit.append(entry)
        return entry

    def _check_token(self, path: str) -> None:
        if not self.client_token:
            raise Unauthorized(f"{self.url}{path}: HTTP 401: this endpoint needs the "
                               "cluster's bearer token")
        if self.client_token != self._token:
            raise Forbidden(f"{self.url}{path}: HTTP 403: the bearer token does not match "
                            "this cluster's token")

    def set_faults(self, specs: Sequence[str]) -> AuditEntry:
        """Check the token and parse the SPECs like the server; record them in status.

        The fake's views do not change (no engine applies the fault).
        """
        from dualpath_cli.faultspec import FaultError, parse_faults

        self._call("set_faults")
        self._check_token("/api/v1/faults")
        try:
            faults = parse_faults(specs)
        except FaultError as err:
            raise Rejected(f"{self.url}/api/v1/faults: HTTP 422: {err}") from None
        if not faults:
            raise Rejected(f"{self.url}/api/v1/faults: HTTP 422: no faults given")
        old = list(self.faults)
        by_key = {(f.kind, f.target): f for f in self.faults}
        for f in faults:
            self._fault_ids += 1
            by_key.pop((f.kind, f.target), None)  # a replaced one is listed as new
            by_key[f.kind, f.target] = dataclasses.replace(f, id=self._fault_ids,
                                                           since=time.time())
        self.faults = list(by_key.values())
        return self._audit_faults(old)

    def warm(self, templates: Sequence[Template], rate: str | None = None,
             role: str = "all") -> WarmUp:
        """Check the token; a warm-up of nothing the store holds (no engine is sent one),
        so it is done at once. ``rate`` is echoed as given (the fake has no NIC)."""
        self._call("warm")
        self._check_token("/api/v1/storage/warm")
        plan = WarmPlanSummary(tuple({"name": t.name, "tokens": len(t.tokens), "blocks": 0,
                                      "stored": 0, "shared": 0} for t in templates))
        self.warmed = WarmUp(plan=plan, rate_bps=0.0, rate=rate or "0 B/s", role=role,
                             engines=(), started=time.time())
        entry = AuditEntry(len(self.audit) + 1, time.time(), "tok-fake", "warm", {},
                           {"templates": [t.name for t in templates], "blocks": 0,
                            "rate_bps": 0.0, "role": role})
        self.audit.append(entry)
        return dataclasses.replace(self.warmed, seq=entry.seq)

    def warm_status(self) -> WarmUp:
        """The last warm-up (none: only the progress), always done."""
        self._call("warm_status")
        return dataclasses.replace(self.warmed or WarmUp(), progress=WarmProgress(done=True))

    def clear_faults(self) -> AuditEntry:
        """Check the token; forget every injected fault."""
        self._call("clear_faults")
        self._check_token("/api/v1/faults")
        old, self.faults = self.faults, []
        return self._audit_faults(old)

    def clear_fault(self, fault_id: int) -> AuditEntry:
        """Check the token; forget the fault numbered ``fault_id`` (404 like the server when
        none in force has it)."""
        path = f"/api/v1/faults/{int(fault_id)}"
        self._call("clear_fault")
        self._check_token(path)
        if not any(f.id == fault_id for f in self.faults):
            ids = ", ".join(f"#{f.id}" for f in self.faults) or "none"
            raise Rejected(f"{self.url}{path}: HTTP 404: no fault #{fault_id} in force (in "
                           f"force: {ids})")
        old = list(self.faults)
        self.faults = [f for f in self.faults if f.id != fault_id]
        return self._audit_faults(old)

    def compact_hbm(self, engine_id: int) -> AuditEntry:
        """Check the token and the engine like the server; the views from the next one on
        show the engine's HBM compacted (fragmentation 0, one free run)."""
        path = f"/api/v1/engines/{engine_id}/compact"
        self._call("compact_hbm")
        self._check_token(path)
        try:
            e = self._current().engine(engine_id)
        except KeyError as err:
            raise Rejected(f"{self.url}{path}: HTTP 422: {err.args[0]}") from None
        largest, frag = e.hbm_largest_free_blocks, e.hbm_fragmentation
        # free blocks from the score (1 - largest run / free), as the engine reported it
        free_blocks = (round(largest / (1.0 - frag)) if largest and frag is not None
                       and frag < 1.0 else largest)

        def facts(frag: float | None, largest: int | None) -> dict[str, Any]:
            return {"engine": engine_id, "hbm_fragmentation": frag,
                    "hbm_largest_free_blocks": largest, "hbm_free_blocks": free_blocks}

        old = facts(e.hbm_fragmentation, e.hbm_largest_free_blocks)
        after = [dataclasses.replace(v, engines=tuple(
            dataclasses.replace(x, hbm_fragmentation=0.0, hbm_largest_free_blocks=free_blocks)
            if x.engine_id == engine_id else x for x in v.engines))
            for v in self._views[self._i + 1:]]
        self._views = self._views[:self._i + 1] + after
        entry = AuditEntry(len(self.audit) + 1, time.time(), "tok-fake", "compact", old,
                           facts(0.0, free_blocks))
        self.audit.append(entry)
        return entry

    def replicate_blocks(self, blocks: Sequence[str], copies: int | None = None
                         ) -> AuditEntry:
        """Check the token and the keys like the server; each block is then held by the
        root and every replica root (up to ``copies``), recorded as a ``replicate`` entry."""
        from dualpath_cli.errors import UsageError
        from dualpath_cli.services.replicate import NoReplicaRoots, check_block_keys

        path = "/api/v1/store/replicate"
        self._call("replicate_blocks")
        self._check_token(path)
        try:
            keys = check_block_keys(blocks)
            if not self.replica_roots:
                raise NoReplicaRoots("this cluster's store has no replica roots")
            if copies is not None and copies < 2:
                raise UsageError(f"copies={copies}: a replica needs at least 2 copies")
        except UsageError as err:
            raise Rejected(f"{self.url}{path}: HTTP 422: {err}") from None
        roots = ["store", *self.replica_roots]
        held = roots[:len(roots) if copies is None else min(copies, len(roots))]
        old = {"blocks": {k: ["store"] for k in keys}}
        new = {"blocks": {k: held for k in keys}, "added": {k: held[1:] for k in keys},
               "roots": roots}
        entry = AuditEntry(len(self.audit) + 1, time.time(), "tok-fake", "replicate", old, new)
        self.audit.append(entry)
        return entry

    def _audit_faults(self, old: list[Fault]) -> AuditEntry:
        entry = AuditEntry(len(self.audit) + 1, time.time(), "tok-fake", "faults",
                           {"faults": [f.to_dict() for f in old]},
                           {"faults": [f.to_dict() for f in self.faults]})
        self.audit.append(entry)
        return entry

    def _apply(self, new: dict[str, Any]) -> None:
        changes: dict[str, Any] = {}
        sources: dict[str, str] = {}
        for key, attr in (("alpha", "alpha_tokens"), ("beta", "beta_tokens")):
            if isinstance(new.get(key), int):
                changes[attr] = new[key]
                sources[key] = "api"
        quota = new.get("quota")
        if isinstance(quota, int | float) and not isinstance(quota, bool):
            changes["quota_s"] = float(quota)
            sources["quota"] = "api"
        if isinstance(new.get("read_side"), str):
            changes["read_side"] = new["read_side"]
            sources["read_side"] = "api"
        if not changes:
            return
        out = []
        for v in self._views[self._i:] or self._views[-1:]:
            th = v.scheduler.thresholds
            th = dataclasses.replace(th, **changes, source={**th.source, **sources})
            out.append(dataclasses.replace(
                v, scheduler=dataclasses.replace(v.scheduler, thresholds=th)))
        keep = self._views[:self._i] if self._i < len(self._views) else self._views[:-1]
        self._views = keep + out
        self._i = min(self._i, len(self._views) - 1)


if TYPE_CHECKING:  # mypy checks that this class implements the seam the front-ends use
    from dualpath_cli.api.protocol import ClusterClient

    _implements: type[ClusterClient] = FakeClient
