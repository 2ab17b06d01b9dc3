"""Routes nodes use to join and leave a running cluster (``launch --role ... --join``).

Every route needs the cluster's bearer token, loopback or not: a node that joins receives
work and the control endpoint's address, so a wrong token is refused (403) and no token is
401. Handlers are plain ``def`` (worker threads); errors are ``{"detail": "<one line>"}``.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Depends, HTTPException
from pydantic import BaseModel, Field

from dualpath_cli.cluster.join import MAX_GPUS, JoinService
from dualpath_cli.errors import UsageError

if TYPE_CHECKING:
    from dualpath_cli.services.live import LiveCluster

__all__ = ["router"]


class JoinBody(BaseModel):
    """A node asks for a place: its name, role and engine count."""

    node: str = Field(min_length=1, max_length=128)
    role: str
    gpus: int = Field(ge=1, le=MAX_GPUS)


def router(live: LiveCluster) -> APIRouter:
    """``POST /api/v1/join``, ``GET /api/v1/join/{node}``, ``DELETE /api/v1/join/{node}``."""
    from dualpath_cli.api.app import require_token

    services: list[JoinService] = []
    lock = threading.Lock()
    api = APIRouter(prefix="/api/v1/join", dependencies=[Depends(require_token)])

    def get_service() -> JoinService:
        with lock:
            if not services:  # on first use: a test's stand-in cluster may have no system
                system = getattr(live, "system", None)
                if system is None:
                    raise HTTPException(404, "this cluster takes no joining nodes")
                own = getattr(live, "joins", None)  # the live cluster's (checkpointed)
                services.append(own if isinstance(own, JoinService) else JoinService(system))
            return services[0]

    @api.post("")
    def join(body: JoinBody) -> dict[str, Any]:
        try:
            return get_service().join(body.node, body.role, body.gpus).to_dict()
        except UsageError as err:
            raise HTTPException(409 if "already" in str(err) else 422, str(err)) from None

    @api.get("/{node}")
    def node_status(node: str) -> dict[str, Any]:
        try:
            return get_service().status(node)
        except UsageError as err:
            raise HTTPException(404, str(err)) from None

    @api.delete("/{node}")
    def leave(node: str) -> dict[str, Any]:
        try:
            return {"node": node, "engines_removed": get_service().leave(node)}
        except UsageError as err:
            raise HTTPException(404, str(err)) from None

    return api
