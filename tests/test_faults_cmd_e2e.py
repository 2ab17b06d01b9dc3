"""``dualpath faults`` on a launched cluster: inject, see it in ``status`` and in
``dualpath-monitor --by-node``, list it, clear one by id and all, and the audit trail."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from conftest import run_cli

from dualpath_cli.api.client import DualPathClient
from dualpath_cli.services import statefile

if TYPE_CHECKING:
    from conftest import Launched

pytestmark = pytest.mark.e2e

THROTTLE = "snic_throttle:node=1,fraction=0.25"


def test_faults_inject_show_in_status_and_monitor_then_clear(
        env: dict[str, str], launch_cluster: Callable[..., Launched], tmp_path: Path) -> None:
    url, port, _ = launch_cluster("--store", str(tmp_path / "store"))
    env = {**env, "COLUMNS": "200"}
    at = ("--port", str(port))

    done = run_cli(env, "faults", "inject", THROTTLE, "slow_compute:engine=0,factor=2", *at)
    assert done.returncode == 0, done.stderr
    assert "fault #1 snic_throttle node D1 fraction 0.25 (since " in done.stdout

    done = run_cli(env, "status", *at)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("running"), done.stdout
    assert lines[1].startswith("fault #1 snic_throttle node D1 fraction 0.25 (since ")
    assert lines[2].startswith("fault #2 slow_compute engine 0 factor 2 (since ")
    data = json.loads(run_cli(env, "status", "--json", *at).stdout)
    assert [f["id"] for f in data["faults"]] == [1, 2]

    done = run_cli(env, "monitor", "--metric", "snic_util", "--by-node", "--once", *at)
    assert done.returncode == 0, done.stderr
    d1 = next(ln for ln in done.stdout.splitlines() if "node D1" in ln)
    assert re.search(r"node D1 !", d1) and "/s" in d1, done.stdout  # mark, NIC rate
    assert re.search(r"node D1 !!? degraded: fault #1 snic_throttle", done.stdout)

    listed = json.loads(run_cli(env, "faults", "list", "--json", *at).stdout)["faults"]
    assert [(f["id"], f["kind"]) for f in listed] == [(1, "snic_throttle"),
                                                      (2, "slow_compute")]

    done = run_cli(env, "faults", "clear", "2", "--json", *at)
    assert done.returncode == 0, done.stderr
    assert [f["id"] for f in json.loads(done.stdout)["faults"]] == [1]
    done = run_cli(env, "faults", "clear", "2", *at)
    assert done.returncode == 2 and "no fault #2 in force" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1

    done = run_cli(env, "faults", "clear", "--all", *at)
    assert done.returncode == 0 and "0 fault(s) in force" in done.stdout, done.stderr
    assert "fault #" not in run_cli(env, "status", *at).stdout

    with DualPathClient.from_token_file(url, statefile.token_path(port)) as client:
        st = client.status()
    assert st.faults == ()
    trail = [a for a in st.audit if a.action == "faults"]
    assert len(trail) == 3 and all(a.token_id.startswith("tok-") for a in trail)
    assert [len(a.new["faults"]) for a in trail] == [2, 1, 0]
