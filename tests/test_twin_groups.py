"""The twin replays a cluster whose engine groups span nodes (``cluster.nodes_per_group``)
with groups of that many nodes (services/twin.py ``nodes_per_group_of``).

The view carries it: each engine names its group by the group's first node (core/groups.py;
cluster/system.py), so a recording of such a cluster replays with its groups, and an older
recording (one node per group) with one node per group. With two nodes per group the
fetching group's engines read through different nodes' queues, so alpha can change a
decision (with one it cannot: tests/test_twin.py pins that).

Compute is stubbed as in tests/test_twin.py; the views, the recording, the live cluster and
the simulator are real.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from test_twin import cluster_view, env, record, served, stub_measure  # noqa: F401 - env

from dualpath_cli.cli.app import main
from dualpath_cli.runtime.options import RuntimeOptions
from dualpath_cli.runtime.workloads import agentic_workload
from dualpath_cli.services import twin
from dualpath_cli.services.live import LiveCluster
from dualpath_cli.services.recording import read_recording
from dualpath_cli.sim import twin_replay
from dualpath_cli.telemetry.recording import decode_view, encode_view
from dualpath_cli.telemetry.view import ClusterView


def grouped(view: ClusterView, nodes_per_group: int, prefill_nodes: int = 2) -> ClusterView:
    """``view`` (2P4D, one engine per node) with its engines' groups as a cluster with
    ``nodes_per_group`` names them: runs of that many nodes of a role, by their first."""
    def group(role: str, node: int) -> int:
        first = 0 if role == "prefill" else prefill_nodes
        return first + (node - first) // nodes_per_group * nodes_per_group

    return dataclasses.replace(view, engines=tuple(
        dataclasses.replace(e, group=group(e.role, e.node)) for e in view.engines))


def test_a_live_cluster_view_carries_its_groups_through_a_recording(tmp_path: Path) -> None:
    live = LiveCluster(RuntimeOptions(prefill_nodes=2, decode_nodes=3, nodes_per_group=2,
                                      block_tokens=8, store_dir=tmp_path / "store"))
    live.start()
    try:
        view = live.view()
    finally:
        live.drain(30)
    assert twin.nodes_per_group_of(view) == 2
    assert twin.nodes_per_group_of(decode_view(json.loads(json.dumps(encode_view(view))))) == 2
    assert twin.nodes_per_group_of(dataclasses.replace(view, engines=())) == 1


def test_a_recording_with_two_nodes_per_group_replays_with_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    decisions = served(agentic_workload(16, turns=12))
    path = record(tmp_path / "two.jsonl.gz", grouped(cluster_view(pd="2P4D"), 2), decisions)
    tr = twin.traffic_from_recording(read_recording(path), "two")
    assert tr.nodes_per_group == 2 and tr.to_dict()["nodes_per_group"] == 2
    world = twin.world_for(tr, measure=stub_measure, host_cores=2)
    sim = twin_replay._simulation(tr, world, tr.current)
    assert [[n.idx for n, _ in g.nodes] for g in sim.pe_groups] == [[0, 1]]
    assert [[n.idx for n, _ in g.nodes] for g in sim.de_groups] == [[2, 3], [4, 5]]

    # alpha classes the fetching group's engines by their own node's read queue: it can
    # now change what the replay does
    def outcome(p: twin_replay.Prediction) -> tuple[float, float, float]:
        return (round(p.jct_s, 9), round(p.mean_trajectory_s, 9), round(p.snic_max_avg, 9))

    zero = dataclasses.replace(tr.current, alpha=0)
    assert outcome(twin_replay.predict(tr, world, zero)) != outcome(twin_replay.predict(tr, world,
                                                                          tr.current))

    # the same cluster recorded one node per group (as every older recording is)
    older = twin.traffic_from_recording(read_recording(record(
        tmp_path / "one.jsonl.gz", cluster_view(pd="2P4D"), decisions)), "one")
    assert older.nodes_per_group == 1
    sim = twin_replay._simulation(older, world, older.current)
    assert [len(g.nodes) for g in (*sim.pe_groups, *sim.de_groups)] == [1] * 6
    assert outcome(twin_replay.predict(older, world, zero)) == outcome(twin_replay.predict(
        older, world, older.current))

    assert main(["tune", "suggest", "--from", str(path), "--budget", "20s"]) == 0
    assert "(engine groups of 2 nodes)" in capsys.readouterr().err
    assert main(["tune", "suggest", "--from", str(path), "--json", "--budget", "20s"]) == 0
    assert json.loads(capsys.readouterr().out)["traffic"]["nodes_per_group"] == 2
