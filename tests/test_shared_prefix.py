"""Prefix hits as a global KV store sees them (issue 14 item 6): a system prompt shared by
conversations is a hit from the second one on, in the trace format, the Mooncake linking,
`trace stats`, the simulator and the runtime; a trace with no shared prefix shows none."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dualpath_cli.errors import TraceError
from dualpath_cli.sim.api import make_setup, simulate_online
from dualpath_cli.sim.trace import plans_from_trajectories
from dualpath_cli.workload.augment import augment
from dualpath_cli.workload.mooncake import MooncakeRequest
from dualpath_cli.workload.mooncake_link import hit_split, link_requests
from dualpath_cli.workload.stats import trace_stats
from dualpath_cli.workload.tokens import append_token_ids, prompt_token_ids
from dualpath_cli.workload.trace_format import Trace, TraceHeader, decode_lines, encode_lines
from dualpath_cli.workload.trajectory import Trajectory, Turn, truncate

SYSTEM = ((42, 40),)  # a 40-token system prompt


def _traj(agent: int, shared: tuple[tuple[int, int], ...] = SYSTEM,
          turns: tuple[Turn, ...] = (Turn(60, 4), Turn(10, 4))) -> Trajectory:
    return Trajectory(agent, turns, token_seed=1000 + agent, shared=shared)


def test_shared_segments_give_equal_ids_then_each_agent_its_own() -> None:
    a, b = _traj(0), _traj(1)
    ida, idb = append_token_ids(a, 0, 256), append_token_ids(b, 0, 256)
    assert len(ida) == 60 and np.array_equal(ida[:40], idb[:40])
    assert not np.array_equal(ida[40:], idb[40:])
    # without a shared prefix the ids are what they always were
    plain = Trajectory(0, a.turns, token_seed=1000)
    assert not np.array_equal(append_token_ids(plain, 0, 256)[:40], ida[:40])
    assert len(prompt_token_ids(a, 1, 256)) == a.prompt_length(1)


def test_the_trace_format_carries_shared_prefixes_and_refuses_bad_ones() -> None:
    trace = Trace(TraceHeader(1000), (_traj(0), _traj(1, ())))
    lines = list(encode_lines(trace))
    assert '"shared":[[42,40]]' in lines[1] and "shared" not in lines[2]
    assert decode_lines(lines, "t").trajectories == trace.trajectories
    head = lines[0]
    for bad, why in [
        ({"shared": [[42, 61]]}, "longer than the first turn's append"),
        ({"shared": [[42]]}, "expected [seed, tokens]"),
        ({"shared": [[42, 0]]}, "'shared tokens'"),
        ({"shared": [], }, "non-empty list"),
    ]:
        record = {"agent_id": 0, "token_seed": 1, "turns": [[60, 4]], **bad}
        with pytest.raises(TraceError, match="t:2: .*" + why.replace("[", r"\[").replace(
                "]", r"\]")):
            decode_lines([head, json.dumps(record)], "t")


def test_truncate_keeps_whole_segments_and_augmenting_keeps_the_prompt_in_front() -> None:
    t = Trajectory(0, (Turn(60, 4),), shared=((1, 20), (2, 20)))
    assert truncate(t, 30).shared == ((1, 20),)
    agents = augment([_traj(0), _traj(1)], 4, 3, max_len=1000)
    assert all(a.shared == SYSTEM and a.turns[0].append > 40 for a in agents)
    first = [append_token_ids(a, 0, 256) for a in agents]
    assert all(np.array_equal(f[:40], first[0][:40]) for f in first)  # the system prompt
    assert not np.array_equal(first[0][40:48], first[1][40:48])  # then each its own
    assert decode_lines(list(encode_lines(Trace(TraceHeader(1000), tuple(agents)))),
                        "t").trajectories == tuple(agents)


def test_trace_stats_count_hits_across_conversations() -> None:
    stats = trace_stats([_traj(0), _traj(1), _traj(2)])
    assert stats.shared_hit_tokens == 80  # the second and third find the first's prompt
    own = sum(sum(t.context_lengths()) for t in (_traj(0),)) * 3
    assert stats.cross_conversation_hit_share == pytest.approx(80 / (own + 80))
    none = trace_stats([_traj(0, ()), _traj(1, ())])
    assert none.shared_hit_tokens == 0 and none.cross_conversation_hit_share == 0.0


def _req(t: float, length: int, ids: list[int], out: int = 20) -> MooncakeRequest:
    return MooncakeRequest(t, length, out, tuple(ids))


def test_mooncake_logs_keep_their_block_chains_and_arrivals() -> None:
    log = [_req(0, 1600, [1, 2, 3]), _req(10, 1400, [1, 2, 7]),  # two conversations
           _req(20, 2100, [1, 2, 3, 9, 10])]  # the first one's next turn
    trace, counts = link_requests(log)
    a, b = trace.trajectories
    assert a.blocks == ((1, 2, 3), (1, 2, 3, 9, 10)) and b.blocks == ((1, 2, 7),)
    assert (a.start_s, b.start_s) == (0.0, 0.01)
    assert a.num_turns == 2 and counts.shared_prefix_trajectories == 2
    hit, cross = hit_split(log)
    assert cross == 1024 and hit == 1024 + 1536  # b's prompt; a's next turn is its own
    stats = trace_stats(trace.trajectories)  # the same store, walked by the trajectories
    assert stats.shared_hit_tokens == 1024
    assert stats.hit_ratio * sum(t.prompt_length(i) for t in trace.trajectories
                                 for i in range(t.num_turns)) == pytest.approx(hit)
    alone = [_req(0, 1500, [1, 2, 3]), _req(10, 1400, [4, 5, 6])]
    trace, counts = link_requests(alone)
    assert trace_stats(trace.trajectories).shared_hit_tokens == 0
    assert hit_split(alone) == (0, 0)


def test_the_simulator_hits_a_shared_system_prompt_across_agents() -> None:
    setup = make_setup("ds27b", "1P1D", "dualpath")
    turns = (Turn(5000, 50), Turn(300, 50))
    shared = [Trajectory(i, turns, token_seed=i, shared=((42, 4096),)) for i in range(40)]
    alone = [Trajectory(i, turns, token_seed=i) for i in range(40)]
    res = simulate_online(setup, 0.5, horizon=60, plans=plans_from_trajectories(shared),
                          early_stop=False)
    # agents arriving after the first one's prefill find its 4,096-token prompt
    assert res.shared_hit_tokens >= 4096 and res.shared_hit_tokens % 4096 == 0
    assert 0 < res.cross_conversation_hit_share < 1
    assert res.to_dict()["shared_hit_tokens"] == res.shared_hit_tokens
    cold = simulate_online(setup, 0.5, horizon=60, plans=plans_from_trajectories(alone),
                           early_stop=False)
    assert cold.shared_hit_tokens == 0 and cold.cross_conversation_hit_share == 0.0


def test_the_runtime_finds_another_conversations_system_prompt(tmp_path: Path) -> None:
    from dualpath_cli.cluster.system import RuntimeSystem
    from dualpath_cli.runtime.options import RuntimeOptions
    from dualpath_cli.services.runner import run_agents

    opts = RuntimeOptions(policy="dualpath", block_tokens=8, flops_rate=1e9)
    with RuntimeSystem(opts) as system:
        reg = system.scheduler.registry
        hits = reg.counter("dualpath_kv_hit_tokens_total", tier="store")
        cross = reg.counter("dualpath_kv_cross_conversation_hit_tokens_total")
        first = run_agents(system, [_traj(0)], timeout=60)
        assert not first.errors and first.turns[0].cached == 0  # nothing stored yet
        assert cross.value == 0  # its second turn hit its own context only
        before = hits.value
        second = run_agents(system, [_traj(1)], timeout=60)
        rec = next(t for t in second.turns if t.turn == 0)
        assert rec.cached == 40  # the 5 blocks of the other conversation's system prompt
        assert hits.value - before >= 40 and cross.value == 40
        third = run_agents(system, [_traj(2, ())], timeout=60)  # no shared prefix: no hit
        assert next(t for t in third.turns if t.turn == 0).cached == 0
        assert cross.value == 40
