"""Issue 14: a recording of a run whose trace shares a system prompt replays in the twin with
the cluster's cross-conversation hits.

The runtime counts a prefix hit on blocks another conversation stored
(``dualpath_kv_cross_conversation_hit_tokens_total``); its ledger logs, with each turn's
lookup, how many such blocks it hit and their key (``cross_blocks``, ``cross_key``) and the
prompt's first block (``lead``). ``trace_from_decisions`` links them into the trace's
``shared`` segments, so the twin's simulator, which hits another agent's stored shared
prefix, replays the hits. Agents arrive a while apart (online), so later ones find the
system prompt an earlier one stored: one agent first, then the rest together (a deterministic
stagger; timed arrivals on a loaded host can all come before the first prompt is stored).
The replay starts each agent when it arrived in the recording (the stories' arrivals).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from dualpath_cli.runtime.options import RuntimeOptions
from dualpath_cli.services import twin
from dualpath_cli.services.live import LiveCluster
from dualpath_cli.services.recording import (
    collect,
    read_recording,
    shared_links,
    trace_from_decisions,
    write_recording,
)
from dualpath_cli.services.recording_trace import recorded_trace
from dualpath_cli.services.runner import run_agents
from dualpath_cli.sim import twin_replay
from dualpath_cli.telemetry.stories import RequestListing
from dualpath_cli.telemetry.view import ClusterView, Decision
from dualpath_cli.workload.trajectory import Trajectory, Turn

# the twin's compute model (a stub for a measurement of this host): a prefill as quick as the
# runtime's real one. The replay starts the second wave when it arrived in the recording, a
# few ms after the first agent's last turn on a fast host (the native block reader); a model
# slower than the runtime (1 GFLOP/s: 150 ms for the first prompt) stores the system prompt
# after they all arrived and replays no cross hit at all, whatever the scheduler does.
COMPUTE = {"flops": 1e11, "prefill_overhead_s": 0.002, "decode_step_s": 0.004}
SYSTEM_PROMPT = ((42, 40),)  # 5 blocks of 8 tokens every conversation opens with


@pytest.fixture(autouse=True)
def env(clean_config: Path) -> None:
    """No caller's setup (conftest.clean_config) in any test here."""


def _agents(n: int, shared: tuple[tuple[int, int], ...]) -> list[Trajectory]:
    turns = (Turn(60, 4), Turn(24, 4), Turn(16, 4))
    return [Trajectory(i, turns, token_seed=500 + i, shared=shared) for i in range(n)]


class _AsClient:
    """The in-process live cluster seen as the recorder sees a client: the API's listing
    comes back as the client's record (the server side hands out its JSON form)."""

    def __init__(self, live: LiveCluster) -> None:
        self._live = live

    def view(self) -> ClusterView:
        return self._live.view()

    def decisions(self, since: int = -1) -> list[Decision]:
        return self._live.decisions(since)

    def metrics_text(self) -> str:
        raise AssertionError("recorded with_metrics=False")

    def requests(self, state: str = "inflight", limit: int = 100,
                 after: int | None = None) -> RequestListing:
        return RequestListing.from_dict(self._live.requests(state, limit, after))


def _record(path: Path, waves: list[list[Trajectory]]) -> dict[str, float]:
    """Serve each wave of agents after the last on an in-process 1P1D (a wave's agents
    together) while recording it as ``dualpath record`` does (samples, decisions,
    stories); the runtime's hit counters after."""
    live = LiveCluster(RuntimeOptions(policy="dualpath", block_tokens=8, flops_rate=1e9,
                                      store_dir=path.parent / "store"))
    live.start()
    try:
        errors: list[str] = []
        done = threading.Event()

        def serve() -> None:
            try:
                for wave in waves:
                    errors.extend(run_agents(live.system, wave, timeout=60).errors)
            finally:
                done.set()

        worker = threading.Thread(target=serve)
        samples = []
        decisions: list[Decision] = []
        stories: dict[int, dict[str, Any]] = {}
        for sample in collect(_AsClient(live), 120.0, 0.1, with_metrics=False,
                              decisions_out=decisions,
                              stories_out=stories):
            samples.append(sample)
            if len(samples) == 1:
                worker.start()
            elif done.is_set():
                break
        worker.join(60)
        assert not errors, errors
        write_recording(path, {"source": "test", "interval_s": 0.1,
                               "window_s": samples[-1].at - samples[0].at}, samples,
                        decisions, stories.values())
        reg = live.system.scheduler.registry
        return {"hit": reg.counter("dualpath_kv_hit_tokens_total", tier="store").value,
                "cross": reg.counter("dualpath_kv_cross_conversation_hit_tokens_total").value}
    finally:
        live.drain(30)


