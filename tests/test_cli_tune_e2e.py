"""`dualpath tune` against a real served cluster on loopback (a LiveCluster behind uvicorn):
the server's audit units, its controller switches and its decision log, not the fake's."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from served_cluster import serve_with_token
from test_api_server import run_turns

from dualpath_cli.cli.app import main
from dualpath_cli.runtime.options import RuntimeOptions
from dualpath_cli.services.live import LiveCluster
from dualpath_cli.telemetry.gpu import FakeGpuBackend

pytestmark = pytest.mark.e2e  # an API server and the CLI as a subprocess


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveCluster, str, str]]:
    with serve_with_token(RuntimeOptions(policy="round-robin", block_tokens=8),
                          tmp_path_factory.mktemp("run") / "token", FakeGpuBackend(())) as s:
        for agent in range(3):
            run_turns(s.live, f"agent-{agent}", 4, seed=agent + 1)
        yield s.live, s.url, s.auth.token


@pytest.fixture(autouse=True)
def env(served: tuple[LiveCluster, str, str], clean_config: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing of the caller's setup (conftest.clean_config); the served cluster's URL and
    token instead."""
    monkeypatch.setenv("DUALPATH_URL", served[1])
    monkeypatch.setenv("DUALPATH_TOKEN", served[2])
    monkeypatch.setenv("COLUMNS", "200")


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    code = main([*args, "--json"])
    out = capsys.readouterr()
    assert code == 0, out.err
    return json.loads(out.out)


def test_set_then_rollback_through_the_real_api(
        served: tuple[LiveCluster, str, str], capsys: pytest.CaptureFixture[str]) -> None:
    live = served[0]
    before = live.view().scheduler.thresholds
    run_json(capsys, "tune", "set", "alpha=5000", "beta=90000", "--yes")
    th = live.view().scheduler.thresholds
    assert (th.alpha_tokens, th.beta_tokens) == (5_000, 90_000)
    assert th.source["alpha"] == "api"
    shown = run_json(capsys, "tune", "show")
    assert shown["thresholds"]["alpha"] == {"value": 5_000, "source": "api"}
    assert shown["scheduling"] == {"hierarchical": False, "sub_schedulers": 1,
                                   "nodes_per_group": 1}
    undo = run_json(capsys, "tune", "rollback", "--yes")  # the server's scheduler units
    assert undo["restore"]["alpha"] == before.alpha_tokens
    th = live.view().scheduler.thresholds
    assert (th.alpha_tokens, th.beta_tokens) == (before.alpha_tokens, before.beta_tokens)


def test_auto_turns_the_schedulers_controllers_on(
        served: tuple[LiveCluster, str, str], capsys: pytest.CaptureFixture[str]) -> None:
    live = served[0]
    data = run_json(capsys, "tune", "auto", "--yes", "--for", "1s", "--window", "500ms",
                    "--interval", "250ms")
    assert data["mode"] == "server" and not data["rolled_back"]  # idle: nothing to judge
    on = live.view().scheduler.thresholds.controllers
    assert all(on[name]["on"] for name in ("alpha", "beta", "quota"))
    run_json(capsys, "tune", "rollback", "--yes")  # the switches come back off
    on = live.view().scheduler.thresholds.controllers
    assert not any(on[name]["on"] for name in ("alpha", "beta", "quota"))


def test_suggest_replays_the_live_decision_log(capsys: pytest.CaptureFixture[str]) -> None:
    data = run_json(capsys, "tune", "suggest", "--top", "2")
    assert data["traffic"]["agents"] >= 3 and data["world"]["kind"] == "embedded"
    assert data["current"]["read_side"] == "round-robin"
    assert data["searched"] >= 8 and data["best"]
