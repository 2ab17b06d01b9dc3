"""A node that leaves on purpose (``DELETE /api/v1/join/NAME``, a SIGTERMed node agent) is
``left``, not ``dead``: its turns are re-queued as for a death, but its engines are no longer
the cluster's, so ``dualpath status`` does not count them as unhealthy engines for ever (an
operator's walk read "2/3 engines healthy", exit 2, after a node left and joined again)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from dualpath_cli.api.app import _status
from dualpath_cli.cluster.join import JoinService
from dualpath_cli.cluster.system import RuntimeSystem
from dualpath_cli.runtime.options import RuntimeOptions
from dualpath_cli.storage import MemoryStore


def test_a_node_that_leaves_is_left_and_one_that_dies_is_dead(tmp_path: Path) -> None:
    opts = RuntimeOptions(local_engines=False, store_dir=tmp_path / "store")
    system = RuntimeSystem(opts, MemoryStore())
    try:
        joins = JoinService(system)
        gone = joins.join("p0", "prefill", 2)
        crashed = joins.join("d0", "decode", 1)
        kept = joins.join("d1", "decode", 1)
        assert joins.leave("p0") == 2
        system.scheduler.mark_dead(crashed.engine_ids[0])
        states = {eid: e.state for eid, e in system.scheduler.engines.items()}
        assert [states[e] for e in gone.engine_ids] == ["left", "left"]
        assert states[crashed.engine_ids[0]] == "dead"
        assert states[kept.engine_ids[0]] == "starting"
        assert set(joins.status("p0")["engines"].values()) == {"left"}
        # a silent engine whose node then leaves is left too
        system.scheduler.mark_dead(kept.engine_ids[0], "left")
        assert system.scheduler.engines[kept.engine_ids[0]].state == "left"
    finally:
        system.close()


def test_status_counts_only_the_clusters_engines() -> None:
    view: Any = SimpleNamespace(
        state="ready", pd="1P2D", model="tiny", uptime_s=1.0, membership=None,
        engines=[SimpleNamespace(state=s) for s in ("ready", "ready", "left", "left", "dead")],
        scheduler=SimpleNamespace(
            policy="dualpath", fifo_length=0, private_queues={}, pe_queue_length=0,
            in_flight=0, decisions=SimpleNamespace(total=0),
            thresholds=SimpleNamespace(alpha_tokens=1, beta_tokens=1, z_factor=1.05,
                                       quota_s=0.3, read_side="dualpath", source={},
                                       controllers={})))
    system = SimpleNamespace(  # what the status reads of the runtime: units, scheduling
        opts=SimpleNamespace(snic_bw=0.0, nodes_per_group=1),
        scheduler=SimpleNamespace(sub_schedulers=lambda: ()),  # a flat one
        shape=SimpleNamespace(n_layers=2, bytes_per_token_layer=64, block_tokens=8),
        shaped=True, flops_rate=0.0)
    live: Any = SimpleNamespace(ready_s=1.0, audit=[], faults=lambda: [], system=system,
                                readiness=lambda: (True, "ready"))
    out = _status(live, view)
    assert out["engines"] == {"healthy": 2, "total": 3}
