"""``dualpath drill`` on joined nodes (issue 33 item 4, story 6): a scheduler, a prefill node
P0 and decode nodes D0 and D1, each its own ``dualpath launch --join`` on loopback. The
``node_leave`` row SIGTERMs one decode node's launcher (it drains and leaves: membership
WARNING on that node while the other serves), starts it again with its own command
(cleared means it serves again), and a storage row runs on the joined node's store; both
must pass, with no turn lost.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from test_multinode import START_S, Procs, _free_port, _json_line, launch_env

pytestmark = pytest.mark.e2e


def _stop(pid: int) -> None:
    """SIGTERM the node the drill started again (not our child), SIGKILL after 30 s."""
    with contextlib.suppress(psutil.NoSuchProcess):
        proc = psutil.Process(pid)
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except psutil.TimeoutExpired:
            proc.kill()


def test_drill_node_leave_and_a_storage_row_pass_on_joined_nodes(tmp_path: Path) -> None:
    env = launch_env(tmp_path)
    procs = Procs(env)
    port = _free_port()
    restarted: list[int] = []
    try:
        sched = procs.start("--role", "scheduler", "--port", str(port), "--store",
                            str(tmp_path / "store"), "--json")
        _json_line(sched, START_S)
        nodes = [procs.join(role, name, port) for role, name in
                 (("prefill", "P0"), ("decode", "D0"), ("decode", "D1"))]
        for p in nodes:
            _json_line(p, START_S)
        done = subprocess.run([sys.executable, "-m", "dualpath_cli.cli.app", "drill", "--port",
                               str(port), "--only", "node_leave", "--only", "snic_throttle",
                               "--json"], env=env, capture_output=True, text=True, timeout=600)
        doc = json.loads(done.stdout)
        for row in doc["rows"]:
            restarted += [int(p) for n in row["notes"] for p in re.findall(r"pid (\d+)", n)]
        rows = {r["fault"]: r for r in doc["rows"]}
        leave = rows["node_leave"]
        name = leave["target"].removeprefix("node ").removesuffix(" leaves")
        assert name in ("D0", "D1"), leave  # the newest decode node (join order varies)
        assert (leave["workflow"], leave["subject"], leave["grade"]) == (
            "membership", f"node {name}", "WARNING"), leave
        assert restarted, leave  # cleared = D1 started again and serves
        assert rows["snic_throttle"]["target"].startswith("snic_throttle:node="), rows
        assert all(r["turns_lost"] == 0 and r["tokens_identical"] for r in rows.values()), rows
        assert [r["fault"] for r in doc["rows"] if not r["passed"]] == [], doc["rows"]
        assert done.returncode == 0, done.stderr
    finally:
        for pid in restarted:
            _stop(pid)
        procs.close()
