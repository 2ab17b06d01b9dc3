"""The runtime hits what a global store of a request log's blocks holds (issue 36 part 1).

A turn with a block chain sends the token ids its chain names (``chain_token_ids``), so equal
ids are equal tokens; the runtime's content-addressed store (chained hashes of its own
smaller blocks) then finds exactly the log's shared blocks, within a conversation and across
conversations. The e2e test replays a generated Mooncake-format log on the embedded runtime
and compares the scheduler's own store-lookup counters with the independent count.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dualpath_cli.workload.mooncake import mooncake_stats
from dualpath_cli.workload.mooncake_gen import ConversationShape, generate_conversations
from dualpath_cli.workload.mooncake_link import hit_split, link_requests
from dualpath_cli.workload.tokens import chain_token_ids, prompt_token_ids
from dualpath_cli.workload.trajectory import Trajectory, Turn

#: A small log: 3 conversations under one system prompt and two task prompts, 2 turns each
#: (about 8K prompt tokens: a minute of the reference model on a loaded 2-core host).
SHAPE = ConversationShape(conversations=3, branching=(1, 2), shared_tokens=(520, 640),
                          turns=(2, 2), own_tokens=(16, 160), output_tokens=(2, 3))


def _chained(blocks: tuple[tuple[int, ...], ...], turns: tuple[Turn, ...]) -> Trajectory:
    return Trajectory(7, turns, token_seed=7, blocks=blocks)


def test_equal_block_ids_send_equal_tokens_in_any_conversation() -> None:
    a = _chained(((1, 2),), (Turn(20, 2),))
    b = Trajectory(8, (Turn(24, 2),), token_seed=8, blocks=((1, 3),))
    ids_a, ids_b = chain_token_ids(a, 0, 8), chain_token_ids(b, 0, 8)
    assert len(ids_a) == 20 and len(ids_b) == 24
    assert np.array_equal(ids_a[:8], ids_b[:8])  # block 1 in both
    assert not np.array_equal(ids_a[8:16], ids_b[8:16])  # 2 and 3 differ
    assert np.array_equal(chain_token_ids(a, 0, 8), ids_a)  # deterministic


def test_a_chain_shorter_than_the_prompt_is_padded_with_the_turns_own_ids() -> None:
    t = _chained(((5,), (5, 6)), (Turn(8, 2), Turn(10, 1)))
    second = chain_token_ids(t, 1, 8)
    assert len(second) == t.prompt_length(1) == 20
    assert np.array_equal(second[:8], chain_token_ids(t, 0, 8))
    assert np.array_equal(chain_token_ids(t, 0, 8),
                          chain_token_ids(_chained(((5,),), (Turn(8, 1),)), 0, 8))
    with pytest.raises(ValueError, match="no block chains"):
        chain_token_ids(Trajectory(1, (Turn(4, 1),), token_seed=1), 0, 8)
    plain = Trajectory(1, (Turn(4, 1), Turn(3, 1)), token_seed=1)
    assert len(prompt_token_ids(plain, 1)) == plain.prompt_length(1)  # unchanged path


def test_a_remote_bench_reads_the_clusters_own_lookup_counters() -> None:
    from dualpath_cli.services.remote_runner import store_counters

    text = "\n".join([
        "# TYPE dualpath_kv_hit_tokens_total counter",
        'dualpath_kv_requested_tokens_total{tier="hbm"} 999',
        'dualpath_kv_requested_tokens_total{tier="store"} 1000',
        'dualpath_kv_hit_tokens_total{tier="store"} 640',
        'dualpath_kv_hit_tokens_total{tier="hbm"} 5',
        "dualpath_kv_cross_conversation_hit_tokens_total 128"])
    assert store_counters(text) == {"prompt_tokens": 1000.0, "hit_tokens": 640.0,
                                    "cross_tokens": 128.0}
    assert store_counters("dualpath_kv_hit_tokens_total{tier=\"store\"} 1") is None


@pytest.mark.e2e
def test_the_runtime_hits_what_the_logs_global_store_held(tmp_path: object) -> None:
    from dualpath_cli.cluster.system import RuntimeSystem
    from dualpath_cli.runtime.options import RuntimeOptions
    from dualpath_cli.services.runner import run_agents

    requests = generate_conversations(SHAPE, seed=1)
    independent = mooncake_stats(requests)
    total_hits, cross = hit_split(requests)
    assert cross > 0 and total_hits > cross  # hits within and across conversations
    trace, _ = link_requests(requests)
    order = sorted(trace.trajectories, key=lambda t: t.start_s or 0.0)
    opts = RuntimeOptions(policy="dualpath", block_tokens=64, flops_rate=1e9)
    with RuntimeSystem(opts) as system:
        reg = system.scheduler.registry
        # one conversation after another, in arrival order: what an earlier request stored
        # is in the store when a later one looks (the independent count's instant store)
        for traj in order:
            run = run_agents(system, [traj], timeout=120)
            assert not run.errors
        looked = reg.value("dualpath_kv_requested_tokens_total", tier="store")
        hit = reg.value("dualpath_kv_hit_tokens_total", tier="store")
        crossed = reg.value("dualpath_kv_cross_conversation_hit_tokens_total")
    assert looked == independent.input_tokens  # every prompt as long as its request
    assert abs(hit / looked - independent.prefix_hit_ratio) <= 0.01
    assert crossed > 0 and abs(crossed - cross) / looked <= 0.01


def test_arrival_turns_name_each_requests_turn_of_the_linked_trace() -> None:
    from dualpath_cli.workload.mooncake_link import arrival_turns

    requests = generate_conversations(SHAPE, seed=3)
    trace, _ = link_requests(requests)
    order = arrival_turns(requests)
    arrived = sorted(requests, key=lambda r: r.timestamp_ms)
    assert len(order) == len(requests) == len(set(order))
    for (agent, turn), r in zip(order, arrived, strict=True):
        assert trace.trajectories[agent].blocks[turn] == r.hash_ids
    seen: dict[int, int] = {}
    for agent, turn in order:  # a conversation's turns arrive in order
        assert turn == seen.get(agent, -1) + 1
        seen[agent] = turn


#: The bench's log, smaller: conversations sharing system prompts and tool outputs at
#: different depths (about 130 requests, 1.3M prompt tokens; a few seconds emulated).
BENCH_SHAPE = ConversationShape(conversations=20)


@pytest.mark.e2e
def test_the_emulated_replay_hits_what_the_independent_count_finds(tmp_path: Path) -> None:
    """bench/trace_hits.py --runtime's method: the real scheduler's lookup counters with
    emulated engines, the requests one at a time in arrival order."""
    from dualpath_cli.services.hits_replay import runtime_store_hits

    requests = generate_conversations(BENCH_SHAPE, seed=1)
    independent = mooncake_stats(requests)
    total_hits, cross = hit_split(requests)
    assert cross > 0 and total_hits > cross
    got = runtime_store_hits(requests, tmp_path / "all")
    assert got.requests == len(requests)
    assert abs(got.looked_tokens - independent.input_tokens) <= len(requests)  # clamps only
    assert abs(got.hit_tokens - total_hits) / independent.input_tokens <= 0.01
    assert got.cross_tokens > 0 and abs(got.cross_tokens - cross) / independent.input_tokens <= 0.01
    # a prefix of the log against the independent count of that prefix
    first = sorted(requests, key=lambda r: r.timestamp_ms)[:40]
    head_hits, _ = hit_split(first)
    head = runtime_store_hits(requests, tmp_path / "head", limit=40)
    assert head.requests == 40 and head.hit_tokens < got.hit_tokens
    assert abs(head.hit_tokens - head_hits) / mooncake_stats(first).input_tokens <= 0.01
