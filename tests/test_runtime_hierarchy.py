"""Hierarchical scheduling in the runtime: a root over sub-schedulers (runtime/hierarchy.py).

The agentic workload through the hierarchy answers every turn with the flat runtime's
tokens (which are the recompute-from-scratch tokens, tests/test_runtime.py), every sub gets
turns and dispatches only onto its own groups; one sub decides exactly as the flat scheduler
does on the same messages; the config key reaches the runtime; bad sub counts are one line.
"""

from __future__ import annotations

import json
import time
from typing import Any

import numpy as np
import pytest
from conftest import wait_until

from dualpath_cli.cli.app import main
from dualpath_cli.cluster.system import RuntimeSystem
from dualpath_cli.config import load_config
from dualpath_cli.core.layout import BlockShape, Namespace
from dualpath_cli.core.policies import SchedParams
from dualpath_cli.errors import ConfigError, UsageError
from dualpath_cli.runtime.hierarchy import HierarchicalScheduler
from dualpath_cli.runtime.options import RuntimeOptions, options_from_config
from dualpath_cli.runtime.scheduler import SchedulerService
from dualpath_cli.runtime.turns import TurnRequest
from dualpath_cli.runtime.wire import Fetch, Hello, encode
from dualpath_cli.runtime.workloads import agentic_workload
from dualpath_cli.services.runner import RunResult, run_agents
from dualpath_cli.storage import MemoryStore
from dualpath_cli.transfer import InProcFabric

AGENTS = agentic_workload(4, turns=3, first_append=40, append=12, gen=4, seed=1)


def _run(**kw: Any) -> tuple[RunResult, RuntimeSystem]:
    opts = RuntimeOptions(block_tokens=8, prefill_nodes=2, decode_nodes=2, flops_rate=1e9,
                          **kw)
    with RuntimeSystem(opts) as system:
        result = run_agents(system, AGENTS, timeout=60)
    return result, system


@pytest.fixture(scope="module")
def flat_tokens() -> dict[tuple[int, int], tuple[int, ...]]:
    """The flat runtime's answers (threads, in-memory store)."""
    result, _ = _run()
    assert not result.errors
    return result.tokens_by_turn()


def test_the_hierarchy_answers_with_the_flat_runtimes_tokens_and_uses_every_sub(
        flat_tokens: dict[tuple[int, int], tuple[int, ...]]) -> None:
    hier, system = _run(hierarchical=True, sub_schedulers=2)
    assert not hier.errors
    assert hier.tokens_by_turn() == flat_tokens
    assert len(hier.turns) == sum(len(a.turns) for a in AGENTS)
    assert all(t.cached > 0 for t in hier.turns if t.turn > 0)  # the store still serves
    sched = system.scheduler
    assert isinstance(sched, HierarchicalScheduler)
    assert all(n > 0 for n in sched.sub_turns) and sum(sched.sub_turns) == len(hier.turns)
    # each sub dispatched only onto its own groups: prefill node k and decode node 2 + k
    owner = {eid: k for k, sub in enumerate(sched.subs) for eid in sub.engines}
    turns = [d for d in system.decisions() if d.kind == "turn"]
    assert len(turns) == len(hier.turns)
    for d in turns:
        assert owner[d.pe] == owner[d.de]
    # one decision sequence across the subs, and every request id once
    seqs = [d.seq for d in system.decisions()]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert len({d.rid for d in turns}) == len(turns)
    view = system.view().scheduler
    assert view.decisions.total == len(turns) and view.last_decision_seq == seqs[-1]
    assert view.decision_latency["root_route"].count == len(hier.turns)


_ROLES = {0: ("prefill", 0), 1: ("prefill", 1), 2: ("decode", 2), 3: ("decode", 3)}
_NS = Namespace("tiny", "layer_major", BlockShape(2, 8, 8))
_PARAMS = SchedParams(alpha=10**9, beta=10**9, z_factor=1.05, block_tokens=8)


