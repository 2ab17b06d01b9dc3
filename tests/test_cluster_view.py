"""The read model of a running embedded system: ClusterView, the decision ring, control."""

from __future__ import annotations

import json
import math
import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import wait_until
from test_runtime import AGENTS, _reference

from dualpath_cli.cluster.system import RuntimeSystem
from dualpath_cli.core.layout import prefix_keys
from dualpath_cli.errors import UsageError
from dualpath_cli.runtime.control import SchedulerChange
from dualpath_cli.runtime.options import RuntimeOptions
from dualpath_cli.runtime.turns import TurnRequest
from dualpath_cli.services.runner import TurnRecord, run_agents
from dualpath_cli.storage import HEADER_SIZE, MemoryStore
from dualpath_cli.telemetry.view import ClusterView, view_from_dict
from dualpath_cli.workload.tokens import append_token_ids

TURNS = sum(t.num_turns for t in AGENTS)


def _no_nan(value: Any, where: str = "view") -> None:
    if isinstance(value, float):
        assert math.isfinite(value), where
    elif isinstance(value, dict):
        for k, v in value.items():
            _no_nan(v, f"{where}.{k}")
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            _no_nan(v, f"{where}[{i}]")


def _fresh_view(system: RuntimeSystem) -> ClusterView:
    system.scheduler.fresh_reports(time.monotonic())  # every engine's heartbeat after now
    return system.view()


def test_view_before_any_hello_says_not_available() -> None:
    system = RuntimeSystem(RuntimeOptions(block_tokens=8, flops_rate=1e9))
    try:
        view = system.view()
    finally:
        system.close()
    assert view.state == "starting" and view.pd == "1P2D" and len(view.engines) == 3
    for e in view.engines:
        assert e.state == "starting" and e.pid is None and e.heartbeat_age_s is None
        assert e.hbm_free_bytes is None and e.read_queue_tokens is None and e.layers == ()
    assert all(n.read_queue_tokens is None and n.snic_utilization is None for n in view.nodes)
    assert view.scheduler.decisions.total == 0 and view.scheduler.last_decision_seq is None


