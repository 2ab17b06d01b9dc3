"""Emulated engines: the real protocol over real sockets, timing from the cost model."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from dualpath_cli.cluster.emulated import EmulatedCluster, EmulationSetup
from dualpath_cli.cluster.system import RuntimeSystem
from dualpath_cli.core.layout import BlockShape, Namespace
from dualpath_cli.errors import ConfigError
from dualpath_cli.runtime.emulated import emulated_tokens
from dualpath_cli.runtime.options import RuntimeOptions
from dualpath_cli.runtime.workloads import agentic_workload
from dualpath_cli.services.runner import RunResult, run_agents
from dualpath_cli.workload.tokens import append_token_ids


def _opts(store: Path) -> RuntimeOptions:
    # 1P2D x 4 GPUs, three nodes over two host processes: host 0 holds nodes 0 and 2,
    # host 1 holds node 1 (a decode node)
    return RuntimeOptions(prefill_nodes=1, decode_nodes=2, gpus_per_node=4, engines="emulated",
                          emulated_model="ds27b", emulated_hosts=2, emulated_speed=20.0,
                          store_dir=store, heartbeat_s=0.2, fetch_s=0.01)


def _expected_tokens(result: RunResult, agents: int, turns: int) -> None:
    trajectories = agentic_workload(agents, turns=turns)
    by_key = {(t.agent, t.turn): t for t in result.turns}
    for traj in trajectories:
        context: list[int] = []
        for i, turn in enumerate(traj.turns):
            prompt = context + append_token_ids(traj, i, 256).tolist()
            rec = by_key[traj.agent_id, i]
            assert rec.prompt == len(prompt)
            assert rec.tokens == emulated_tokens(tuple(prompt), turn.gen)
            context = prompt + list(rec.tokens)


@pytest.mark.e2e
def test_agentic_workload_completes_over_sockets(tmp_path: Path) -> None:
    with RuntimeSystem(_opts(tmp_path)) as system:
        assert sorted(set(system.cluster.pids().values())) == sorted(  # type: ignore[union-attr]
            system.cluster.host_pids())  # type: ignore[union-attr]
        result = run_agents(system, agentic_workload(6, turns=4), timeout=60)
        decisions = system.decisions()
    assert not result.errors
    assert len(result.turns) == 24
    _expected_tokens(result, 6, 4)
    # DEs persisted marker blocks, so later turns find their prefix in the store
    assert all(t.cached > 0 for t in result.turns if t.turn > 0)
    assert len(decisions) >= 24
    assert {d.side for d in decisions} <= {"pe", "de", "split"}


@pytest.mark.e2e
def test_a_dead_host_loses_no_turn(tmp_path: Path) -> None:
    with RuntimeSystem(_opts(tmp_path)) as system:
        sched = system.scheduler
        host1 = system.cluster.host_pids()[1]  # type: ignore[union-attr]
        victims = [e for e, pid in system.cluster.pids().items()  # type: ignore[union-attr]
                   if pid == host1]
        assert {s.node for s in system.specs if s.engine_id in victims} == {1}
        out: list[RunResult] = []
        runner = threading.Thread(target=lambda: out.append(
            run_agents(system, agentic_workload(8, turns=6), timeout=60)))
        runner.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # wait for a turn in flight on node 1
            with sched._lock:
                held = any(f.de in victims for f in sched.flights.values())
            if held:  # stopped, it cannot finish the turn between this check and the kill
                os.kill(host1, signal.SIGSTOP)
                with sched._lock:
                    if any(f.de in victims for f in sched.flights.values()):
                        break
                os.kill(host1, signal.SIGCONT)
            time.sleep(0.002)
        else:
            pytest.fail("no turn reached node 1")
        system.cluster.kill(victims[0])
        runner.join(90)
        assert not runner.is_alive()
        with sched._lock:
            dead = {eid for eid, _ in sched.dead_events}
            requeued = sched.requeued
    assert dead == set(victims)
    assert requeued >= 1
    assert not out[0].errors
    assert len(out[0].turns) == 48
    _expected_tokens(out[0], 8, 6)


def test_a_model_that_does_not_fit_is_one_clear_error(tmp_path: Path) -> None:
    ns = Namespace("emulated-ds660b", "layer_major", BlockShape(4, 16, 256), "fp16")
    with pytest.raises(ConfigError, match="leaves no HBM for KV"):
        EmulatedCluster(EmulationSetup("ds660b", "hopper", 1, 2, ns, tmp_path))


def test_engines_option_is_checked() -> None:
    with pytest.raises(ConfigError, match="engines 'fake'"):
        RuntimeOptions(engines="fake")


def test_emulated_tokens_are_a_function_of_the_prompt() -> None:
    a = emulated_tokens((1, 2, 3), 5)
    assert a == emulated_tokens((1, 2, 3), 5)
    assert len(a) == 5 and all(0 <= t < 256 for t in a)
    assert a != emulated_tokens((1, 2, 4), 5)
