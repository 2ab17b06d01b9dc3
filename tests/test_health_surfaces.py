"""Liveness and readiness are defined once and every surface agrees (issue 34 item 6).

``/healthz`` said ``ready`` while ``/api/v1/status`` said ``starting``: the status took its
state from the system's view, ``/healthz`` from the live cluster. Now the state is
``LiveCluster.phase()`` everywhere (the view carries it) and readiness is
``LiveCluster.readiness()`` everywhere, ``dualpath status`` included
(docs/troubleshooting.md, "Liveness and readiness").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dualpath_cli.api.app import create_app
from dualpath_cli.api.auth import TokenAuth
from dualpath_cli.cli.status_cmd import _summary
from dualpath_cli.runtime.options import RuntimeOptions
from dualpath_cli.services.live import LiveCluster
from dualpath_cli.telemetry.status import Status, status_from_dict


def _surfaces(client: Any) -> dict[str, Any]:
    health = client.get("/healthz")
    ready = client.get("/readyz")
    status = client.get("/api/v1/status").json()
    return {"healthz": (health.status_code, health.json()["state"], health.json()["ready"]),
            "readyz": ready.status_code == 200,
            "status": (status["state"], status["ready"]),
            "view": client.get("/api/v1/metrics").json()["state"]}


def _agree(s: dict[str, Any], state: str, ready: bool) -> None:
    assert s == {"healthz": (200, state, ready), "readyz": ready, "status": (state, ready),
                 "view": state}, s


@pytest.mark.e2e
def test_every_surface_gives_one_state_and_one_readiness(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    live = LiveCluster(RuntimeOptions(processes=True, store_dir=tmp_path / "store",
                                      heartbeat_timeout=10.0))
    client = TestClient(create_app(live, TokenAuth.generate(tmp_path / "token")))
    try:
        _agree(_surfaces(client), "starting", False)  # alive (200) before it can serve
        live.spawn()
        _agree(_surfaces(client), "starting", False)
        live.wait_ready(60)
        _agree(_surfaces(client), "ready", True)
        live.drain(10)
        s = _surfaces(client)
        assert s["healthz"][0] == 200 and not s["readyz"] and s["status"][1] is False
        assert s["healthz"][1] == s["status"][0] == s["view"] != "ready"
    finally:
        live.close()
        client.close()


def _status(ready: bool | None, state: str, healthy: int, total: int) -> Status:
    return status_from_dict({"state": state, "ready": ready, "not_ready": "" if ready else "x",
                             "pd": "1P2D", "model": "tiny", "policy": "dualpath",
                             "engines": {"healthy": healthy, "total": total},
                             "queue": {}, "thresholds": {"alpha_tokens": 1, "beta_tokens": 1,
                                                         "z_factor": 1.0, "quota_s": 0.3,
                                                         "read_side": "dualpath",
                                                         "source": {}, "controllers": {}},
                             "decisions": 0, "ready_s": 1.0, "uptime_s": 2.0, "audit": [],
                             "faults": []})


@pytest.mark.parametrize("ready,healthy,running", [(True, 3, True), (True, 2, True),
                                                   (False, 3, False)])
def test_dualpath_status_runs_exactly_when_the_server_is_ready(ready: bool, healthy: int,
                                                                running: bool) -> None:
    assert _summary(_status(ready, "ready", healthy, 3), "http://x", None)["running"] is running
