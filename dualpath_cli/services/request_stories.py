"""The stories of a live cluster's requests: one request by any of its ids, or a page of them.

Why apart from :mod:`~dualpath_cli.services.live`: the live cluster admits and serves; telling
what became of a request (``dualpath explain``, ``GET /api/v1/requests``) reads the
scheduler's decision log, ledger and in-flight rows and tells them with
:mod:`~dualpath_cli.diagnose.explain`, which is all this module does.
"""

from __future__ import annotations

import time
from typing import Any

from dualpath_cli.cluster.system import RuntimeSystem
from dualpath_cli.telemetry.request_ids import RequestAliases

__all__ = ["request_story", "request_listing"]


def request_story(system: RuntimeSystem, aliases: RequestAliases,
                  request_id: int | str) -> dict[str, Any]:
    """A request's story (diagnose/explain.py: ``dualpath explain``): the whole story once
    it finished, what is known so far while it is in flight. ``request_id``: the integer id,
    the OpenAI body's id or a client's ``x-request-id`` (telemetry/request_ids.py).

    Raises:
        RequestNotFound: an id nothing is known of, or a request not in flight with no
            decision of it kept.
    """
    from dualpath_cli.diagnose import explain

    rid = aliases.resolve(request_id)
    if rid is None:
        raise explain.RequestNotFound(explain.unknown_id(request_id))
    sched = system.scheduler
    decisions, outcome = sched.request(rid)
    progress = None
    if outcome is None:
        now, _, rows = sched.in_flight(rid=rid)
        if rows:
            progress = explain.inflight_row(rows[0], decisions[-1] if decisions else None,
                                            now, time.time(), _kv_bytes_per_token(system))
            outcome = explain.partial_outcome(rows[0])
    return explain.explain_request(rid, decisions, outcome, progress=progress,
                                   block_tokens=system.namespace.shape.block_tokens,
                                   aliases=aliases.of(rid))


def request_listing(system: RuntimeSystem, aliases: RequestAliases, state: str, limit: int,
                    after: int | None = None) -> dict[str, Any]:
    """``GET /api/v1/requests``: the turns in flight (``inflight``: oldest first, at most
    ``limit``, with ``total``) or the stories of finished requests (``finished``: in finish
    order; the newest ``limit``, or the first after request ``after``)."""
    from dualpath_cli.diagnose import explain

    sched = system.scheduler
    at = time.time()
    if state == "inflight":
        now, total, rows = sched.in_flight(limit)
        by_rid = explain.decisions_by_rid(sched.decisions(), (r["rid"] for r in rows))
        kvb = _kv_bytes_per_token(system)
        return {"state": state, "at": at, "total": total, "requests": [
            explain.inflight_row(r, by_rid[r["rid"]][-1] if r["rid"] in by_rid else None,
                                 now, at, kvb) for r in rows]}
    done = sched.ledger.finished_after(after, limit)
    return {"state": state, "at": at, "requests": explain.finished_stories(
        done, sched.decisions(), system.namespace.shape.block_tokens, aliases.of)}


def _kv_bytes_per_token(system: RuntimeSystem) -> int:
    shape = system.shape
    return int(shape.n_layers * shape.bytes_per_token_layer)
