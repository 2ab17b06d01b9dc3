"""Shared reads in the simulator: requests that hit the same blocks while an earlier read of
them is queued or in flight on their engine join it, as the runtime's loader does
(``storage.loader``: one pending read per block key, every waiter served by it), instead of
each crossing the storage NIC again."""

from __future__ import annotations

from dualpath_cli.sim.api import make_setup, simulation
from dualpath_cli.sim.trace import AgentPlan
from dualpath_cli.workload.trajectory import Turn

BT = 512  # tokens per chain id
SHARED = tuple(range(1, 9))  # a 4K-token prefix every agent's prompt opens with


def _plans(followers: int, gap_s: float) -> list[AgentPlan]:
    """Agent 0 stores the shared prefix; then ``followers`` agents that open with it arrive
    ``gap_s`` apart (0: all at once), each with its own next block."""
    first = AgentPlan((Turn(len(SHARED) * BT, 2),), start_s=0.001, blocks=(SHARED,),
                      block_tokens=BT)
    rest = [AgentPlan((Turn((len(SHARED) + 1) * BT, 2),), start_s=30.0 + k * gap_s,
                      blocks=((*SHARED, 1000 + k),), block_tokens=BT)
            for k in range(followers)]
    return [first, *rest]


def _run(plans: list[AgentPlan]) -> tuple[float, int, float, int]:
    """(bytes read through the storage NICs, tokens the read plans asked for, tokens
    joined, engines)."""
    sim = simulation(make_setup("ds27b", "1P1D", "dualpath"), plans)
    res = sim.run_offline()
    assert res.turns == len(plans)  # a job that joined every block finishes too
    assert res.hit_tokens == (len(plans) - 1) * len(SHARED) * BT  # every follower hits it
    read = sum(n.read_bytes for n in sim.nodes)
    planned = res.read_tokens_pe_side + res.read_tokens_de_side
    return read, planned, res.extra.get("joined_read_tokens", 0.0), len(sim.engines)


def test_hits_apart_in_time_each_cross_the_nic() -> None:
    read, planned, joined, _ = _run(_plans(followers=6, gap_s=20.0))
    assert joined == 0 and planned == 6 * len(SHARED) * BT and read > 0


def test_concurrent_hits_on_the_same_blocks_share_their_reads() -> None:
    alone, planned_alone, _, _ = _run(_plans(followers=1, gap_s=0.0))
    per_token = alone / planned_alone  # KV bytes per token read
    followers = 64
    read, planned, joined, engines = _run(_plans(followers=followers, gap_s=0.0))
    assert engines < followers  # so some follower reads on an engine that already reads
    assert planned == followers * len(SHARED) * BT
    assert 0 < joined < planned
    # what crossed the NICs is what the plans asked for less what was joined
    assert abs(read - (planned - joined) * per_token) <= 1e-6 * read
