"""``/api/v1/storage/warm``: warm the engines' DRAM caches with template prefixes (seed 8.3).

``POST`` (token, audited as ``warm``) takes the templates (the templates file's list, see
docs/warmup.md), an optional cap (``rate``: ``10%`` of a node's storage NIC by default, or a
bandwidth) and the engines' role; it plans against the live store and starts each engine's
warm-up. ``GET`` shows the last plan and the progress summed from the engines' metrics
(``dualpath_storage_warm_bytes_total``, ``dualpath_storage_warm_blocks_remaining``).
``DELETE`` (token, audited) stops a warm-up in progress.
"""

from __future__ import annotations

import threading
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StrictStr

from dualpath_cli.api.app import require_token
from dualpath_cli.services.live import LiveCluster

__all__ = ["router", "WarmBody"]


class WarmBody(BaseModel):
    """A warm-up: templates (each a name and tokens, text or shared), a cap and a role."""

    model_config = ConfigDict(extra="forbid")

    templates: list[dict[str, Any]] = Field(min_length=1, examples=[[
        {"name": "system", "text": "You are a careful coding agent."},
        {"name": "tools", "tokens": [1, 2, 3]}]])
    rate: StrictStr | None = Field(None, examples=["10%", "200MB/s"], description=(
        "The warm-up's cap per node: a share of its storage NIC (default 10%) or a "
        "bandwidth."))
    role: Literal["all", "prefill", "decode"] = "all"


def router(live: LiveCluster) -> APIRouter:
    """The warm-up routes of ``live``."""
    r = APIRouter(tags=["storage"])
    last: dict[str, Any] = {}
    lock = threading.Lock()

    def _progress() -> dict[str, Any]:
        from dualpath_cli.services.warm import live_progress

        with lock:
            plan = dict(last)
        progress = live_progress(live.system.metrics(fresh=True, timeout=2.0),
                                 plan.get("engines"))
        return {**plan, "progress": progress}

    @r.post("/api/v1/storage/warm")
    def post_warm(body: WarmBody, token: Annotated[str, Depends(require_token)]
                  ) -> JSONResponse:
        """Start warming the engines' DRAM caches with the templates' stored prefixes."""
        from dualpath_cli.core.reference_model import model_config
        from dualpath_cli.services.warm import parse_templates, start_live

        system = live.system
        vocab = model_config(system.opts.model).vocab_size
        templates = parse_templates(body.templates, "request body", vocab)
        plan, started = start_live(system, templates, body.rate, body.role)
        summary = {"plan": plan.to_dict(), **started}
        entry = live.record_audit("warm", {}, {"templates": [t.name for t in templates],
                                         "blocks": len(plan.keys), "rate_bps":
                                         started["rate_bps"], "role": body.role}, token)
        with lock:
            last.clear()
            last.update(summary)
        return JSONResponse({"seq": entry.seq, **summary})

    @r.get("/api/v1/storage/warm")
    def get_warm() -> JSONResponse:
        """The last warm-up's plan and its progress on the engines."""
        return JSONResponse(_progress())

    @r.delete("/api/v1/storage/warm")
    def delete_warm(token: Annotated[str, Depends(require_token)]) -> JSONResponse:
        """Stop a warm-up in progress (audited)."""
        sent = live.system.warm([], 1.0)
        entry = live.record_audit("warm", {}, {"stopped": sent}, token)
        return JSONResponse({"seq": entry.seq, "stopped": sent})

    return r
