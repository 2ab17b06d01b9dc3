"""Global prefix hits: the store's rule, the trace format's block chains, and the simulator
counting what an independent walk of a Mooncake-format log counts (issue 36)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dualpath_cli.errors import TraceError
from dualpath_cli.sim import make_setup, plans_from_trajectories, simulate_offline
from dualpath_cli.workload.mooncake import mooncake_stats, prefix_hits
from dualpath_cli.workload.mooncake_gen import ConversationShape, generate_conversations
from dualpath_cli.workload.mooncake_link import hit_split, link_requests
from dualpath_cli.workload.prefix_store import GlobalPrefixStore
from dualpath_cli.workload.stats import trace_stats
from dualpath_cli.workload.trace_format import Trace, TraceHeader, decode_lines, encode_lines
from dualpath_cli.workload.trajectory import Trajectory, Turn, truncate


def test_the_leading_run_hits_and_the_own_previous_prompt_is_not_cross() -> None:
    store = GlobalPrefixStore(4)
    assert store.visit((1, 2, 3), 10).tokens == 0
    hit = store.visit((1, 2, 9), 11)  # another conversation: blocks 1, 2 are stored
    assert (hit.tokens, hit.cross) == (8, 8)
    hit = store.visit((1, 2, 3, 4), 15, previous=(1, 2, 3))  # its own next prompt
    assert (hit.tokens, hit.cross) == (12, 0)
    assert store.lookup((7, 1), 8).tokens == 0  # a stored id after a miss never hits
    assert store.lookup((1, 2, 3), 6).tokens == 6  # capped at the prompt


@given(st.lists(st.tuples(st.lists(st.integers(0, 6), max_size=6), st.integers(1, 40)),
                max_size=30))
def test_the_store_counts_what_the_independent_mooncake_walk_counts(
        requests: list[tuple[list[int], int]]) -> None:
    from dualpath_cli.workload.mooncake import MooncakeRequest

    log = [MooncakeRequest(float(i), max(n, 8 * len(ids) - 7), 1, tuple(ids))
           for i, (ids, n) in enumerate(requests)]
    store = GlobalPrefixStore(8)
    ours = [store.visit(r.hash_ids, r.input_length).tokens for r in log]
    assert ours == prefix_hits(log, block_tokens=8)


def test_block_chains_round_trip_and_are_checked() -> None:
    traj = Trajectory(3, (Turn(900, 20), Turn(300, 9)), token_seed=3,
                      blocks=((7, 8), (7, 9, 10)))
    trace = Trace(TraceHeader(max_len=2000, block_tokens=512), (traj,))
    again = decode_lines(encode_lines(trace), "t")
    assert again.trajectories[0].blocks == traj.blocks
    head = '{"format":"dualpath-trace","version":1,"max_len":2000,"block_tokens":256}'
    line = '{"agent_id":0,"token_seed":0,"turns":[[900,20]],"blocks":[[1,2,3,4,5]]}'
    with pytest.raises(TraceError, match="t:2: turn 1: 5 block ids for a prompt of 900 "
                                         "tokens: at most 4 blocks of 256"):
        decode_lines([head, line], "t")
    with pytest.raises(TraceError, match="one per turn"):
        decode_lines([head, '{"agent_id":0,"token_seed":0,"turns":[[9,2]],"blocks":[]}'], "t")
    with pytest.raises(TraceError, match="block_tokens"):
        decode_lines(['{"format":"dualpath-trace","version":1,"max_len":9,"block_tokens":0}'],
                     "t")


def test_a_cut_turn_keeps_the_ids_of_the_blocks_it_still_covers() -> None:
    traj = Trajectory(0, (Turn(600, 10), Turn(1000, 10)), blocks=((1, 2), (1, 2, 3, 4)))
    cut = truncate(traj, 900, block_tokens=512)
    assert cut.turns == (Turn(600, 10), Turn(289, 1)) and cut.blocks == ((1, 2), (1, 2))


@pytest.mark.parametrize("seed", [1, 2])
def test_sim_and_stats_see_the_hits_a_global_store_sees(seed: int) -> None:
    shape = ConversationShape(conversations=60, rate_per_s=4.0)
    log = generate_conversations(shape, seed)
    truth = mooncake_stats(log)
    hit, cross = hit_split(log)
    assert cross > 0 and hit > cross
    trace, _ = link_requests(log)
    stats = trace_stats(trace.trajectories)
    inputs = truth.input_tokens
    assert stats.hit_ratio * sum(t.prompt_length(i) for t in trace.trajectories
                                 for i in range(t.num_turns)) == pytest.approx(
        hit, rel=0.002)
    res = simulate_offline(make_setup("ds660b", "2P4D", "dualpath"),
                           plans_from_trajectories(trace.trajectories))
    assert abs(res.hit_tokens / inputs - truth.prefix_hit_ratio) < 0.01
    assert abs(res.shared_hit_tokens - cross) / inputs < 0.01
    assert res.shared_hit_tokens > 0


def test_generated_conversations_share_prefixes_at_different_depths() -> None:
    log = generate_conversations(ConversationShape(conversations=40, branching=(1, 2, 2)), 5)
    trace, _ = link_requests(log)
    firsts = [t.blocks[0] for t in trace.trajectories]

    def common(a: tuple[int, ...], b: tuple[int, ...]) -> int:
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        return n

    depths = {common(a, b) for i, a in enumerate(firsts) for b in firsts[i + 1:]}
    assert min(depths) >= 1  # one system prompt: everyone shares its first block
    assert len(depths) >= 2  # and some share more: a task, a first tool output
