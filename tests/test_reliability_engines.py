"""Losing engines fails fast with one clear line (issue 17): every engine of a role gone
mid-run stops the run within a check period instead of the 600 s per-turn wait, and an
engine that dies during start-up ends the start at once instead of a 60 s wait and a
traceback. Both leave no engine process behind."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import all_gone
from test_runtime import AGENTS, _reference

from dualpath_cli.cluster.local import EngineFailed, dead_role, describe_exits
from dualpath_cli.cluster.system import RuntimeSystem
from dualpath_cli.runtime.options import RuntimeOptions
from dualpath_cli.services.runner import RunResult, TurnRecord, run_agents

pytestmark = pytest.mark.e2e  # engine processes


def test_dead_role_names_the_role_and_how_its_engines_ended() -> None:
    roles = {"prefill": [0], "decode": [1, 2]}
    assert dead_role({1: -9}, roles) is None  # one DE of two: the other still serves
    reason = dead_role({0: -9}, roles)
    assert reason is not None and reason.startswith(
        "every prefill engine has died (engine 0 (killed by SIGKILL))")
    assert describe_exits({2: 1, 1: -15}) == ("engine 1 (killed by SIGTERM), "
                                              "engine 2 (exit code 1)")


def _opts(tmp_path: Path) -> RuntimeOptions:
    return RuntimeOptions(policy="dualpath", block_tokens=8, processes=True,
                          store_dir=tmp_path / "store", heartbeat_timeout=3600.0,
                          restart=False)  # cluster.restart off: a dead engine stays dead


def test_losing_the_only_prefill_engine_stops_the_run_at_once(tmp_path: Path) -> None:
    first_turn = threading.Event()
    out: list[RunResult] = []

    def on_turn(rec: TurnRecord) -> None:
        first_turn.set()

    with RuntimeSystem(_opts(tmp_path)) as system:
        pids = list(system.cluster.pids().values())  # type: ignore[union-attr]
        runner = threading.Thread(target=lambda: out.append(
            run_agents(system, AGENTS, on_turn=on_turn, timeout=600)))
        runner.start()
        assert first_turn.wait(120)
        system.cluster.kill(system.engine_ids("prefill")[0])
        killed_at = time.monotonic()
        runner.join(60)
        assert not runner.is_alive(), "the run waited on a role with no engine"
        took = time.monotonic() - killed_at
    assert took < 30  # a check period, not the 600 s per-turn timeout
    errors = out[0].errors
    assert len(errors) == 1 and errors[0].startswith("every prefill engine has died"), errors
    assert "agents stopped" in errors[0]
    assert all_gone(pids)


def test_a_dead_group_leader_hands_fetching_to_the_next_engine_of_its_node(
        tmp_path: Path) -> None:
    """Two PEs on one prefill node: its leader (the only engine that fetches for the
    group) is killed mid-run; the scheduler promotes the other, which serves the rest of
    the run with the reference tokens (before, the node's other GPU idled and every later
    turn waited for its client's timeout)."""
    assert_leader_hand_over(RuntimeOptions(
        policy="dualpath", block_tokens=8, processes=True, gpus_per_node=2,
        store_dir=tmp_path / "store", heartbeat_timeout=3600.0))


def assert_leader_hand_over(opts: RuntimeOptions,
                            check: Callable[[RuntimeSystem], None] = lambda _s: None) -> None:
    """Kill the first prefill engine (its group's leader) once a turn is done: the run
    finishes with the reference tokens and every later turn prefills on the second (the
    heir the scheduler promoted; one dispatched to the leader before the scheduler saw it
    die is retried there). ``check`` sees the started system first."""
    first_turn = threading.Event()
    out: list[RunResult] = []
    with RuntimeSystem(opts) as system:
        check(system)
        leader, heir = system.engine_ids("prefill")
        runner = threading.Thread(target=lambda: out.append(
            run_agents(system, AGENTS, on_turn=lambda _rec: first_turn.set(), timeout=120)))
        runner.start()
        assert first_turn.wait(120)
        system.cluster.kill(leader)
        killed_seq = system.decisions()[-1].seq
        runner.join(180)
        assert not runner.is_alive(), "the run never finished: the group lost its fetcher"
        later = [d for d in system.decisions(killed_seq) if d.kind == "turn"]
    result = out[0]
    assert not result.errors, result.errors
    assert result.tokens_by_turn() == _reference()
    # a turn dispatched to the leader before the scheduler saw it die is retried: each
    # later request's last attempt prefilled on the heir
    last = {d.rid: d for d in later}
    assert last and {d.pe for d in last.values()} == {heir}, later


def test_an_engine_dying_at_start_up_is_one_line_at_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import dualpath_cli.cluster.local as local

    real_start = local.LocalCluster.start

    def start_then_kill(self: local.LocalCluster, specs: list[Any]) -> None:
        real_start(self, specs)
        self.kill(specs[0].engine_id)  # dies before its hello

    monkeypatch.setattr(local.LocalCluster, "start", start_then_kill)
    system = RuntimeSystem(_opts(tmp_path))
    began = time.monotonic()
    with pytest.raises(EngineFailed, match=r"engine 0 \(killed by SIGKILL\) exited during "
                                           "start-up"):
        system.start(timeout=60)
    assert time.monotonic() - began < 30
    assert system.closed  # what was started was stopped
    cluster = system.cluster
    assert isinstance(cluster, local.LocalCluster)
    assert not any(p.is_alive() for p in cluster._procs.values())
