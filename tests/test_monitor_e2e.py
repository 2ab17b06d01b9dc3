"""The operator commands end to end against a real served cluster on loopback.

A LiveCluster behind a real uvicorn server (as tests/test_api_server.py does); the console
scripts run as subprocesses with ``--url``, exactly as an operator or cron runs them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from served_cluster import serve_with_token
from test_api_server import run_turns

from dualpath_cli.runtime.options import RuntimeOptions
from dualpath_cli.services.live import LiveCluster
from dualpath_cli.telemetry.gpu import FakeGpuBackend

pytestmark = pytest.mark.e2e  # an API server and the monitor as a subprocess

BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveCluster, str]]:
    with serve_with_token(RuntimeOptions(policy="dualpath", block_tokens=8),
                          tmp_path_factory.mktemp("run") / "token", FakeGpuBackend(())) as s:
        run_turns(s.live, "warm", 3)
        yield s.live, s.url


def _run(args: list[str], tmp_path: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path)}  # never touch a real state dir
    env.pop("DUALPATH_URL", None)
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env)


def test_seed_monitor_command_by_layer_once_json(served: tuple[LiveCluster, str],
                                                tmp_path: Path) -> None:
    _, url = served
    proc = _run([str(BIN / "dualpath-monitor"), "--metric", "cache_hit", "--by-layer",
                 "--once", "--json", "--url", url], tmp_path)
    assert proc.returncode == 0, proc.stderr
    (line,) = proc.stdout.splitlines()
    obj = json.loads(line)
    assert obj["state"] == "ready" and obj["pd"] == "1P2D"
    layers = obj["layers"]
    assert [r["layer"] for r in layers] == list(range(len(layers))) and layers
    assert all(r["blocks"] > 0 for r in layers)  # the warm-up turns were served by layer
    assert all(r["slack_s"] is not None for r in layers)


def test_monitor_values_move_while_a_workload_runs(served: tuple[LiveCluster, str],
                                                   tmp_path: Path) -> None:
    live, url = served
    env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path)}
    proc = subprocess.Popen([str(BIN / "dualpath-monitor"), "--metric", "cache_hit",
                             "--by-layer", "--interval", "250ms", "--count", "12", "--json",
                             "--url", url], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()  # the monitor is sampling: now start the workload
        worker = threading.Thread(target=run_turns, args=(live, "mover", 4), kwargs={"seed": 5})
        worker.start()
        rest, err = proc.communicate(timeout=120)
        worker.join(120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    blocks = [sum(r["blocks"] for r in json.loads(x)["layers"])
              for x in [first, *rest.splitlines()]]
    assert len(blocks) == 12 and blocks[-1] > blocks[0], blocks


def test_diagnose_all_live_and_from_a_recording(served: tuple[LiveCluster, str],
                                                tmp_path: Path) -> None:
    _, url = served
    proc = _run([str(BIN / "dualpath"), "diagnose", "all", "--window", "2s", "--json",
                 "--url", url], tmp_path)
    assert proc.returncode in (0, 1, 2), proc.stderr  # a verdict, not UNKNOWN
    doc = json.loads(proc.stdout)
    assert doc["exit_code"] == proc.returncode and doc["samples"] >= 3
    assert [r["workflow"] for r in doc["reports"]] == [
        "snic-imbalance", "long-tail", "hbm-frag", "cache-hit", "scaling", "membership",
        "store-health", "fabric"]
    rec = tmp_path / "rec.jsonl.gz"
    proc = _run([str(BIN / "dualpath"), "record", "--window", "1s", "--interval", "500ms",
                 "-o", str(rec), "--url", url], tmp_path)
    assert proc.returncode == 0, proc.stderr
    proc = _run([str(BIN / "dualpath"), "diagnose", "all", "--from", str(rec), "--json"],
                tmp_path)
    assert proc.returncode in (0, 1, 2), proc.stderr
    assert json.loads(proc.stdout)["samples"] == 3


def test_a_cluster_that_went_away_is_unknown(tmp_path: Path) -> None:
    proc = _run([str(BIN / "dualpath"), "diagnose", "all", "--window", "1s", "--url",
                 "http://127.0.0.1:9"], tmp_path)
    assert proc.returncode == 3 and "cannot reach" in proc.stderr
