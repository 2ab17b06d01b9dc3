"""Engine groups that span nodes (paper 6.1, ``cluster.nodes_per_group``).

With one node per group every engine of a fetch shares one read queue, so alpha cannot
matter; with groups over several nodes each engine is classed by its own node's queue
(paper 6.2: C2 ``read_q <= alpha``, C3 above it), so a loaded node's engines lose new turns
to the other node's. Checked in the simulator (deterministic) and on the embedded runtime
(the decision log's inputs: each engine's node queue and the PE chosen).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from test_reliability_engines import assert_leader_hand_over

from dualpath_cli.cluster.system import RuntimeSystem
from dualpath_cli.config import load_config
from dualpath_cli.core.groups import group_start, node_groups
from dualpath_cli.core.pe_fetch import pick_pe
from dualpath_cli.core.types import EngineSnapshot, Role
from dualpath_cli.errors import ConfigError, UsageError
from dualpath_cli.faultspec import parse_fault
from dualpath_cli.runtime.options import RuntimeOptions, options_from_config
from dualpath_cli.runtime.workloads import agentic_workload
from dualpath_cli.services.runner import run_agents
from dualpath_cli.sim import Simulation, make_setup, synthetic_plans
from dualpath_cli.sim.api import knobs_from_config
from dualpath_cli.sim.links import SharedLink
from dualpath_cli.sim.trace import AgentPlan
from dualpath_cli.storage import MemoryStore
from dualpath_cli.workload.trajectory import Turn

PLANS = synthetic_plans(32_000, 32, 1)


def test_groups_are_consecutive_nodes_of_a_role_the_last_smaller() -> None:
    assert [list(g) for g in node_groups(5, 2)] == [[0, 1], [2, 3], [4]]
    assert [list(g) for g in node_groups(4, 1)] == [[0], [1], [2], [3]]
    assert [group_start(p, 3) for p in range(7)] == [0, 0, 0, 3, 3, 3, 6]
    for bad in (0, -1, 1.5, True):
        with pytest.raises(UsageError, match="nodes per group"):
            node_groups(4, bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="cluster.nodes_per_group"):
        load_config(overrides=["cluster.nodes_per_group=0"], environment=False)
    knobs = knobs_from_config(load_config(overrides=["cluster.nodes_per_group=2"],
                                          environment=False).config)
    assert knobs.nodes_per_group == 2


def test_a_tok_tie_goes_to_the_shorter_node_queue_then_the_lower_id() -> None:
    def snap(eid: int, node: int, tok: int, read_q: int) -> EngineSnapshot:
        return EngineSnapshot(eid, node, 0, Role.PREFILL, tok=tok, read_q=read_q)

    group = [snap(0, 0, 0, 64), snap(1, 0, 0, 64), snap(2, 1, 0, 8), snap(3, 1, 0, 8)]
    assert pick_pe(group, 10**9, 10**9) is group[2]  # all C2, tok ties: node 1's queue
    assert pick_pe(group, 10, 10**9) is group[2]     # node 0's engines are C3
    # equal queues and tok: the lower id
    assert pick_pe([group[1], group[0]], 10**9, 10**9) is group[0]
    group[2].tok = group[3].tok = 5  # a strictly lower tok wins whatever the queue
    assert pick_pe(group, 10**9, 10**9) is group[0]
    assert pick_pe(group, 10, 10**9) is group[2]  # unless alpha classes its node C3


# --- the simulator ---------------------------------------------------------------------------
def _fixed_plans() -> list[AgentPlan]:
    """32 agents of 20-44 turns whose lengths are plain integer arithmetic: pinned results
    must not move with numpy's random streams (the Table 2 generator's draws changed with a
    numpy release, and with them every count computed from them)."""
    plans = []
    for i in range(32):
        turns = [Turn(1500 + (i * 977) % 4000, 100 + (i * 13) % 300)]
        turns += [Turn(200 + (i * 31 + k * 97) % 700, 100 + (i * 13 + k * 29) % 300)
                  for k in range(1, 20 + (i * 7) % 25)]
        plans.append(AgentPlan(tuple(turns)))
    return plans


# (pd, policy) -> (jct, read tokens PE side, DE side, events) of ds27b on _fixed_plans,
# computed by the simulator before cluster.nodes_per_group existed (at fb319cd, one node per
# group the only shape): the key's default must leave every run bit for bit as it was
BEFORE = {
    ("2P2D", "dualpath"): (88.48888887319396, 15081392, 895028, 7807),
    ("4P4D", "layerwise"): (85.9107415664942, 15976420, 0, 8548),
    ("3P5D", "dualpath"): (86.24101947020887, 15526404, 450016, 7845),
}


@pytest.mark.parametrize(("pd", "policy"), list(BEFORE))
def test_one_node_per_group_is_the_simulator_as_before(pd: str, policy: str) -> None:
    for setup in (make_setup("ds27b", pd, policy),
                  make_setup("ds27b", pd, policy, nodes_per_group=1)):
        r = Simulation(setup, _fixed_plans()).run_offline()
        assert (r.jct, r.read_tokens_pe_side, r.read_tokens_de_side, r.events) == BEFORE[
            pd, policy]


def test_simulated_groups_hold_several_nodes_and_run_the_same_turns() -> None:
    one = Simulation(make_setup("ds27b", "3P5D", "dualpath"), PLANS)
    two = Simulation(make_setup("ds27b", "3P5D", "dualpath", nodes_per_group=2), PLANS)
    assert [[n.idx for n, _ in g.nodes] for g in two.pe_groups] == [[0, 1], [2]]
    assert [[n.idx for n, _ in g.nodes] for g in two.de_groups] == [[3, 4], [5, 6], [7]]
    assert [g.idx for g in (*two.pe_groups, *two.de_groups)] == [0, 1, 2, 3, 4]
    for g in (*two.pe_groups, *two.de_groups):  # each engine in its node's group, once
        assert [e.snap for e in g.engines] == g.snaps == [s for _, ss in g.nodes for s in ss]
        assert {e.snap.group for e in g.engines} == {g.idx}
        assert all(e.node in [n for n, _ in g.nodes] for e in g.engines)
    r1, r2 = one.run_offline(), two.run_offline()
    assert r2.turns == r1.turns == sum(p.num_turns for p in PLANS)
    assert r2.hit_tokens == r1.hit_tokens
    # the second node of a group serves too: idle engines (tok 0) tie, and the tie goes to
    # the shorter node read queue before the lower engine id (core pick_pe)
    batches = [sum(p.batches for p in two.pes if p.node is n) for n in two.nodes[:3]]
    assert min(batches) > 0.1 * max(batches), batches
    assert all(sum(d.busy_time for d in two.des if d.node is n) > 0 for n in two.nodes[3:])


BUSY = synthetic_plans(32_000, 64, 1)


def _node_reads(policy: str, nodes_per_group: int, alpha: int) -> list[int]:
    """Tokens each node's storage NIC read, node 0's NIC at a fifth of its rate."""
    sim = Simulation(make_setup("ds27b", "2P2D", policy, alpha=alpha,
                                nodes_per_group=nodes_per_group), BUSY)
    sim.nodes[0].snic = SharedLink(sim.nodes[0].snic.bandwidth * 0.2)  # loaded node 0
    sim.run_offline()
    return [round(n.read_bytes / sim.cost.kv_bytes_per_token) for n in sim.nodes]


@pytest.mark.parametrize("policy", ["layerwise", "dualpath"])
def test_a_low_alpha_spares_the_loaded_node_only_when_groups_span_nodes(policy: str) -> None:
    # one node per group: every engine of a fetch shares one queue, alpha changes nothing
    assert _node_reads(policy, 1, 0) == _node_reads(policy, 1, 10**9)
    # two PE nodes in one group: with a low alpha node 0's engines are C3 while its queue
    # is long, and node 1's (C2) take the turns; with alpha = 10^9 all are C2 (min tok).
    # The effect is small (0.1-0.3% of node 0's reads here): min tok already steers turns
    # away from the slow node, whose engines hold their turns longer (docs/architecture.md)
    low, high = _node_reads(policy, 2, 0), _node_reads(policy, 2, 10**9)
    assert sum(low) == sum(high)  # the same cached tokens are read, elsewhere
    assert low[0] < high[0] and low[1] > high[1], (low, high)
    if policy == "layerwise":  # PE-side reads: one group over both PE nodes reads less
        assert high[0] < _node_reads(policy, 1, 10**9)[0]  # from the slow one than two


# --- the embedded runtime --------------------------------------------------------------------
def _opts(*sets: str, **over: Any) -> Any:
    return options_from_config(load_config(overrides=list(sets), environment=False),
                               flops_rate=1e9, block_tokens=8, **over)


def _decisions(opts: Any, agents: Any, faults: tuple[str, ...] = ()) -> tuple[Any, list[Any],
                                                                              dict[int, int]]:
    with RuntimeSystem(opts, MemoryStore()) as system:
        if faults:
            system.set_faults([parse_fault(f) for f in faults])
        node = {s.engine_id: s.node for s in system.specs}
        result = run_agents(system, agents, timeout=120)
        decisions = [d for d in system.decisions() if d.kind == "turn"]
    assert not result.errors
    return result, decisions, node


def test_runtime_groups_over_two_nodes_serve_identical_tokens() -> None:
    agents = agentic_workload(4, turns=3, first_append=48, append=16, gen=4, seed=3)
    sets = ("cluster.pd=2P2D", "cluster.gpus_per_node=2")
    one = _opts(*sets)
    two = _opts(*sets, "cluster.nodes_per_group=2")
    assert two.nodes_per_group == 2
    with RuntimeSystem(two, MemoryStore()) as system:
        specs = [(s.engine_id, s.role, s.node, s.group, s.leader) for s in system.specs]
    # one PE group over nodes 0-1 and one DE group over nodes 2-3, each led by the first
    # engine of its first node
    assert specs == [(0, "prefill", 0, 0, True), (1, "prefill", 0, 0, False),
                     (2, "prefill", 1, 0, False), (3, "prefill", 1, 0, False),
                     (4, "decode", 2, 2, True), (5, "decode", 2, 2, False),
                     (6, "decode", 3, 2, False), (7, "decode", 3, 2, False)]
    r1, _, _ = _decisions(one, agents)
    r2, d2, node = _decisions(two, agents)
    assert r2.tokens_by_turn() == r1.tokens_by_turn()
    assert len(r2.turns) == 12
    assert {d.de_group for d in d2} == {2}
    # the group's one fetch saw both nodes' engines, each with its own node's queue
    for d in d2:
        assert [e["node"] for e in d.inputs["pe_engines"]] == [0, 0, 1, 1]


def test_joined_launches_keep_one_node_per_group() -> None:
    with pytest.raises(ConfigError, match="cluster.nodes_per_group 2: nodes that join"):
        _opts("cluster.nodes_per_group=2", local_engines=False)
    assert _opts("cluster.nodes_per_group=1", local_engines=False).nodes_per_group == 1


def _loaded_node_choices(decisions: list[Any], alpha: int) -> tuple[int, int]:
    """Of the turns fetched while node 0's queue was over ``alpha`` and an engine of node 1
    was C2 (read queue <= alpha, tok <= beta): how many went to node 0, and how many there
    were."""
    to_loaded = total = 0
    for d in decisions:
        engines = d.inputs["pe_engines"]
        beta = d.inputs["beta"]
        q = {e["node"]: e["read_q"] for e in engines}
        c2_on_1 = any(e["node"] == 1 and e["read_q"] <= alpha and e["tok"] <= beta
                      for e in engines)
        if q[0] > alpha and c2_on_1:
            total += 1
            to_loaded += next(e["node"] for e in engines if e["id"] == d.pe) == 0
    return to_loaded, total


def test_runtime_pe_fetch_classes_each_engine_by_its_own_nodes_queue() -> None:
    # PE-side reads (layerwise); every read of node 0 takes 1 s more: its queue stays long
    agents = agentic_workload(12, turns=3, first_append=32, append=16, gen=4, seed=1)
    sets = ("cluster.pd=2P1D", "cluster.gpus_per_node=4", "cluster.nodes_per_group=2")
    low_alpha = 40
    fault = ("read_latency:node=0,latency=1s",)
    _, low, node = _decisions(_opts(*sets, alpha=low_alpha, policy="layerwise"), agents, fault)
    _, high, _ = _decisions(_opts(*sets, alpha=10**9, policy="layerwise"), agents, fault)
    # each decision's inputs hold both nodes' engines, each with its own node's queue
    assert any(len({e["read_q"] for e in d.inputs["pe_engines"]}) > 1 for d in low)
    # a low alpha never gave node 0 a turn while node 0's queue was over alpha and node 1
    # had a C2 engine (the situation arose: node 0's engines were C3 then)
    to_loaded, total = _loaded_node_choices(low, low_alpha)
    assert total > 0 and to_loaded == 0, (to_loaded, total)
    # alpha = 10^9: every engine under beta is C2, so the turn went to the least tok, ties
    # to the shorter node queue, then the lower id, whatever node 0's queue was
    assert _loaded_node_choices(high, low_alpha)[1] > 0
    for d in high:
        assert d.pe_class == "C2"
        ok = [e for e in d.inputs["pe_engines"] if e["tok"] <= d.inputs["beta"]]
        best = min(ok, key=lambda e: (e["tok"], e["read_q"], e["id"]))
        assert d.pe == best["id"], (d.pe, ok)
    reads: dict[str, Counter[int]] = {"low": Counter(), "high": Counter()}
    for name, ds in (("low", low), ("high", high)):
        for d in ds:
            reads[name][node[d.pe]] += d.pe_tokens
    print("read tokens by node:", {k: dict(v) for k, v in reads.items()})


@pytest.mark.e2e
def test_a_dead_leader_hands_its_multi_node_group_to_an_engine_of_the_next_node(
        tmp_path: Path) -> None:
    """PE group over nodes 0 and 1, one engine each: the leader (node 0) is killed mid-run;
    the scheduler promotes node 1's engine, which fetches for the group and serves the rest
    of the run with the reference tokens."""
    def groups(system: RuntimeSystem) -> None:
        assert [(s.node, s.group, s.leader) for s in system.specs] == [
            (0, 0, True), (1, 0, False), (2, 2, True)]

    assert_leader_hand_over(RuntimeOptions(
        policy="dualpath", block_tokens=8, processes=True, prefill_nodes=2, decode_nodes=1,
        nodes_per_group=2, store_dir=tmp_path / "store", heartbeat_timeout=3600.0), groups)