def test_view_of_a_running_system() -> None:
    opts = RuntimeOptions(policy="round-robin", block_tokens=8, decision_ring=5)
    with RuntimeSystem(opts, MemoryStore()) as system:
        result = run_agents(system, AGENTS, timeout=60)
        view = _fresh_view(system)
        ring = system.decisions()
        tail = system.decisions(ring[-3].seq)
        snap = system.scheduler.registry.snapshot()
    assert not result.errors and len(result.turns) == TURNS
    assert view.state == "ready" and view.uptime_s > 0 and view.model == "tiny"
    n_layers = system.shape.n_layers
    block_bytes = system.shape.full_nbytes
    for e in view.engines:
        assert e.state == "ready" and e.pid is None  # in-process engines
        assert e.heartbeat_age_s is not None and 0 <= e.heartbeat_age_s < 1.0
        assert e.seq == 0 and e.tokens == 0  # every turn finished
        assert e.read_queue_tokens == 0 and e.read_queue_bytes == 0
        assert e.hbm_used_bytes == 0 and e.hbm_free_bytes == opts.hbm_blocks * block_bytes
        assert e.hbm_largest_free_blocks == opts.hbm_blocks and e.hbm_fragmentation == 0.0
        # windowed (about a second): None until a window has passed, 0 once idle again
        assert e.gpu_utilization is None or 0 <= e.gpu_utilization <= 1
    pe = view.engine(system.engine_ids("prefill")[0])
    # both sides read: the PE itself, and the DEs between them (round robin alternates the
    # side per decision, so which DE drew the DE-side turns depends on placement timing)
    assert pe.nic_bytes["snic_read"] > 0 and pe.nic_bytes["cnic_tx"] > 0
    de_views = [view.engine(i) for i in system.engine_ids("decode")]
    assert sum(e.nic_bytes["snic_read"] for e in de_views) > 0
    assert sum(e.nic_bytes["cnic_tx"] for e in de_views) > 0
    assert len(pe.layers) == n_layers
    assert all(h.store > 0 and h.peer > 0 for h in pe.layers)  # PE reads and DE streams
    assert sum(h.dram for h in pe.layers) == 0  # no DRAM cache configured
    assert all(h.slack_s is not None and abs(h.slack_s) < 60 for h in pe.layers)
    des = [view.engine(i) for i in system.engine_ids("decode")]
    assert sum(e.nic_bytes["snic_write"] for e in des) > 0  # DEs persist blocks
    for node in view.nodes:
        assert node.read_queue_tokens == 0 and node.read_queue_blocks == 0
        assert node.snic_utilization is None  # unshaped: no bandwidth to divide by
    assert sum(n.storage_read_bytes or 0 for n in view.nodes) > 0
    # decisions: counted apart from the ring, which keeps only the last five
    s = view.scheduler
    assert s.fifo_length == s.pe_queue_length == s.in_flight == 0
    assert s.decisions.total == TURNS and s.last_decision_seq == TURNS
    assert sum(s.decisions.side.values()) == TURNS
    assert s.decisions.side["pe"] > 0 and s.decisions.side["de"] > 0
    assert s.decisions.pe_class == {"C1": 0, "C2": TURNS, "C3": 0}  # alpha, beta: 1e9
    assert sum(s.decisions.de_class.values()) == TURNS
    assert s.thresholds.read_side == "round-robin" and s.thresholds.source["alpha"] == "config"
    assert [d.seq for d in ring] == list(range(TURNS - 4, TURNS + 1))
    assert [d.seq for d in tail] == [TURNS - 1, TURNS]
    assert system.decisions(TURNS) == [] and system.decisions(10**9) == []
    # the scheduler's registry: what /metrics renders beside the engines' snapshots
    assert sum(r["value"] for r in snap["dualpath_scheduler_decisions_total"]) == TURNS
    assert snap["dualpath_ttft_seconds"][0]["count"] == TURNS
    assert snap["dualpath_tpot_seconds"][0]["count"] == TURNS  # every turn makes 4 tokens
    ready = {(r["labels"]["role"], r["labels"]["state"]): r["value"]
             for r in snap["dualpath_scheduler_engines"]}
    assert ready[("prefill", "ready")] == 1 and ready[("decode", "ready")] == 2
    # plain data: JSON without NaN, and back to an equal view
    data = view.to_dict()
    _no_nan(data)
    assert view_from_dict(json.loads(json.dumps(data))) == view


def _turns(system: RuntimeSystem, turn: int, prompts: dict[int, list[int]]) -> None:
    tickets = {}
    for traj in AGENTS:
        prompt = prompts.get(traj.agent_id, []) + append_token_ids(traj, turn, 256).tolist()
        tickets[traj.agent_id] = (prompt, system.submit(
            TurnRequest(traj.agent_id, turn, np.asarray(prompt), traj.turns[turn].gen)))
    for agent, (prompt, ticket) in tickets.items():
        prompts[agent] = prompt + ticket.wait(60).tokens


