"""The HTTP API of a live cluster: read model, control, Prometheus, health (FastAPI).

Why FastAPI on uvicorn: a well-kept ASGI stack with request validation and an OpenAPI
document for free; the handlers stay thin over :class:`~dualpath_cli.services.live.LiveCluster`.
Handlers are plain ``def`` so FastAPI runs them on its worker threads (the live cluster's
calls take locks). The two big bodies (``/metrics``, ``/api/v1/metrics``) are rendered by our
own string builders and returned as raw responses: FastAPI's generic encoder took longer than
the whole 50 ms budget for a 1,152-engine view.

Auth: PATCH needs the bearer token (missing 401, wrong 403); with ``allow_remote`` (a
non-loopback bind) every endpoint does. Errors are JSON ``{"detail": "<one line>"}``.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import time
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    model_validator,
)
from starlette.exceptions import HTTPException as StarletteHTTPException

from dualpath_cli import __version__
from dualpath_cli.api.auth import AuthError, TokenAuth
from dualpath_cli.api.bodylimit import BodyLimit
from dualpath_cli.api.contain_errors import ContainErrors
from dualpath_cli.api.control import SystemUnits, parse_scheduler_change
from dualpath_cli.api.encode import (
    decision_dict,
    dumps,
    engine_dict,
    node_dict,
    view_dict,
)
from dualpath_cli.api.params import int_path, int_query
from dualpath_cli.api.ratelimit import RateLimit, rate_in_force
from dualpath_cli.api.request_id_header import RequestIdHeader
from dualpath_cli.core.thresholds import read_seconds
from dualpath_cli.errors import DualPathError, UsageError
from dualpath_cli.faultspec import parse_faults
from dualpath_cli.services.live import Draining, LiveCluster
from dualpath_cli.telemetry.exposition import CONTENT_TYPE, render_prometheus
from dualpath_cli.telemetry.gpu import GpuBackend, detect_gpu_backend
from dualpath_cli.telemetry.host import host_facts
from dualpath_cli.telemetry.storage_health import node_names, storage_of_frames
from dualpath_cli.telemetry.view import ClusterView

__all__ = ["create_app", "SchedulerPatch", "FaultsPatch", "ReplicateBody"]

log = logging.getLogger("dualpath.api")


def _patch_schema(schema: dict[str, Any]) -> None:
    """Document what the handler enforces: no nulls, and at least one field."""
    for prop in schema.get("properties", {}).values():
        any_of = prop.get("anyOf")
        if any_of:
            prop["anyOf"] = [a for a in any_of if a.get("type") != "null"]
        prop.pop("default", None)
    schema["minProperties"] = 1


class SchedulerPatch(BaseModel):
    """A change of the running scheduler; omitted fields stay as they are.

    Units as on the command line: alpha ``200K`` tokens, ``8KiB`` of KV, or seconds of
    reading (``3s``, shaped clusters); beta in tokens (``1M``); quota as time (``300ms``) or
    FLOPs (``20TFLOP``); read_side a policy name (dualpath, basic, round-robin, random,
    split, seed-select, or a plugin's); ``dynamic_alpha``/``dynamic_beta``/``dynamic_quota``
    turn a dynamic controller on or off. Types are strict: ``true`` is not a number of
    tokens.
    """

    model_config = ConfigDict(extra="forbid", json_schema_extra=_patch_schema)

    alpha: StrictStr | Annotated[StrictInt, Field(ge=0)] | None = Field(None,
                                                                         examples=["200K"])
    beta: StrictStr | Annotated[StrictInt, Field(ge=1)] | None = Field(None, examples=["1M"])
    quota: (StrictStr | Annotated[StrictInt, Field(gt=0)] | Annotated[StrictFloat, Field(gt=0)]
            | None) = Field(None, examples=["300ms"])
    read_side: StrictStr | None = Field(None, examples=["dualpath"])
    dynamic_alpha: StrictBool | None = Field(None, examples=[True])
    dynamic_beta: StrictBool | None = Field(None, examples=[True])
    dynamic_quota: StrictBool | None = Field(None, examples=[False])

    @model_validator(mode="before")
    @classmethod
    def _no_nulls(cls, data: Any) -> Any:
        if isinstance(data, dict):
            nulls = sorted(k for k, v in data.items() if v is None)
            if nulls:
                raise ValueError(f"{nulls[0]}: null is not a value; leave the field out to "
                                 "keep it as it is")
        return data


class FaultsPatch(BaseModel):
    """Faults to inject, as SPEC texts ``KIND:key=value,...`` (the same as ``dualpath launch
    --inject``): snic_throttle, read_latency, read_errors, hot_blocks, hbm_frag,
    slow_compute. One of a kind and target replaces the one in force.
    """

    model_config = ConfigDict(extra="forbid")

    faults: list[StrictStr] = Field(min_length=1, examples=[[
        "snic_throttle:node=1,fraction=0.25", "slow_compute:engine=2,factor=4"]])


class ReplicateBody(BaseModel):
    """Hot blocks to copy to the store's replica roots (``storage.replica_roots``), by key
    (32 hex digits, as ``dualpath diagnose long-tail`` and ``storage inspect`` list them);
    ``copies``: copies in total, the root's included (default: one on every replica root).
    """

    model_config = ConfigDict(extra="forbid")

    blocks: list[StrictStr] = Field(min_length=1, max_length=64, examples=[[
        "eb76d0e1ca29c0ffee0123456789abcd"]])
    copies: StrictInt | None = Field(default=None, ge=2, le=64)


class Health(BaseModel):
    """Liveness or readiness (``state`` as ``/api/v1/status`` says it; ``ready`` as
    ``/readyz``)."""

    status: str
    state: str | None = None
    ready: bool | None = None


class EngineCount(BaseModel):
    """Engines ready and engines in all."""

    healthy: int
    total: int


class Status(BaseModel):
    """``/api/v1/status``: what an operator checks first."""

    state: str
    pd: str
    model: str
    policy: str
    engines: EngineCount
    queue: dict[str, int]
    thresholds: dict[str, Any]
    decisions: int
    ready_s: float | None
    uptime_s: float
    audit: list[dict[str, Any]]
    faults: list[dict[str, Any]]
    version: str
    scheduling: dict[str, Any] = {}
    membership: dict[str, Any] | None = None
    ready: bool | None = None
    not_ready: str = ""


class ChangeResult(BaseModel):
    """An accepted scheduler change: its audit entry."""

    seq: int
    at: float
    token_id: str
    action: str
    old: dict[str, Any]
    new: dict[str, Any]


class DecisionsOut(BaseModel):
    """Logged decisions after ``since``, oldest first, each with its inputs."""

    since: int
    decisions: list[dict[str, Any]]


class ErrorOut(BaseModel):
    """Every error: one line."""

    detail: str


_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorOut} for code in (401, 403, 422, 503)}


def _one_line(text: str) -> str:
    return " ".join(str(text).split()) or "error"


def _validation_detail(err: RequestValidationError) -> str:
    parts = []
    for e in err.errors()[:3]:
        loc = ".".join(str(x) for x in e.get("loc", ()) if x not in ("body", "query"))
        parts.append(f"{loc}: {e.get('msg', 'invalid')}" if loc else str(e.get("msg")))
    return _one_line("; ".join(parts) or "invalid request")


def _json(data: Any, status: int = 200) -> Response:
    return Response(dumps(data), status_code=status, media_type="application/json")


def _audit_dict(entry: Any) -> dict[str, Any]:
    return {"seq": entry.seq, "at": entry.at, "token_id": entry.token_id,
            "action": entry.action, "old": entry.old, "new": entry.new}


def _units(live: LiveCluster) -> SystemUnits:
    system = live.system
    shape = system.shape
    snic = system.opts.snic_bw if system.shaped else 0.0
    return SystemUnits(kv_bytes_per_token=shape.n_layers * shape.bytes_per_token_layer,
                       block_tokens=shape.block_tokens, snic_bytes_per_s=max(0.0, snic),
                       flops_per_s=float(system.flops_rate))


def _scheduling(live: LiveCluster) -> dict[str, Any]:
    """How scheduling is laid out: flat or hierarchical (with its sub count), and how many
    nodes an engine group spans (cluster.nodes_per_group)."""
    subs = live.system.scheduler.sub_schedulers()  # none: a flat scheduler
    return {"hierarchical": bool(subs), "sub_schedulers": len(subs) or 1,
            "nodes_per_group": live.system.opts.nodes_per_group}


def _status(live: LiveCluster, view: ClusterView) -> dict[str, Any]:
    s = view.scheduler
    th = s.thresholds
    units = _units(live)
    ready, why = live.readiness()
    members = view.membership
    return {
        "membership": dataclasses.asdict(members) if members is not None else None,
        "ready": ready, "not_ready": "" if ready else why,
        "state": view.state, "pd": view.pd, "model": view.model, "policy": s.policy,
        # engines of a node that left on purpose are not this cluster's any more; those of
        # one that is leaving still serve their turns (the membership says ``draining``)
        "engines": {"healthy": sum(1 for e in view.engines
                                   if e.state in ("ready", "draining")),
                    "total": sum(1 for e in view.engines if e.state != "left")},
        "queue": {"fifo": s.fifo_length, "private": sum(s.private_queues.values()),
                  "pe": s.pe_queue_length, "in_flight": s.in_flight},
        "thresholds": {"alpha_tokens": th.alpha_tokens,
                       # as the config gives it (3s); None where the NICs have no rate
                       "alpha_s": read_seconds(th.alpha_tokens, units.kv_bytes_per_token,
                                               units.snic_bytes_per_s),
                       "beta_tokens": th.beta_tokens,
                       "z_factor": th.z_factor, "quota_s": th.quota_s,
                       "read_side": th.read_side, "source": dict(th.source),
                       "controllers": dict(th.controllers)},
        "decisions": s.decisions.total, "ready_s": live.ready_s, "uptime_s": view.uptime_s,
        "audit": [_audit_dict(a) for a in list(live.audit)], "faults": live.faults(),
        "version": __version__, "scheduling": _scheduling(live),
        # nodes whose store failed reads, held corrupt blocks or refused writes since start
        "storage": [n.to_dict() for n in storage_of_frames(live.system.metric_frames(),
                                                           node_names(view.nodes))],
    }


def _metrics_text(live: LiveCluster, gpu: GpuBackend) -> str:
    view = live.view()
    system = live.system
    frames = system.metric_frames()  # as last heartbeated: a scrape never waits
    sched = system.scheduler.registry.snapshot()
    return render_prometheus(view, engine_frames=frames, scheduler_metrics=sched,
                             host=host_facts(), gpu=gpu.report())


_BEARER = HTTPBearer(auto_error=False, description="The token in the launch's token file.")


def require_token(request: Request, _creds: Annotated[HTTPAuthorizationCredentials | None,
                                                      Depends(_BEARER)]) -> str:
    """The caller's token id, or 401/403 (raised as AuthError, mapped by the app).

    ``_creds`` only declares the bearer scheme in the OpenAPI document; the header is checked
    by the app's :class:`TokenAuth` (constant time).
    """
    auth: TokenAuth = request.app.state.auth
    auth.check_header(request.headers.get("authorization"))
    return auth.token_id


def _routes(live: LiveCluster, gpu: GpuBackend) -> APIRouter:
    """The API's routes."""
    r = APIRouter()

    @r.get("/healthz", response_model=Health, tags=["health"])
    def healthz() -> dict[str, Any]:
        """Liveness: the process is alive and serving HTTP (always 200). ``state`` and
        ``ready`` are those ``/api/v1/status`` and ``/readyz`` give."""
        ready, _ = live.readiness()
        return {"status": "ok", "state": live.phase(), "ready": ready}

    @r.get("/readyz", response_model=Health, responses=_ERRORS, tags=["health"])
    def readyz() -> Response:
        """Readiness: 200 when the cluster admits turns, every engine that is the cluster's
        said hello and each role has a serving engine; else 503 with the reason."""
        ready, why = live.readiness()
        if ready:
            return _json({"status": "ready", "state": "ready", "ready": True})
        return _json({"detail": f"not ready: {why}"}, 503)

    @r.get("/api/v1/status", response_model=Status, tags=["read"])
    def status() -> Response:
        """State, P/D, engines healthy/total, queues, thresholds in force, audit, faults."""
        return _json(_status(live, live.view()))

    @r.get("/api/v1/engines", tags=["read"],
           responses={200: {"description": "Every engine (EngineView as JSON)."}})
    def engines() -> Response:
        """Every engine as the scheduler sees it."""
        return _json([engine_dict(e) for e in live.view().engines])

    @r.get("/api/v1/nodes", tags=["read"],
           responses={200: {"description": "Every node (NodeView as JSON)."}})
    def nodes() -> Response:
        """Every node: NIC utilisation, read queue, DRAM buffer."""
        return _json([node_dict(n) for n in live.view().nodes])

    @r.get("/api/v1/metrics", tags=["read"],
           responses={200: {"description": "The ClusterView as JSON."}})
    def view() -> Response:
        """The whole ClusterView (``telemetry.view.view_from_dict`` reads it back)."""
        return _json(view_dict(live.view()))

    @r.get("/api/v1/decisions", response_model=DecisionsOut, responses=_ERRORS,
           tags=["read"])
    def decisions(since: Annotated[int, int_query(ge=-1, description=(
            "Return decisions with seq greater than this (-1: all kept)."))] = -1
                  ) -> Response:
        """The bounded decision log after ``since``, each decision with its inputs."""
        return _json({"since": since,
                      "decisions": [decision_dict(d) for d in live.decisions(since)]})

    @r.get("/api/v1/requests", responses=_ERRORS, tags=["read"])
    def requests_list(
            state: Annotated[str, Query(pattern="^(inflight|finished)$", description=(
                "inflight: the turns not finished yet; finished: the stories of finished "
                "requests (as GET /api/v1/requests/{id} serves them)."))] = "inflight",
            limit: Annotated[int, int_query(ge=1, le=1000, description=(
                "At most this many (inflight: the oldest; finished: see after)."))] = 100,
            after: Annotated[int | None, int_query(ge=0, description=(
                "finished only: those that finished after this request did, in finish "
                "order (a reader's cursor); absent: the newest."))] = None) -> Response:
        """Requests in flight (phase, PE, DE, read side, KV bytes read, TTFT so far), or
        the stories of finished ones, from the scheduler's live state and its ledger."""
        return _json(live.requests(state, limit, after))

    @r.get("/api/v1/requests/{rid:path}", responses=_ERRORS, tags=["read"])
    def request_story(rid: Annotated[str, Path(max_length=200, description=(
            "The request id (the decision log's rid, the x-request-id header of its "
            "answer), the OpenAI body's chatcmpl-/cmpl- id, or the client's own "
            "x-request-id."))]) -> Response:
        """One request's story (``dualpath explain``): arrival, PE and DE with their
        classes and the thresholds, the read side and why, blocks hit per tier and missed
        per reason, bytes per NIC, per-layer slack, the TTFT breakdown."""
        from dualpath_cli.diagnose.explain import RequestNotFound

        try:
            return _json(live.request(rid))
        except RequestNotFound as err:
            return _json({"detail": str(err)}, 404)

    @r.patch("/api/v1/scheduler", response_model=ChangeResult, responses=_ERRORS,
             tags=["control"])
    def patch_scheduler(body: SchedulerPatch,
                        token: Annotated[str, Depends(require_token)]) -> Response:
        """Change alpha, beta, the compute quota or the read-side policy (audited)."""
        change = parse_scheduler_change(body.model_dump(exclude_none=True), _units(live))
        try:
            entry = live.update_scheduler(change, token)
        except ValueError as err:  # the scheduler refused the values
            raise UsageError(str(err)) from None
        log.info("scheduler change %d by %s: %s -> %s", entry.seq, token, entry.old,
                 entry.new)
        return _json(_audit_dict(entry))

    @r.patch("/api/v1/faults", response_model=ChangeResult, responses=_ERRORS,
             tags=["control"])
    def patch_faults(body: FaultsPatch,
                     token: Annotated[str, Depends(require_token)]) -> Response:
        """Inject faults on the engines they target (audited; listed in status)."""
        entry = live.set_faults(parse_faults(body.faults), token)
        log.warning("faults injected (%d) by %s: %s", entry.seq, token, entry.new["faults"])
        return _json(_audit_dict(entry))

    @r.delete("/api/v1/faults", response_model=ChangeResult, responses=_ERRORS,
              tags=["control"])
    def delete_faults(token: Annotated[str, Depends(require_token)]) -> Response:
        """Undo every injected fault (audited)."""
        entry = live.clear_faults(token)
        log.info("faults cleared (%d) by %s", entry.seq, token)
        return _json(_audit_dict(entry))

    @r.delete("/api/v1/faults/{fault_id}", response_model=ChangeResult, responses=_ERRORS,
              tags=["control"])
    def delete_fault(fault_id: Annotated[int, int_path(ge=1, description="The fault's id "
                                                       "(the ``id`` status lists).")],
                     token: Annotated[str, Depends(require_token)]) -> Response:
        """Undo one injected fault, named by its id (audited; 404: none in force has it)."""
        from dualpath_cli.faultspec import FaultError

        try:
            entry = live.clear_fault(fault_id, token)
        except FaultError as err:
            return _json({"detail": str(err)}, 404)
        log.info("fault #%d cleared (%d) by %s", fault_id, entry.seq, token)
        return _json(_audit_dict(entry))

    @r.post("/api/v1/engines/{engine_id}/compact", response_model=ChangeResult,
            responses=_ERRORS, tags=["control"])
    def compact_engine(engine_id: Annotated[int, int_path(ge=0)],
                       token: Annotated[str, Depends(require_token)]) -> Response:
        """Defragment one engine's HBM pool now (audited; old/new: its HBM facts)."""
        entry = live.compact_hbm(engine_id, token)
        log.info("HBM compaction (%d) of engine %d by %s: %s -> %s", entry.seq, engine_id,
                 token, entry.old, entry.new)
        return _json(_audit_dict(entry))

    @r.post("/api/v1/store/replicate", response_model=ChangeResult, responses=_ERRORS,
            tags=["control"])
    def replicate_blocks(body: ReplicateBody,
                         token: Annotated[str, Depends(require_token)]) -> Response:
        """Copy hot blocks to the store's replica roots, each copy verified (audited; old/new:
        the roots holding each block). Engines then spread reads of a block over its copies."""
        entry = live.replicate_blocks(body.blocks, body.copies, token)
        log.info("replication (%d) by %s: %s", entry.seq, token, entry.new)
        return _json(_audit_dict(entry))

    @r.get("/metrics", tags=["prometheus"], response_class=Response,
           responses={200: {"content": {"text/plain": {}},
                            "description": "Prometheus text exposition (format 0.0.4)."}})
    def metrics() -> Response:
        """Every metric of the one metrics table, for Prometheus."""
        return Response(_metrics_text(live, gpu), media_type=CONTENT_TYPE)

    return r


def _optional_module(name: str) -> Any:
    """``name`` imported, or None when it does not exist (an error inside it propagates)."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as err:
        if err.name != name:
            raise
        return None


def create_app(live: LiveCluster, auth: TokenAuth, *, allow_remote: bool = False,
               gpu: GpuBackend | None = None, rate_limit: float | None = None) -> FastAPI:
    """The API of ``live``.

    Args:
        live: the running cluster (started, or starting: ``/readyz`` says which).
        auth: the launch's token; PATCH needs it, and with ``allow_remote`` every endpoint.
        allow_remote: the server binds a non-loopback host, so nothing is served without the
            token (``dualpath launch`` refuses such a host unless ``--allow-remote``).
        gpu: GPU facts for ``/metrics`` (default: NVML when present, else "not available").
        rate_limit: requests/s per client address (default: ``DUALPATH_LIMIT_API_RATE``, else
            the cluster's ``cluster.api_rate_limit``; 0 none); past it 429 (api/ratelimit.py).
    """
    backend = gpu if gpu is not None else detect_gpu_backend()
    router = _routes(live, backend)
    deps = [Depends(require_token)] if allow_remote else []
    app = FastAPI(title="dualpath", version=__version__, dependencies=deps,
                  description="A live DualPath cluster: read model, control, Prometheus, "
                              "OpenAI-compatible serving.")
    app.add_middleware(ContainErrors)  # innermost: a bug is a 500, the connection stays
    app.add_middleware(BodyLimit)  # 413 for a body over the limit, before any handler
    app.add_middleware(RequestIdHeader)  # x-request-id on every answer (a turn's: its rid)
    rate = rate_limit if rate_limit is not None else rate_in_force(live.opts.api_rate_limit)
    app.add_middleware(RateLimit, rate=rate)  # outermost: 429 per client address, O(1)
    app.state.live = live
    app.state.auth = auth
    app.state.started = time.time()
    app.include_router(router)
    openai = _optional_module("dualpath_cli.api.openai_routes")
    if openai is not None:  # the OpenAI-compatible routes (their own module)
        app.include_router(openai.router(live))
    joins = _optional_module("dualpath_cli.api.join_routes")
    if joins is not None:  # nodes joining with --join (token always required)
        app.include_router(joins.router(live))
    warm = _optional_module("dualpath_cli.api.warm_routes")
    if warm is not None:  # warm-up of the engines' DRAM caches (token to start or stop)
        app.include_router(warm.router(live))

    @app.exception_handler(AuthError)
    async def _auth(_request: Request, err: AuthError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if err.status == 401 else None
        return JSONResponse({"detail": _one_line(str(err))}, err.status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, err: RequestValidationError) -> JSONResponse:
        return JSONResponse({"detail": _validation_detail(err)}, 422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, err: StarletteHTTPException) -> JSONResponse:
        return JSONResponse({"detail": _one_line(str(err.detail))}, err.status_code,
                            headers=err.headers)

    @app.exception_handler(DualPathError)
    async def _ours(_request: Request, err: DualPathError) -> JSONResponse:
        if isinstance(err, Draining):  # retryable: elsewhere, or here after a restart
            return JSONResponse({"detail": _one_line(str(err))}, 503,
                                headers={"Retry-After": str(err.retry_after_s)})
        if isinstance(err, (UsageError, ValueError)):
            code = 422
        else:
            code = 500
        return JSONResponse({"detail": _one_line(str(err))}, code)

    return app
