"""Routes nodes use to join and leave a running cluster (``launch --role ... --join``).

Every route needs the cluster's bearer token, loopback or not: a node that joins receives
work and the control endpoint's address, so a wrong token is refused (403) and no token is
401. Handlers are plain ``def`` (worker threads); errors are ``{"detail": "<one line>"}``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Depends, HTTPException
from pydantic import BaseModel, Field

from dualpath_cli.errors import UsageError
from dualpath_cli.services.joins import MAX_GPUS, JoinDesk, NoJoins

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

    desk = JoinDesk(live)
    api = APIRouter(prefix="/api/v1/join", dependencies=[Depends(require_token)])

    @api.post("")
    def join(body: JoinBody) -> dict[str, Any]:
        try:
            return desk.join(body.node, body.role, body.gpus)
        except NoJoins as err:
            raise HTTPException(404, str(err)) from None
        except UsageError as err:
            raise HTTPException(409 if "already" in str(err) else 422, str(err)) from None

    @api.get("/{node}")
    def node_status(node: str) -> dict[str, Any]:
        try:
            return desk.status(node)
        except (NoJoins, UsageError) as err:
            raise HTTPException(404, str(err)) from None

    @api.delete("/{node}")
    def leave(node: str) -> dict[str, Any]:
        try:
            return {"node": node, "engines_removed": desk.leave(node)}
        except (NoJoins, UsageError) as err:
            raise HTTPException(404, str(err)) from None

    return api
