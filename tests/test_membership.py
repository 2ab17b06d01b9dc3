"""One membership truth, with real processes: a ``--role scheduler`` launch and ``--join``ed
nodes on loopback (issue 32 items 1 and 2, issue 34 items 4 and 6).

Status counts what serves (1P1D, not the launch's default shape), a node's name is its
``--node`` name in status, metrics and the monitor; a decode node that leaves makes
``status`` exit 2 with the missing role and since when, ``/readyz`` 503, ``diagnose all``
CRITICAL, and a chat completion a 503 within ``scheduler.no_engine_wait`` (not a hang); a
node joined then removed before its hello leaves the cluster ready.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import wait_until
from test_multinode import START_S, Procs, _free_port, _json_line, launch_env

pytestmark = pytest.mark.e2e  # a scheduler and nodes as processes

NO_ENGINE_WAIT_S = 3.0


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[dict[str, Any]]:
    env = launch_env(tmp_path)
    procs = Procs(env)
    port = _free_port()
    try:
        sched = procs.start("--role", "scheduler", "--port", str(port), "--store",
                            str(tmp_path / "store"), "--set",
                            f"scheduler.no_engine_wait={NO_ENGINE_WAIT_S:g}s", "--json")
        state = _json_line(sched, START_S)
        token = Path(state["token_file"]).read_text().strip()
        with httpx.Client(base_url=state["url"], timeout=30.0,
                          headers={"Authorization": f"Bearer {token}"}) as http:
            yield {"procs": procs, "port": port, "url": state["url"], "env": env,
                   "token_file": state["token_file"], "http": http}
    finally:
        procs.close()


def _cli(c: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dualpath_cli.cli.app", *args, "--port",
                           str(c["port"])], capture_output=True, text=True, env=c["env"],
                          timeout=120)


def _status(c: dict[str, Any]) -> tuple[int, str]:
    done = _cli(c, "status")
    return done.returncode, done.stdout.strip()


def _serving(c: dict[str, Any], shape: str) -> bool:
    members = c["http"].get("/api/v1/status").json().get("membership") or {}
    return members.get("serving") == shape and c["http"].get("/readyz").status_code == 200


def test_membership_names_shape_and_a_missing_decode_role(cluster: dict[str, Any]) -> None:
    procs: Procs = cluster["procs"]
    http: httpx.Client = cluster["http"]
    # nothing joined yet: no role serves, readiness says so (and /healthz agrees)
    ready = http.get("/readyz")
    assert ready.status_code == 503 and "no prefill engine" in ready.json()["detail"]
    assert http.get("/healthz").json()["ready"] is False

    nodes = {name: procs.join(role, name, cluster["port"], cluster["token_file"])
             for name, role in (("P0", "prefill"), ("D0", "decode"))}
    for p in nodes.values():
        _json_line(p, START_S)
    wait_until(lambda: _serving(cluster, "1P1D"), START_S, "1P1D serving")

    code, line = _status(cluster)
    assert code == 0, line
    assert line.startswith("running  1P1D  2/2 engines healthy"), line
    st = http.get("/api/v1/status").json()
    assert st["pd"] == "1P1D" and st["ready"] is True
    assert {n["name"]: n["state"] for n in st["membership"]["nodes"]} == {
        "P0": "serving", "D0": "serving"}
    health = http.get("/healthz").json()
    assert health["state"] == st["state"] == "ready" and health["ready"] is True
    # the operator's names in the view, the metrics and the monitor
    assert {n["name"] for n in http.get("/api/v1/nodes").json()} == {"P0", "D0"}
    metrics = http.get("/metrics").text
    assert 'dualpath_engines{role="decode",state="ready"} 1' in metrics
    mon = _cli(cluster, "monitor", "--metric", "snic_util", "--by-node", "--once", "--json")
    assert mon.returncode == 0, mon.stderr
    assert "node D0" in mon.stdout and "node D1" not in mon.stdout

    # the decode node leaves (SIGTERM: "stopped; leaving")
    os.killpg(nodes["D0"].pid, signal.SIGTERM)
    nodes["D0"].wait(60)
    wait_until(lambda: http.get("/readyz").status_code == 503, 30, "/readyz 503")
    assert "no decode engine since" in http.get("/readyz").json()["detail"]
    code, line = _status(cluster)
    assert code == 2, line
    assert line.startswith("unhealthy  1P0D (of 1P1D)  no decode engine since "), line
    assert "(D0 left)" in line
    diag = _cli(cluster, "diagnose", "all", "--window", "2s", "--interval", "0.5s",
                "--json")
    assert diag.returncode == 2, diag.stdout + diag.stderr
    reports = {r["workflow"]: r for r in json.loads(diag.stdout)["reports"]}
    assert reports["membership"]["severity"] == "CRITICAL"
    assert "no decode engine" in reports["membership"]["findings"][0]["title"]

    # a chat completion is answered 503 within the bounded wait, not left to hang
    t0 = time.monotonic()
    resp = http.post("/v1/chat/completions", json={
        "model": st["model"], "max_tokens": 4,
        "messages": [{"role": "user", "content": "hello"}]})
    took = time.monotonic() - t0
    assert resp.status_code == 503, resp.text
    error = resp.json()["error"]
    assert "no decode engine" in error["message"]
    assert "scheduler.no_engine_wait" in error["message"]
    assert took < NO_ENGINE_WAIT_S + 10
    # answered, so out of the scheduler's queues: it will not run later for nobody
    queue = http.get("/api/v1/status").json()["queue"]
    assert (queue["fifo"], queue["in_flight"]) == (0, 0), queue


def test_join_then_delete_before_hello_leaves_the_cluster_ready(
        cluster: dict[str, Any]) -> None:
    procs: Procs = cluster["procs"]
    http: httpx.Client = cluster["http"]
    for name, role in (("P0", "prefill"), ("D0", "decode")):
        _json_line(procs.join(role, name, cluster["port"], cluster["token_file"]), START_S)
    wait_until(lambda: _serving(cluster, "1P1D"), START_S, "1P1D serving")

    bad = http.post("/api/v1/join", json={"node": "a/b", "role": "decode", "gpus": 1})
    assert bad.status_code in (400, 422), bad.text
    plan = http.post("/api/v1/join", json={"node": "plain", "role": "decode", "gpus": 1})
    assert plan.status_code == 200, plan.text
    assert http.get("/readyz").status_code == 503  # its engine has not said hello
    assert http.delete("/api/v1/join/plain").status_code == 200
    wait_until(lambda: http.get("/readyz").status_code == 200, 30, "/readyz 200")
    code, line = _status(cluster)
    assert code == 0, line
    assert line.startswith("running  1P1D  2/2 engines healthy"), line
    st = http.get("/api/v1/status").json()
    assert st["state"] == http.get("/healthz").json()["state"] == "ready"
