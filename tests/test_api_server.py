"""The HTTP API end to end on loopback: a real LiveCluster, a real uvicorn server, our client.

Nothing of our own server is mocked: turns are admitted through the live cluster, and every
check goes over HTTP (the typed client, or httpx for raw status codes and headers).
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from dualpath_cli.api.app import create_app
from dualpath_cli.api.auth import TokenAuth
from dualpath_cli.api.client import DualPathClient
from dualpath_cli.api.errors import Forbidden, Rejected, Unauthorized, Unreachable
from dualpath_cli.api.server import ServerThread
from dualpath_cli.runtime.options import RuntimeOptions
from dualpath_cli.services.live import LiveCluster
from dualpath_cli.telemetry.gpu import FakeGpuBackend, GpuDevice
from dualpath_cli.telemetry.view import ClusterView

pytestmark = pytest.mark.e2e  # an API server over a live cluster

PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
#: Heartbeat timeout for these clusters: on a loaded CI host an engine thread can miss the
#: default 1 s and be declared dead; these tests are about the API, not failure detection.
SLOW_HOST_S = 30.0


def run_turns(live: LiveCluster, session: str, turns: int, first: int = 40,
              append: int = 12, gen: int = 3, seed: int = 1) -> list[int]:
    """``turns`` turns of one agent, each extending the last; returns cached tokens per turn."""
    ctx: list[int] = []
    cached = []
    for t in range(turns):
        new = [(seed * 31 + t * 17 + i * 7) % 250 + 1 for i in range(first if t == 0
                                                                        else append)]
        prompt = ctx + new
        ticket = live.submit(prompt, gen, session)
        result = ticket.wait(60)
        live.done(ticket)
        cached.append(result.cached)
        ctx = prompt + list(result.tokens)
    return cached


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveCluster,
                                                                         TokenAuth, str]]:
    live = LiveCluster(RuntimeOptions(policy="round-robin", block_tokens=8,
                                      heartbeat_timeout=SLOW_HOST_S))
    live.start()
    auth = TokenAuth.generate(tmp_path_factory.mktemp("run") / "token")
    gpu = FakeGpuBackend((GpuDevice(0, "H200", "GPU-0", 0.5, 2**30, 2**37),))
    try:
        with ServerThread(create_app(live, auth, gpu=gpu)) as server:
            yield live, auth, server.url
    finally:
        live.drain(10)


@pytest.fixture()
def client(cluster: tuple[LiveCluster, TokenAuth, str]) -> Iterator[DualPathClient]:
    _, auth, url = cluster
    with DualPathClient(url, auth.token, timeout=20) as c:
        yield c


def test_health_ready_and_status(cluster: tuple[LiveCluster, TokenAuth, str],
                                 client: DualPathClient) -> None:
    live, _, url = cluster
    assert client.healthz() and client.readyz()
    ready = httpx.get(f"{url}/readyz")
    assert ready.status_code == 200 and ready.json()["status"] == "ready"
    st = client.status()
    assert (st.state, st.pd, st.model, st.policy) == ("ready", "1P2D", "tiny", "round-robin")
    assert (st.engines_healthy, st.engines_total) == (3, 3)
    assert set(st.queue) == {"fifo", "private", "pe", "in_flight"}
    assert st.thresholds.alpha_tokens == live.opts.alpha
    assert st.thresholds.source["alpha"] in ("config", "api")
    # storage NICs without a rate (snic_bw 0): nothing turns alpha into seconds of reading
    assert live.opts.snic_bw == 0 and st.thresholds.alpha_s is None
    assert st.scheduling == {"hierarchical": False, "sub_schedulers": 1, "nodes_per_group": 1}
    assert st.ready_s == live.ready_s and st.ready_s is not None and st.uptime_s > 0
    assert st.faults == ()


def test_read_model_over_http_is_the_typed_view(cluster: tuple[LiveCluster, TokenAuth, str],
                                                client: DualPathClient) -> None:
    live, _, url = cluster
    run_turns(live, "reader", 2)
    view = client.view()
    assert isinstance(view, ClusterView) and view.state == "ready"
    assert [e.role for e in view.engines] == ["prefill", "decode", "decode"]
    assert [(e.engine_id, e.role, e.node) for e in client.engines()] == [
        (e.engine_id, e.role, e.node) for e in view.engines]
    assert [n.node for n in client.nodes()] == [0, 1, 2]
    assert view.scheduler.decisions.total >= 2
    raw = httpx.get(f"{url}/api/v1/metrics")
    assert raw.headers["content-type"] == "application/json"
    assert "NaN" not in raw.text


def test_patch_needs_the_token(cluster: tuple[LiveCluster, TokenAuth, str]) -> None:
    live, auth, url = cluster
    before = len(live.audit)
    missing = httpx.patch(f"{url}/api/v1/scheduler", json={"alpha": "200K"})
    assert missing.status_code == 401
    assert missing.headers["www-authenticate"] == "Bearer"
    assert "bearer token" in missing.json()["detail"]
    wrong = httpx.patch(f"{url}/api/v1/scheduler", json={"alpha": "200K"},
                        headers={"Authorization": "Bearer not-the-token"})
    assert wrong.status_code == 403 and "does not match" in wrong.json()["detail"]
    with pytest.raises(Unauthorized, match="HTTP 401"):
        DualPathClient(url).update_scheduler(alpha="200K")
    with pytest.raises(Forbidden, match="HTTP 403"):
        DualPathClient(url, "nope").update_scheduler(alpha="200K")
    assert len(live.audit) == before  # nothing refused was applied or audited


@pytest.mark.parametrize("body,reason", [
    ({"alpha": "12 parsecs"}, "invalid alpha"),
    ({"beta": 1}, "below one block"),
    ({"quota": "-1s"}, "quota"),
    ({"read_side": "sideways"}, "unknown read-side policy"),
    ({"gamma": 3}, "gamma"),
    ({}, "nothing to change"),
    ({"alpha": [1, 2]}, "alpha"),
    ({"alpha": True}, "alpha"),  # strict: a bool is not a number of tokens
    ({"quota": False}, "quota"),
    ({"alpha": None, "quota": None}, "null is not a value"),
])
def test_bad_values_are_422_with_the_reason(cluster: tuple[LiveCluster, TokenAuth, str],
                                            body: dict, reason: str) -> None:
    live, auth, url = cluster
    before = len(live.audit)
    resp = httpx.patch(f"{url}/api/v1/scheduler", json=body,
                       headers={"Authorization": f"Bearer {auth.token}"})
    assert resp.status_code == 422, resp.text
    detail = resp.json()["detail"]
    assert reason in detail and "\n" not in detail
    assert len(live.audit) == before


def test_an_accepted_patch_changes_later_decisions_and_is_audited(
        cluster: tuple[LiveCluster, TokenAuth, str], client: DualPathClient,
        caplog: pytest.LogCaptureFixture) -> None:
    live, auth, _ = cluster
    start = max((d.seq for d in client.decisions()), default=0)
    for s in range(3):
        run_turns(live, f"before-{s}", 3, seed=s + 10)
    before = [d for d in client.decisions(start) if d.cached]
    assert {d.side for d in before} == {"pe", "de"}  # round-robin alternates
    assert all(d.inputs["read_side"] == "round-robin" for d in before)
    mark = max(d.seq for d in client.decisions(start))
    with caplog.at_level(logging.DEBUG):
        entry = client.update_scheduler(read_side="basic", alpha="200K", quota="250ms")
    assert auth.token not in caplog.text  # the token is never logged
    assert entry.token_id == auth.token_id and entry.action == "scheduler"
    assert entry.new["read_side"] == "basic" and entry.new["alpha_tokens"] == 200_000
    assert entry.old["read_side"] == "round-robin"
    for s in range(3):
        run_turns(live, f"after-{s}", 3, seed=s + 20)
    after = [d for d in client.decisions(mark) if d.cached]
    assert after and all(d.seq > mark for d in after)
    assert {d.side for d in after} == {"pe"}  # basic: always the PE side
    assert all(d.inputs["read_side"] == "basic" and d.inputs["alpha"] == 200_000
               for d in after)
    st = client.status()
    assert st.audit[-1] == entry
    assert st.thresholds.read_side == "basic" and st.thresholds.alpha_tokens == 200_000
    assert st.thresholds.quota_s == pytest.approx(0.25)
    assert st.thresholds.source["read_side"] == "api"
    assert auth.token not in json.dumps(httpx.get(f"{client.url}/api/v1/status").json())


def test_decisions_since_and_bad_since(cluster: tuple[LiveCluster, TokenAuth, str],
                                       client: DualPathClient) -> None:
    live, _, url = cluster
    run_turns(live, "since", 2)
    everything = client.decisions()
    assert everything and [d.seq for d in everything] == sorted(d.seq for d in everything)
    last = everything[-1].seq
    assert client.decisions(last) == []
    assert [d.seq for d in client.decisions(last - 1)] == [last]
    assert {"de_route", "de_place", "pe_engines"} <= set(everything[-1].inputs)
    for bad in ("abc", "-2"):
        resp = httpx.get(f"{url}/api/v1/decisions", params={"since": bad})
        assert resp.status_code == 422 and "since" in resp.json()["detail"]


def test_metrics_page_passes_promtool_and_carries_the_families(
        cluster: tuple[LiveCluster, TokenAuth, str], client: DualPathClient) -> None:
    live, _, url = cluster
    run_turns(live, "metrics", 2)
    text = client.metrics_text()
    resp = httpx.get(f"{url}/metrics")
    assert resp.headers["content-type"].startswith("text/plain; version=0.0.4")
    for family in ("dualpath_cluster_ready 1", "dualpath_engine_up{",
                   "dualpath_ttft_seconds_bucket{le=", "dualpath_scheduler_decisions_total{",
                   "dualpath_layer_cache_hits_total{", "dualpath_host_memory_total_bytes",
                   "dualpath_gpu_available 1", "dualpath_gpu_device_utilization_ratio{",
                   "dualpath_storage_read_bytes_total{"):
        assert family in text, family
    if not shutil.which(PROMTOOL):
        pytest.skip("promtool is not installed (Debian package prometheus)")
    done = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr


def test_openapi_document_and_json_errors(cluster: tuple[LiveCluster, TokenAuth, str]) -> None:
    _, _, url = cluster
    doc = httpx.get(f"{url}/openapi.json").json()
    assert doc["info"]["title"] == "dualpath"
    for path in ("/healthz", "/readyz", "/api/v1/status", "/api/v1/engines",
                 "/api/v1/nodes", "/api/v1/metrics", "/api/v1/decisions", "/metrics"):
        assert "get" in doc["paths"][path], path
    patch = doc["paths"]["/api/v1/scheduler"]["patch"]
    assert patch["security"] and "HTTPBearer" in doc["components"]["securitySchemes"]
    assert set(doc["components"]["schemas"]["SchedulerPatch"]["properties"]) == {
        "alpha", "beta", "quota", "read_side", "dynamic_alpha", "dynamic_beta",
        "dynamic_quota"}
    missing = httpx.get(f"{url}/api/v1/nothing-here")
    assert missing.status_code == 404 and missing.json() == {"detail": "Not Found"}
    wrong_method = httpx.post(f"{url}/api/v1/status")
    assert wrong_method.status_code == 405 and "\n" not in wrong_method.json()["detail"]


def test_remote_bind_needs_the_token_everywhere(cluster: tuple[LiveCluster, TokenAuth, str],
                                                tmp_path: Path) -> None:
    live, _, _ = cluster
    auth = TokenAuth.generate(tmp_path / "token")
    app = create_app(live, auth, allow_remote=True, gpu=FakeGpuBackend())
    with ServerThread(app) as server:
        for path in ("/healthz", "/readyz", "/api/v1/status", "/api/v1/metrics",
                     "/api/v1/decisions", "/metrics", "/api/v1/engines"):
            assert httpx.get(server.url + path).status_code == 401, path
            wrong = httpx.get(server.url + path, headers={"Authorization": "Bearer x"})
            assert wrong.status_code == 403, path
        with DualPathClient(server.url, auth.token) as c:
            assert c.healthz() and c.readyz() and c.status().engines_total == 3
            assert "dualpath_gpu_available 0" in c.metrics_text()


def test_client_errors_are_one_line_and_name_the_url(
        cluster: tuple[LiveCluster, TokenAuth, str]) -> None:
    _, auth, url = cluster
    with ServerThread(create_app(*cluster[:2], gpu=FakeGpuBackend())) as server:
        dead = server.url
    with pytest.raises(Unreachable, match="cannot reach the dualpath API at") as err:
        DualPathClient(dead, timeout=2).status()
    assert dead in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(Rejected, match="invalid alpha") as bad:
        DualPathClient(url, auth.token).update_scheduler(alpha="lots")
    assert bad.value.status == 422 and bad.value.exit_code == 2


def test_readyz_turns_green_only_when_every_engine_has_said_hello(tmp_path: Path) -> None:
    live = LiveCluster(RuntimeOptions(block_tokens=8, heartbeat_timeout=SLOW_HOST_S))
    auth = TokenAuth.generate(tmp_path / "token")
    try:
        with ServerThread(create_app(live, auth, gpu=FakeGpuBackend())) as server:
            with DualPathClient(server.url) as c:
                assert c.healthz()  # the process answers before the engines are up
                assert not c.readyz()
                resp = httpx.get(f"{server.url}/readyz")
                assert resp.status_code == 503
                assert resp.json() == {"detail": "not ready: cluster is starting"}
                live.start()
                assert c.readyz()
                live.drain(10)
                assert not c.readyz()
                assert "stopped" in httpx.get(f"{server.url}/readyz").json()["detail"]
    finally:
        live.close()


def test_server_socket_lets_asyncio_set_tcp_nodelay() -> None:
    """proto 0 made asyncio skip TCP_NODELAY: each response then waited ~40 ms for an ACK."""
    import socket

    from fastapi import FastAPI

    with ServerThread(FastAPI()) as server:
        assert server.sock.proto == socket.IPPROTO_TCP
        assert httpx.get(f"{server.url}/openapi.json").status_code == 200