def test_update_scheduler_changes_later_decisions() -> None:
    opts = RuntimeOptions(policy="dualpath", block_tokens=8, snic_bw=2e6)
    prompts: dict[int, list[int]] = {}
    with RuntimeSystem(opts, MemoryStore()) as system:
        _turns(system, 0, prompts)
        first = system.decisions()[-1].seq
        with pytest.raises(UsageError, match="read_side: unknown read-side policy 'fastest'"):
            system.update_scheduler(SchedulerChange(read_side="fastest", alpha_tokens=0))
        assert system.scheduler.settings().alpha_tokens == 10**9  # nothing half-applied
        old, new = system.update_scheduler(SchedulerChange(
            alpha_tokens=0, beta_tokens=10**6, quota_s=0.05, read_side="round-robin"))
        assert old == {"alpha_tokens": 10**9, "beta_tokens": 10**9, "quota_s": 0.3,
                       "read_side": "dualpath"}
        assert new == {"alpha_tokens": 0, "beta_tokens": 10**6, "quota_s": 0.05,
                       "read_side": "round-robin"}
        pe = system.engine_ids("prefill")[0]
        wait_until(lambda: system.scheduler.reports()[pe].get("quota_s") == 0.05,  # SetQuota
                   5, "the PE to report the new quota",
                   pace=lambda: system.scheduler.fresh_reports(time.monotonic(), timeout=0.5))
        for turn in (1, 2):
            _turns(system, turn, prompts)
        # a NIC rate needs one whole window of heartbeats (Rate.window_s, 0.5 s); on a fast
        # host the turns can all finish inside it, so wait for heartbeats past one window
        system.scheduler.fresh_reports(system.started_at + 1.0, timeout=10)
        view = system.view()
        before, after = [d for d in system.decisions() if d.seq <= first], [
            d for d in system.decisions() if d.seq > first]
    for node in view.nodes:  # shaped storage NICs: utilisation measured, compute NICs not
        assert node.snic_bandwidth_bytes_per_s == 2e6
        assert node.snic_utilization is not None and node.snic_utilization >= 0
        assert node.cnic_utilization is None
    th = view.scheduler.thresholds
    assert (th.alpha_tokens, th.beta_tokens, th.quota_s, th.read_side) == (
        0, 10**6, 0.05, "round-robin")
    assert {th.source[k] for k in ("alpha", "beta", "quota", "read_side")} == {"api"}
    assert th.source["z_factor"] == "config"
    assert all(d.inputs["read_side"] == "dualpath" and d.inputs["alpha"] == 10**9
               for d in before)
    assert after and all(d.cached for d in after)
    for d in after:
        assert d.inputs["alpha"] == 0 and d.inputs["beta"] == 10**6
        assert d.inputs["quota_s"] == 0.05 and d.inputs["sources"]["alpha"] == "api"
        assert d.side == ("pe" if d.inputs["ordinal"] % 2 == 0 else "de")  # round robin
        chosen = next(e for e in d.inputs["pe_engines"] if e["id"] == d.pe)
        assert d.pe_class == ("C2" if chosen["read_q"] <= 0 else "C3")  # alpha = 0


@pytest.mark.parametrize(("change", "reason"), [
    (SchedulerChange(), "nothing to change"),
    (SchedulerChange(alpha_tokens=-1), "alpha_tokens: -1 is below 0"),
    (SchedulerChange(alpha_tokens=1.5), "alpha_tokens: expected a whole number"),  # type: ignore[arg-type]
    (SchedulerChange(alpha_tokens=True), "alpha_tokens: expected a whole number"),
    (SchedulerChange(beta_tokens=4), "beta_tokens: 4 is below 8"),
    (SchedulerChange(quota_s=0.0), "quota_s: expected a positive number of seconds"),
    (SchedulerChange(quota_s=float("nan")), "quota_s: expected a positive number"),
    (SchedulerChange(quota_s="1s"), "quota_s: expected a positive number"),  # type: ignore[arg-type]
    (SchedulerChange(read_side="seed"), "unknown read-side policy 'seed'"),
])
def test_bad_changes_are_refused_with_the_reason(change: SchedulerChange, reason: str) -> None:
    system = RuntimeSystem(RuntimeOptions(block_tokens=8, flops_rate=1e9))
    try:
        with pytest.raises(UsageError, match=reason):
            system.update_scheduler(change)
        assert system.view().scheduler.thresholds.source["alpha"] == "config"
    finally:
        system.close()


