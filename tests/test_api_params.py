"""Integer query and path parameters are range-checked (422), and no request takes its
keep-alive connection down (issue 34 item 3).

``GET /api/v1/decisions?since=9223372036854775808`` once decisions existed answered 500
(``islice`` refused the index) and uvicorn then closed the connection, so the client's next
request on it was reset.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from dualpath_cli.api.app import create_app
from dualpath_cli.api.auth import TokenAuth
from dualpath_cli.api.params import INT_MAX
from dualpath_cli.api.server import ServerThread
from dualpath_cli.runtime.decisions import DecisionLog
from dualpath_cli.telemetry.gpu import FakeGpuBackend
from dualpath_cli.telemetry.registry import MetricsRegistry

TOKEN = "t" * 43


class _Live:
    """The few LiveCluster calls these routes make; ``requests`` has a bug on purpose."""

    opts = SimpleNamespace(model="tiny", api_rate_limit=5000.0)

    def __init__(self) -> None:
        self.log = DecisionLog(8, MetricsRegistry())
        for i in range(3):
            self.log.record_control(at=float(i), name="alpha", inputs={})

    def decisions(self, since: int) -> list[Any]:
        return self.log.since(since)

    def requests(self, state: str, limit: int, after: int | None) -> dict[str, Any]:
        raise RuntimeError("a bug in a handler")

    def readiness(self) -> tuple[bool, str]:
        return True, ""

    def phase(self) -> str:
        return "running"

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"unexpected live.{name}")


def _app() -> Any:
    return create_app(_Live(), TokenAuth(TOKEN), gpu=FakeGpuBackend())  # type: ignore[arg-type]


def _unbounded(schema: Any) -> bool:
    if isinstance(schema, dict):
        if schema.get("type") == "integer" and schema.get("maximum", INT_MAX + 1) > INT_MAX:
            return True
        return any(_unbounded(v) for v in schema.values())
    if isinstance(schema, list):
        return any(_unbounded(v) for v in schema)
    return False


def test_every_integer_parameter_has_both_bounds() -> None:
    doc = _app().openapi()
    seen, unbounded = 0, []
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            for param in op.get("parameters", []):
                if "integer" in json.dumps(param.get("schema")):
                    seen += 1
                    if _unbounded(param["schema"]):
                        unbounded.append(f"{method.upper()} {path} {param['name']}")
    assert seen >= 5 and unbounded == []


def test_the_decision_log_takes_the_largest_seq() -> None:
    log = DecisionLog(4, MetricsRegistry())
    log.record_control(at=0.0, name="alpha", inputs={})
    assert log.since(INT_MAX) == [] and len(log.since(-1)) == 1


@pytest.fixture(scope="module")
def conn() -> Iterator[http.client.HTTPConnection]:
    with ServerThread(_app()) as server:
        c = http.client.HTTPConnection(server.host, server.port, timeout=30)
        yield c
        c.close()


def _ask(c: http.client.HTTPConnection, method: str, path: str) -> tuple[int, Any]:
    c.request(method, path, headers={"Authorization": f"Bearer {TOKEN}"})
    res = c.getresponse()
    return res.status, json.loads(res.read())


@pytest.mark.e2e
@pytest.mark.parametrize("method,path", [
    ("GET", f"/api/v1/decisions?since={2**63}"),
    ("GET", f"/api/v1/decisions?since={10**30}"),
    ("GET", "/api/v1/decisions?since=-2"),
    ("GET", f"/api/v1/requests?state=finished&after={2**63}"),
    ("GET", f"/api/v1/requests?limit={2**63}"),
    ("DELETE", f"/api/v1/faults/{2**63}"),
    ("POST", f"/api/v1/engines/{2**64}/compact"),
])
def test_an_integer_out_of_range_is_422_and_the_connection_lives_on(
        conn: http.client.HTTPConnection, method: str, path: str) -> None:
    status, body = _ask(conn, method, path)
    assert status == 422 and isinstance(body["detail"], str) and "\n" not in body["detail"]
    assert _ask(conn, "GET", "/healthz")[0] == 200  # the same keep-alive connection


@pytest.mark.e2e
def test_the_largest_since_is_an_empty_answer(conn: http.client.HTTPConnection) -> None:
    assert _ask(conn, "GET", f"/api/v1/decisions?since={INT_MAX}") == (
        200, {"since": INT_MAX, "decisions": []})
    status, body = _ask(conn, "GET", "/api/v1/decisions?since=1")
    assert status == 200 and [d["seq"] for d in body["decisions"]] == [2, 3]


@pytest.mark.e2e
def test_a_bug_in_a_handler_is_500_and_the_connection_lives_on(
        conn: http.client.HTTPConnection) -> None:
    status, body = _ask(conn, "GET", "/api/v1/requests")
    assert status == 500 and body == {"detail": "internal error: RuntimeError: a bug in a "
                                                "handler"}
    assert _ask(conn, "GET", "/healthz")[0] == 200  # not reset