def test_a_recorded_shared_system_prompt_replays_with_the_clusters_cross_hits(
        tmp_path: Path) -> None:
    path = tmp_path / "shared.jsonl.gz"
    agents = _agents(8, SYSTEM_PROMPT)
    counts = _record(path, [agents[:1], agents[1:]])
    measured = counts["cross"] / counts["hit"]
    assert counts["cross"] == 7 * 40  # the second wave found the first agent's prompt

    rec = read_recording(path)
    firsts = [d for d in rec.decisions if d.turn == 0]
    hitters = [d for d in firsts if (d.inputs["lookup"].get("cross_blocks") or 0) > 0]
    assert len(hitters) == 7 and all(d.inputs["lookup"]["cross_blocks"] == 5 for d in hitters)
    assert len({d.inputs["lookup"]["lead"] for d in firsts}) == 1  # one first block
    traffic = twin.traffic_from_recording(rec, str(path))
    assert all(p.shared and p.shared[0][1] == 40 for p in traffic.plans)
    assert traffic.starts is not None and traffic.starts[0] == 0.0
    assert min(traffic.starts[1:]) > 0  # the second wave after the first agent

    world = twin.world_for(traffic, measure=lambda _m, _c, _n: dict(COMPUTE), host_cores=2)
    replay = twin_replay.predict(traffic, world, traffic.current)
    assert replay.cross_hit_share > 0
    assert replay.cross_hit_share == pytest.approx(measured, abs=0.1), (replay, counts)


def test_conversations_without_a_shared_prefix_link_nothing(tmp_path: Path) -> None:
    path = tmp_path / "own.jsonl.gz"
    counts = _record(path, [_agents(4, ())])
    assert counts["cross"] == 0
    rec = read_recording(path)
    trace = trace_from_decisions(rec.decisions)
    assert trace is not None and not any(t.shared for t in trace.trajectories)
    traffic = twin.traffic_from_recording(rec, str(path))
    world = twin.world_for(traffic, measure=lambda _m, _c, _n: dict(COMPUTE), host_cores=2)
    assert twin_replay.predict(traffic, world, traffic.current).cross_hit_share == 0.0


def _first(agent: int, length: int, lookup: dict[str, Any], cached: int = 0) -> Decision:
    return Decision(agent + 1, 1.0 + agent, agent + 1, 0, agent, 0, length, cached, 0, 1, 1,
                    "pe", 0, 0, 0, 0, inputs={"lookup": lookup})


def test_the_linking_rule() -> None:
    """Hitters open with the segment they hit (its key, its blocks); a turn that hit nothing
    but opens with the same first block gets the group's most-hit segment if its prompt
    holds it; other leads and servers that log no keys link nothing."""
    hit = {"hit_blocks": 5, "cross_blocks": 5, "cross_key": "00000000000000ff", "lead": "aa"}
    firsts = [
        _first(0, 60, {"hit_blocks": 0, "cross_blocks": 0, "lead": "aa"}),  # the storer
        _first(1, 60, hit, cached=40),
        _first(2, 60, hit, cached=40),
        _first(3, 30, {"hit_blocks": 0, "cross_blocks": 0, "lead": "aa"}),  # too short
        _first(4, 60, {"hit_blocks": 0, "cross_blocks": 0, "lead": "bb"}),  # another lead
        _first(5, 60, {"hit_blocks": 0}),                                   # no keys logged
    ]
    links = shared_links(firsts)
    seg = ((0xff >> 1, 40),)
    assert links == {0: seg, 1: seg, 2: seg}


def test_a_recording_keeps_each_turns_block_chain_and_the_twin_hits_what_the_store_hit(
        tmp_path: Path) -> None:
    """Issue 36: the decisions keep each turn's chain of block ids (as deltas from the
    conversation's previous turn), the recording's trace carries them in the runtime's block
    size, and the twin's replay hits the tokens the live store hit (within 1 point of the
    prompt tokens), within conversations and across them."""
    path = tmp_path / "chains.jsonl.gz"
    agents = _agents(8, SYSTEM_PROMPT)
    counts = _record(path, [agents[:1], agents[1:]])
    rec = read_recording(path)
    turns = [d for d in rec.decisions if d.kind == "turn"]
    looks = [d.inputs["lookup"] for d in turns]
    assert all(look["block_tokens"] == 8 and isinstance(look["chain"], list)
               for look in looks)
    assert any(look["chain_base"] > 0 for look in looks)  # later turns: deltas
    trace = recorded_trace(rec, str(path))
    assert trace.header.block_tokens == 8 and trace.header.outputs_stored
    assert all(len(t.blocks) == len(t.turns) for t in trace.trajectories)
    # every turn's chain is its whole prompt's full blocks; conversations share the first 5
    for t in trace.trajectories:
        for i, chain in enumerate(t.blocks):
            assert len(chain) == t.prompt_length(i) // 8
    assert len({t.blocks[0][:5] for t in trace.trajectories}) == 1
    assert len({t.blocks[0][5] for t in trace.trajectories}) == 8

    traffic = twin.traffic_from_recording(rec, str(path))
    assert all(p.blocks and p.block_tokens == 8 and p.outputs_stored for p in traffic.plans)
    world = twin.world_for(traffic, measure=lambda _m, _c, _n: dict(COMPUTE), host_cores=2)
    replay = twin_replay.predict(traffic, world, traffic.current)
    prompt = sum(d.length for d in turns)
    assert replay.prompt_tokens == prompt
    live_share, twin_share = counts["hit"] / prompt, replay.hit_tokens / prompt
    print(f"live hit share {live_share:.4f}, twin {twin_share:.4f}")
    assert twin_share == pytest.approx(live_share, abs=0.01), (replay, counts)
    # hits on a conversation's own generated blocks are its own, not another's
    assert replay.cross_hit_share == pytest.approx(counts["cross"] / counts["hit"], abs=0.02)
