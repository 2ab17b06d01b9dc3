"""Nodes that join (``launch --role prefill|decode --join``) read the cluster's replica roots.

Why the join answer carries them, rather than a ``--replica-root`` on each node: the replica
roots are, like the store, POSIX directories every node mounts at the same paths, and the
scheduler's side decides which blocks get copies there (``diagnose long-tail --fix``, ``POST
/api/v1/store/replicate``); one list, the cluster's ``storage.replica_roots``, cannot drift
between nodes. A node where a replica root is not mounted is refused in one line (copies
the cluster makes there would be invisible to it), never given an empty directory.

The scheduler side is :class:`~dualpath_cli.cluster.join.JoinService` over a stand-in
system (no engines); the node side is :class:`~dualpath_cli.services.node.NodeAgent`'s engine
specs, and the store an engine opens from them (``runtime.context.open_store``) finds a copy
the cluster made.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from dualpath_cli.cluster.join import JoinPlan, JoinService
from dualpath_cli.core.layout import BlockShape, Namespace, full_block_shape, prefix_keys
from dualpath_cli.runtime.context import open_store
from dualpath_cli.runtime.options import RuntimeOptions
from dualpath_cli.services.node import JoinError, NodeAgent
from dualpath_cli.storage import ReplicatedStore, encode_block
from dualpath_cli.storage.codecs import numpy_dtype
from dualpath_cli.telemetry import MetricsRegistry


class _Scheduler:
    """What JoinService touches of the scheduler."""

    address = "tcp://127.0.0.1:5555"
    quota_s = 0.3

    def __init__(self) -> None:
        self.engines: dict[int, Any] = {}

    def register(self, engine_id: int, role: str, node: int, group: int,
                 name: str = "") -> None:
        self.engines[engine_id] = SimpleNamespace(alive=True, role=role, node=node)


def _answer(opts: RuntimeOptions) -> JoinPlan:
    system: Any = SimpleNamespace(specs=[], scheduler=_Scheduler(), opts=opts, shaped=True,
                                  curve=None, flops_rate=1e12)
    plan = JoinService(system).join("node-a", "decode", 2)
    # over the API: JSON out, JSON in
    return JoinPlan.from_dict(json.loads(json.dumps(plan.to_dict())))


def _specs(plan: JoinPlan, root: Path) -> list[Any]:
    agent = NodeAgent("http://127.0.0.1:9", "token", "node-a", "decode", 2)
    try:
        return agent._specs(plan, root)
    finally:
        agent._http.close()


def test_the_join_answer_carries_the_replica_roots_and_the_node_reads_their_copies(
        tmp_path: Path) -> None:
    store, r1, r2 = tmp_path / "store", tmp_path / "r1", tmp_path / "r2"
    for d in (store, r1, r2):
        d.mkdir()
    plan = _answer(RuntimeOptions(store_dir=store, replica_dirs=(r1, r2)))
    assert plan.replica_roots == [str(r1), str(r2)] and plan.store == str(store)
    specs = _specs(plan, store)
    assert [s.store for s in specs] == [
        {"kind": "posix", "root": str(store), "replicas": [str(r1), str(r2)]}] * 2

    # the cluster copies a hot block to a replica root; an engine of the joined node, its
    # store opened from its spec, finds the copy (and reads rotate over both)
    ns = Namespace("m", "layer_major", BlockShape(2, 4, 8), "fp16")
    key = prefix_keys(list(range(4)), ns)[0]
    dt = numpy_dtype("fp16")
    block = np.ones(full_block_shape(ns.shape, ns.layout, dt.itemsize), dtype=dt)
    cluster_side = open_store({"kind": "posix", "root": str(store),
                               "replicas": [str(r1), str(r2)]}, MetricsRegistry())
    assert isinstance(cluster_side, ReplicatedStore)
    cluster_side.put(*encode_block(key, block, ns))
    cluster_side.replicate(key, 2)
    node_side = open_store(specs[0].store, MetricsRegistry())
    assert isinstance(node_side, ReplicatedStore)
    assert [s.root for s in node_side.stores] == [store, r1, r2]  # type: ignore[attr-defined]
    assert len(node_side.copies(key)) == 2


def test_without_replica_roots_the_node_opens_the_store_alone(tmp_path: Path) -> None:
    plan = _answer(RuntimeOptions(store_dir=tmp_path))
    assert plan.replica_roots == []
    assert _specs(plan, tmp_path)[0].store == {"kind": "posix", "root": str(tmp_path)}
    # a scheduler from before replica roots answers without the key: none
    old = plan.to_dict()
    del old["replica_roots"]
    assert JoinPlan.from_dict(old).replica_roots == []


def test_a_replica_root_not_mounted_on_the_node_is_refused_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "store").mkdir()
    plan = _answer(RuntimeOptions(store_dir=tmp_path / "store",
                                  replica_dirs=(tmp_path / "not-mounted",)))
    with pytest.raises(JoinError, match=r"replica root .*not-mounted .*storage\.replica_roots"
                       r".* mount it at the same path on every node") as err:
        _specs(plan, tmp_path / "store")
    assert "\n" not in str(err.value)
    assert not (tmp_path / "not-mounted").exists()  # refused, not created
