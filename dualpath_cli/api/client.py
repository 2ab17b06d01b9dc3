"""The typed Python client of a live cluster's API (what monitor, TUI, diagnose, tune use).

Light on purpose: httpx and the read model only, never FastAPI or the runtime, so a
front-end starts fast and can be tested against :class:`~dualpath_cli.api.fake.FakeClient`,
which has the same methods. Every failure is one :class:`~dualpath_cli.api.errors.ApiError`
line: no server at the URL is :class:`~dualpath_cli.api.errors.Unreachable` naming the URL.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import httpx

from dualpath_cli.api.errors import (
    ApiError,
    NotReady,
    Rejected,
    Unreachable,
    error_for_status,
)
from dualpath_cli.errors import UsageError
from dualpath_cli.telemetry.status import Status, status_from_dict
from dualpath_cli.telemetry.stories import RequestListing, RequestStory
from dualpath_cli.telemetry.view import (
    AuditEntry,
    ClusterView,
    Decision,
    EngineView,
    LayerHits,
    NodeView,
    decision_from_dict,
    fields_of,
    view_from_dict,
)
from dualpath_cli.telemetry.warmup import Template, WarmUp

__all__ = ["DualPathClient", "AuditEntry", "audit_from_dict", "engine_from_dict",
           "node_from_dict", "DEFAULT_TIMEOUT"]

DEFAULT_TIMEOUT = 10.0

def audit_from_dict(data: dict[str, Any]) -> AuditEntry:
    """An :class:`AuditEntry` from its JSON form."""
    return fields_of(AuditEntry, data)


def engine_from_dict(data: dict[str, Any]) -> EngineView:
    """An :class:`EngineView` from its JSON form."""
    layers = tuple(fields_of(LayerHits, x) for x in data.get("layers", ()))
    return fields_of(EngineView, {**data, "layers": layers})


def node_from_dict(data: dict[str, Any]) -> NodeView:
    """A :class:`NodeView` from its JSON form."""
    return fields_of(NodeView, {**data, "engines": tuple(data.get("engines", ()))})


class DualPathClient:
    """A client of one cluster's API.

    Args:
        url: the API's base URL (``http://127.0.0.1:8470``; the launch state file has it).
        token: the bearer token (needed for control, and for everything on a remote bind).
        timeout: seconds for connecting and for each answer.
        transport: an httpx transport (tests; default: the network).
    """

    def __init__(self, url: str, token: str | None = None, timeout: float = DEFAULT_TIMEOUT,
                 *, transport: httpx.BaseTransport | None = None) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout,
                                      transport=transport, trust_env=False)
        except (httpx.InvalidURL, ValueError) as err:  # a URL httpx cannot even parse
            raise UsageError(f"--url {url!r}: not a usable URL ({err})") from None

    @classmethod
    def from_token_file(cls, url: str, path: str | os.PathLike[str],
                        timeout: float = DEFAULT_TIMEOUT) -> DualPathClient:
        """A client using the token in ``path`` (refused when others can read the file)."""
        from dualpath_cli.api.auth import TokenAuth

        return cls(url, TokenAuth.load(path).token, timeout)

    def __repr__(self) -> str:  # never the token
        return f"DualPathClient({self.url!r})"

    def __enter__(self) -> DualPathClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    # -- transport ----------------------------------------------------------------------
    def _request(self, method: str, path: str, *, ok: tuple[int, ...] = (200,),
                 **kw: Any) -> httpx.Response:
        where = f"{self.url}{path}"
        try:
            resp = self._http.request(method, path, **kw)
        except httpx.ConnectError as err:
            raise Unreachable(f"cannot reach the dualpath API at {self.url}: "
                              f"{_reason(err)} (is `dualpath launch` running there?)"
                              ) from None
        except httpx.TimeoutException:
            raise Unreachable(f"the dualpath API at {self.url} did not answer {method} {path} "
                              f"within {self.timeout:g} s") from None
        except httpx.HTTPError as err:
            raise Unreachable(f"{method} {where} failed: {_reason(err)}") from None
        if resp.status_code not in ok:
            raise error_for_status(resp.status_code, _detail(resp), where)
        return resp

    def _json(self, method: str, path: str, **kw: Any) -> Any:
        resp = self._request(method, path, **kw)
        try:
            return resp.json()
        except ValueError:
            raise ApiError(f"{self.url}{path}: the answer is not JSON "
                           f"({resp.headers.get('content-type', 'no content type')})",
                           resp.status_code) from None

    # -- read ---------------------------------------------------------------------------
    def healthz(self) -> bool:
        """True when the server process answers (raises Unreachable when it does not)."""
        self._request("GET", "/healthz")
        return True

    def readyz(self) -> bool:
        """True when every engine has said hello and turns are admitted; False if not yet."""
        resp = self._request("GET", "/readyz", ok=(200, 503))
        return resp.status_code == 200

    def status(self) -> Status:
        """State, shape, engines healthy/total, queues, thresholds, audit."""
        return status_from_dict(self._json("GET", "/api/v1/status"))

    def view(self) -> ClusterView:
        """The whole ClusterView now."""
        return view_from_dict(self._json("GET", "/api/v1/metrics"))

    def engines(self) -> list[EngineView]:
        """Every engine."""
        return [engine_from_dict(e) for e in self._json("GET", "/api/v1/engines")]

    def nodes(self) -> list[NodeView]:
        """Every node."""
        return [node_from_dict(n) for n in self._json("GET", "/api/v1/nodes")]

    def decisions(self, since: int = -1) -> list[Decision]:
        """Logged decisions with ``seq > since`` (oldest first), each with its inputs."""
        data = self._json("GET", "/api/v1/decisions", params={"since": since})
        return [decision_from_dict(d) for d in data["decisions"]]

    def request(self, request_id: int | str) -> RequestStory:
        """One request's story (``dualpath explain``; diagnose/explain.py tells it):
        ``request_id`` is the integer id, the OpenAI body's id or a client's
        ``x-request-id``."""
        path = f"/api/v1/requests/{quote(str(request_id), safe='')}"
        return RequestStory.from_dict(self._json("GET", path))

    def requests(self, state: str = "inflight", limit: int = 100,
                 after: int | None = None) -> RequestListing:
        """``GET /api/v1/requests``: the turns in flight (``inflight``: ``total`` and the
        oldest ``limit``, each with phase, PE, DE, read side, KV bytes, TTFT so far) or the
        stories of finished requests (``finished``: finish order; the newest ``limit``, or
        the first after request ``after``).

        Raises:
            Rejected: a bad ``state``/``limit``, or a server without the endpoint (404).
        """
        params: dict[str, Any] = {"state": state, "limit": int(limit)}
        if after is not None:
            params["after"] = int(after)
        return RequestListing.from_dict(self._json("GET", "/api/v1/requests", params=params))

    def metrics_text(self) -> str:
        """The Prometheus exposition of ``/metrics``."""
        return self._request("GET", "/metrics").text

    # -- control ------------------------------------------------------------------------
    def update_scheduler(self, *, alpha: str | int | None = None,
                         beta: str | int | None = None, quota: str | float | None = None,
                         read_side: str | None = None) -> AuditEntry:
        """Change the running scheduler (units as on the CLI: ``200K``, ``300ms``).

        Raises:
            Unauthorized / Forbidden: no token or a wrong one.
            Rejected: a bad value (the message says which and why).
        """
        body = {k: v for k, v in (("alpha", alpha), ("beta", beta), ("quota", quota),
                                  ("read_side", read_side)) if v is not None}
        return audit_from_dict(self._json("PATCH", "/api/v1/scheduler", json=body))

    def patch_scheduler(self, body: Mapping[str, object]) -> AuditEntry:
        """PATCH ``/api/v1/scheduler`` with ``body`` as given (fields this client may not
        know yet, e.g. a controller switch, pass through; the server checks them).

        Raises:
            Unauthorized / Forbidden: no token or a wrong one.
            Rejected: a bad value or a field the server does not know (the reason in one
                line).
        """
        return audit_from_dict(self._json("PATCH", "/api/v1/scheduler", json=dict(body)))

    def set_faults(self, specs: Sequence[str]) -> AuditEntry:
        """Inject faults given as SPEC texts (``snic_throttle:node=1,fraction=0.25``).

        Raises:
            Unauthorized / Forbidden: no token or a wrong one.
            Rejected: a bad SPEC or a target the cluster lacks (the reason in one line).
        """
        return audit_from_dict(self._json("PATCH", "/api/v1/faults",
                                          json={"faults": list(specs)}))

    def clear_faults(self) -> AuditEntry:
        """Undo every injected fault (token required)."""
        return audit_from_dict(self._json("DELETE", "/api/v1/faults"))

    def clear_fault(self, fault_id: int) -> AuditEntry:
        """Undo the one injected fault numbered ``fault_id`` (token required; ``Rejected``
        when none in force has it)."""
        return audit_from_dict(self._json("DELETE", f"/api/v1/faults/{int(fault_id)}"))

    def compact_hbm(self, engine_id: int) -> AuditEntry:
        """Defragment engine ``engine_id``'s HBM pool (token required); the entry's old and
        new hold its fragmentation, largest free run and free blocks around it."""
        return audit_from_dict(self._json("POST", f"/api/v1/engines/{int(engine_id)}/compact"))

    def warm(self, templates: Sequence[Template], rate: str | None = None,
             role: str = "all") -> WarmUp:
        """Start warming the engines' DRAM caches with ``templates`` (token required): the
        plan (blocks per template), the cap in bytes/s and the engines sent to.

        Raises:
            Unauthorized / Forbidden: no token or a wrong one.
            Rejected: a bad template, rate or role, or engines without a DRAM cache.
        """
        body: dict[str, Any] = {"templates": [t.to_dict() for t in templates], "role": role}
        if rate is not None:
            body["rate"] = rate
        return WarmUp.from_dict(self._json("POST", "/api/v1/storage/warm", json=body))

    def warm_status(self) -> WarmUp:
        """The last warm-up's plan and its progress on the engines (``progress``: bytes,
        blocks_remaining, done)."""
        return WarmUp.from_dict(self._json("GET", "/api/v1/storage/warm"))

    def replicate_blocks(self, blocks: Sequence[str], copies: int | None = None
                         ) -> AuditEntry:
        """Copy hot blocks (hex keys) to the store's replica roots (token required); the
        entry's new holds the roots holding each block, what was added and what failed.

        Raises:
            Rejected: a bad key, or a store without replica roots (the reason in one line).
        """
        body: dict[str, object] = {"blocks": list(blocks)}
        if copies is not None:
            body["copies"] = int(copies)
        return audit_from_dict(self._json("POST", "/api/v1/store/replicate", json=body))


def _reason(err: Exception) -> str:
    text = str(err).strip().splitlines()
    reason = text[-1] if text else type(err).__name__
    if "refused" in reason.lower():
        return "connection refused"
    return reason


def _detail(resp: httpx.Response) -> str:
    try:
        data = resp.json()
    except ValueError:
        data = None
    if isinstance(data, dict) and isinstance(data.get("detail"), str):
        return " ".join(data["detail"].split())
    text = resp.text.strip().splitlines()
    return text[0][:200] if text else resp.reason_phrase


# re-exported for callers that catch by name
__all__ += ["ApiError", "Unreachable", "NotReady", "Rejected"]


if TYPE_CHECKING:  # mypy checks that this class implements the seam the front-ends use
    from dualpath_cli.api.protocol import ClusterClient

    _implements: type[ClusterClient] = DualPathClient