def _maker(fabric: InProcFabric) -> Any:
    def sub(_k: int = 0, _log: bool = True) -> SchedulerService:
        return SchedulerService(fabric, MemoryStore(), _NS, "dualpath", _PARAMS, 4096 * 8)
    return sub


class _Harness:
    """Four engines (PE groups 0, 1; DE groups 2, 3) that said hello to ``sched`` (no
    service thread: each message is handled at once on this thread, in a fixed order)."""

    def __init__(self, sched: SchedulerService | HierarchicalScheduler,
                 fabric: InProcFabric) -> None:
        self.sched = sched
        self.subs = sched.subs if isinstance(sched, HierarchicalScheduler) else [sched]
        for eid, (role, group) in _ROLES.items():
            sched.register(eid, role, group, group)
        self.eps = {eid: fabric.endpoint(f"engine{eid}") for eid in _ROLES}
        for eid, (role, group) in _ROLES.items():
            self.say(eid, Hello(eid, self.eps[eid].address, role, group, group, 0))

    def say(self, eid: int, msg: Any) -> None:
        owner = next(s for s in self.subs if eid in s.engines)
        header, frames = encode(msg)
        self.eps[eid].send(owner.address, header, frames)
        raw = owner.ep.recv(timeout=5)
        assert raw is not None
        with owner._lock:
            owner._handle(raw)

    def submit(self, n: int) -> None:
        rng = np.random.default_rng(5)
        for i in range(n):
            self.sched.submit(TurnRequest(i % 3, i // 3, rng.integers(0, 256, 30 + 7 * i), 3))

    def fetch(self, *eids: int) -> None:
        for eid in eids:
            role, group = _ROLES[eid]
            self.say(eid, Fetch(eid, group, role))

    def decisions(self) -> list[tuple[Any, ...]]:
        return [(d.rid, d.pe, d.de, d.de_group, d.side, d.pe_class, d.de_class, d.z)
                for d in self.sched.decisions() if d.kind == "turn"]

    def close(self) -> None:
        for ep in self.eps.values():
            ep.close()
        for s in self.subs:
            s.ep.close()


@pytest.mark.e2e
def test_engine_processes_over_zeromq_talk_to_their_subs(
        flat_tokens: dict[tuple[int, int], tuple[int, ...]], tmp_path: Any) -> None:
    """One process per engine, each on its own sub's socket: the same answers."""
    hier, system = _run(hierarchical=True, sub_schedulers=2, processes=True,
                        store_dir=tmp_path / "kv")
    assert not hier.errors
    assert hier.tokens_by_turn() == flat_tokens
    sched = system.scheduler
    assert isinstance(sched, HierarchicalScheduler) and all(sched.sub_turns)
    assert len({s.ctl for s in system.specs}) == 2


def _drive(sched: SchedulerService | HierarchicalScheduler, fabric: InProcFabric,
           ) -> list[tuple[Any, ...]]:
    """Six turns arrive and the groups fetch in a fixed order: the decisions logged."""
    h = _Harness(sched, fabric)
    h.submit(6)
    h.fetch(2, 3, 2, 0, 1, 0, 1)
    out = h.decisions()
    h.close()
    return out


def test_one_sub_decides_as_the_flat_scheduler() -> None:
    fabric = InProcFabric()
    flat = _drive(_maker(fabric)(), fabric)
    fabric = InProcFabric()
    hier = _drive(HierarchicalScheduler(_maker(fabric), [0, 1], [2, 3], 1), fabric)
    assert len(flat) == 6
    assert hier == flat


def test_a_sub_that_loses_a_role_hands_its_waiting_turns_to_the_others() -> None:
    fabric = InProcFabric()
    sched = HierarchicalScheduler(_maker(fabric), [0, 1], [2, 3], 2)
    h = _Harness(sched, fabric)
    try:
        h.submit(6)
        sub0, sub1 = sched.subs
        held = sorted(sub1.flights)
        assert held and sorted(sub0.flights) != list(range(6))
        h.fetch(3)  # sub 1 places its turns on its DE: they wait for its PE
        assert len(sub1.pe_queue) == len(held) and sub1._tok[3] > 0
        sched.mark_dead(1)  # sub 1's only PE exits
        assert not sub1.flights and not sub1.pe_queue and sub1._tok[3] == 0
        assert sorted(sub0.flights) == list(range(6)) and sched.moved == len(held)
        h.fetch(2, 0, 0, 0)  # sub 0 places and dispatches every turn
        out = h.decisions()
        assert sorted(d[0] for d in out) == list(range(6))
        assert {(d[1], d[2]) for d in out} == {(0, 2)}
        sched.submit(TurnRequest(0, 9, np.arange(20), 2))  # new turns go to sub 0 only
        assert 6 in sub0.flights and sched.sub_turns[1] == len(held)
    finally:
        h.close()


def test_the_config_key_starts_the_hierarchy_in_the_runtime() -> None:
    loaded = load_config(overrides=["scheduler.hierarchical=true", "cluster.pd=8P16D"],
                         environment=False)
    opts = options_from_config(loaded, flops_rate=1e9)
    assert opts.hierarchical and opts.subs == 2  # core default: min(8, 16) // 4
    system = RuntimeSystem(RuntimeOptions(prefill_nodes=3, decode_nodes=3, flops_rate=1e9,
                                          hierarchical=True, sub_schedulers=3))
    try:
        sched = system.scheduler
        assert isinstance(sched, HierarchicalScheduler) and len(sched.subs) == 3
        # engines talk to their own sub: three endpoints, one per prefill/decode pair
        ctl = {(s.role, s.node): s.ctl for s in system.specs}
        assert len(set(ctl.values())) == 3
        assert all(ctl["prefill", k] == ctl["decode", 3 + k] for k in range(3))
    finally:
        system.scheduler.stop()


@pytest.mark.parametrize(("kw", "match"), [
    ({"sub_schedulers": 3}, r"^sub-schedulers 3: need 1 to 2 \(each owns at least one "),
    ({"sub_schedulers": -1}, r"^sub-schedulers -1: need 1 to 2"),
])
def test_a_sub_count_that_does_not_fit_is_one_line(kw: dict[str, Any], match: str) -> None:
    with pytest.raises(UsageError, match=match) as err:
        RuntimeOptions(prefill_nodes=2, decode_nodes=4, hierarchical=True, **kw)
    assert "\n" not in str(err.value)


def test_a_sub_count_without_the_hierarchy_is_one_line() -> None:
    with pytest.raises(ConfigError,
                       match="^scheduler.sub_schedulers 2: set only with hierarchical"):
        RuntimeOptions(prefill_nodes=2, decode_nodes=2, sub_schedulers=2)


def test_joined_nodes_with_the_hierarchy_are_refused_in_one_line() -> None:
    with pytest.raises(UsageError, match="^scheduler.hierarchical: nodes that join a "
                                         "scheduler-only launch"):
        RuntimeSystem(RuntimeOptions(hierarchical=True, local_engines=False, flops_rate=1e9))


@pytest.mark.e2e
def test_bench_runs_the_hierarchy_from_the_config_key(
        capsys: pytest.CaptureFixture[str], tmp_path: Any) -> None:
    code = main(["bench", "--pd", "2P2D", "--agents", "1", "--turns", "2", "--policy",
                 "dualpath", "--calibrate", "probe", "--store", str(tmp_path / "kv"), "--set",
                 "scheduler.hierarchical=true", "--json"])
    out = capsys.readouterr()
    assert code == 0, out.err
    row = json.loads(out.out)["policies"][0]
    assert row["tokens_match"] and row["turns"] == 2 and not row["errors"]


@pytest.mark.e2e
def test_a_live_cluster_serves_through_the_hierarchy(tmp_path: Any) -> None:
    """What ``dualpath launch`` runs: turns through the API's entry points, the request
    listing and a request's story across the subs, a scheduler change on every sub, and no
    checkpoint (a hierarchical scheduler is not checkpointed)."""
    from dualpath_cli.runtime.control import SchedulerChange
    from dualpath_cli.services.live import LiveCluster

    opts = RuntimeOptions(block_tokens=8, prefill_nodes=2, decode_nodes=2, flops_rate=1e9,
                          hierarchical=True, sub_schedulers=2)
    live = LiveCluster(opts, checkpoint=tmp_path / "checkpoint.json")
    try:
        assert live.durable is None
        live.start()
        rng = np.random.default_rng(2)
        tickets = [live.submit(rng.integers(0, 256, 40).tolist(), 3, session=f"s{i}")
                   for i in range(4)]
        results = [t.wait(60) for t in tickets]
        assert all(len(r.tokens) == 3 for r in results)
        sched = live.system.scheduler
        assert isinstance(sched, HierarchicalScheduler) and all(sched.sub_turns)
        done = live.requests("finished", 10)["requests"]
        assert sorted(r["rid"] for r in done) == [0, 1, 2, 3]
        story = live.request(3)
        assert story["rid"] == 3
        live.update_scheduler(SchedulerChange(alpha_tokens=4096), "test")
        assert {sub.params.alpha for sub in sched.subs} == {4096}
        assert live.view().scheduler.thresholds.alpha_tokens == 4096
        # the API's status says how scheduling is laid out (dualpath status, tune show)
        from dualpath_cli.api.app import create_app
        from dualpath_cli.api.auth import TokenAuth
        from dualpath_cli.api.client import DualPathClient
        from dualpath_cli.api.server import ServerThread

        auth = TokenAuth.generate(tmp_path / "token")
        with ServerThread(create_app(live, auth)) as server, DualPathClient(
                server.url, auth.token) as client:
            assert client.status().scheduling == {"hierarchical": True, "sub_schedulers": 2,
                                                  "nodes_per_group": 1}
        assert not (tmp_path / "checkpoint.json").exists()
    finally:
        live.close()


def test_faults_and_compaction_reach_an_engine_through_its_sub() -> None:
    from dualpath_cli.faultspec import parse_fault

    opts = RuntimeOptions(block_tokens=8, prefill_nodes=2, decode_nodes=2, flops_rate=1e9,
                          hierarchical=True, sub_schedulers=2, heartbeat_s=0.02)
    with RuntimeSystem(opts) as system:
        sched = system.scheduler
        assert isinstance(sched, HierarchicalScheduler)
        assert sched.owner(3) is sched.subs[1]  # decode node 3 is sub 1's
        system.set_faults([parse_fault("hbm_frag:engine=3,stride=4")])

        def frag(eid: int) -> float:
            return next(e.hbm_fragmentation or 0.0 for e in system.view().engines
                        if e.engine_id == eid)

        wait_until(lambda: frag(3) >= 0.3, 10, "engine 3's fragmentation in the view",
                   pace=lambda: sched.subs[1].fresh_reports(time.monotonic(), timeout=1))
        assert frag(2) < 0.05
        before, after = system.compact_hbm(3)
        assert before["hbm_fragmentation"] >= 0.3 and after["hbm_fragmentation"] < 0.05
        with pytest.raises(UsageError, match="^no engine 9 "):
            system.compact_hbm(9)
        # a Compact the transport drops (a loaded host) is asked again, not waited out
        sub, dropped = sched.subs[1], []
        send = sub.send_to_engine

        def drop_first(eid: int, msg: object) -> bool:
            if not dropped:
                dropped.append(msg)
                return False
            return send(eid, msg)  # type: ignore[arg-type]

        system.clear_faults()
        system.set_faults([parse_fault("hbm_frag:engine=3,stride=4")])
        wait_until(lambda: frag(3) >= 0.3, 10, "engine 3 fragmented again",
                   pace=lambda: sched.subs[1].fresh_reports(time.monotonic(), timeout=1))
        sub.send_to_engine = drop_first  # type: ignore[method-assign]
        before, after = system.compact_hbm(3, timeout=10.0, resend_s=0.2)
        assert len(dropped) == 1 and after["hbm_fragmentation"] < 0.05