@pytest.mark.e2e
def test_view_of_engine_processes(tmp_path: Path) -> None:
    """Heartbeats cross ZeroMQ (msgpack): the view is the same shape, with real pids."""
    opts = RuntimeOptions(policy="round-robin", block_tokens=8, processes=True,
                          store_dir=tmp_path / "store")
    with RuntimeSystem(opts) as system:
        result = run_agents(system, AGENTS[:1], timeout=60)
        system.update_scheduler(SchedulerChange(quota_s=0.125))  # a quota message crosses too
        pe_id = system.engine_ids("prefill")[0]
        def fresh() -> None:
            system.scheduler.fresh_reports(time.monotonic(), timeout=0.5)

        wait_until(lambda: system.scheduler.reports()[pe_id].get("quota_s") == 0.125, 5,
                   "the PE process to report the new quota", pace=fresh)
        wait_until(lambda: all(e.gpu_utilization is not None for e in system.view().engines),
                   10, "a windowed GPU utilisation (1 s window)", pace=fresh)
        view = _fresh_view(system)
        pids = {eid: system.cluster.pid(eid) for eid in system.engine_ids("prefill")
                + system.engine_ids("decode")}  # type: ignore[union-attr]
    assert not result.errors
    assert view.state == "ready"
    for e in view.engines:
        assert e.state == "ready" and e.pid == pids[e.engine_id] != os.getpid()
        assert e.hbm_free_bytes is not None and e.gpu_utilization is not None
    pe = view.engine(system.engine_ids("prefill")[0])
    assert len(pe.layers) == system.shape.n_layers
    assert sum(h.store + h.peer for h in pe.layers) > 0
    assert view.scheduler.decisions.total == AGENTS[0].num_turns


def test_requeues_and_dead_engines_show_in_the_view() -> None:
    store = MemoryStore()
    traj = AGENTS[0]
    with RuntimeSystem(RuntimeOptions(policy="dualpath", block_tokens=8), store) as system:
        prompt = append_token_ids(traj, 0, 256).tolist()
        first = system.submit(TurnRequest(traj.agent_id, 0, np.asarray(prompt), 2)).wait(60)
        prompt = prompt + first.tokens + append_token_ids(traj, 1, 256).tolist()
        key = prefix_keys(prompt, system.namespace)[0]
        raw = bytearray(store.raw(key))
        raw[HEADER_SIZE] ^= 0xFF  # the checksum no longer matches: the read fails
        store.set_raw(key, bytes(raw))
        r = system.submit(TurnRequest(traj.agent_id, 1, np.asarray(prompt), 2)).wait(60)
        assert r.attempts == 2
        victim = system.engine_ids("decode")[1]
        system.cluster.kill(victim)
        wait_until(lambda: system.view().engine(victim).state == "dead", 5,
                   "the killed engine to show as dead", interval=0.01)
        view = system.view()
        snap = system.scheduler.registry.snapshot()
        attempts = [d.attempt for d in system.decisions() if d.turn == 1]
    assert view.scheduler.requeued_total == 1 and attempts == [0, 1]
    requeued = {r["labels"]["reason"]: r["value"]
                for r in snap["dualpath_scheduler_requeued_turns_total"]}
    assert requeued == {"read_failed": 1}
    engines = {(r["labels"]["role"], r["labels"]["state"]): r["value"]
               for r in snap["dualpath_scheduler_engines"]}
    assert engines[("decode", "dead")] == 1 and engines[("decode", "ready")] == 1
    assert view.state == "ready"  # degraded, still serving on the other DE


def test_a_silent_engine_that_reports_again_is_back_in_service() -> None:
    """A stall past the heartbeat timeout (a loaded host) must not lose an engine for good."""
    opts = RuntimeOptions(policy="round-robin", block_tokens=8)
    with RuntimeSystem(opts, MemoryStore()) as system:
        sched = system.scheduler
        pe = system.engine_ids("prefill")[0]  # the only PE: without it nothing finishes
        silenced = threading.Event()

        def silence_the_pe(rec: TurnRecord) -> None:
            if not silenced.is_set():
                silenced.set()
                with sched._lock:  # as if no heartbeat had come for 10 s
                    sched.engines[pe].last_seen -= 10
                    sched._check_heartbeats()

        result = run_agents(system, AGENTS, on_turn=silence_the_pe, timeout=60)
        view = system.view()
    assert silenced.is_set() and [eid for eid, _ in sched.dead_events] == [pe]
    assert sched.revived == 1 and view.engine(pe).state == "ready"
    assert not result.errors and result.tokens_by_turn() == _reference()
