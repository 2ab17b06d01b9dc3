"""Local process cluster: an engine killed mid-run is detected by its process exit, not by
a heartbeat timeout, and nothing is lost."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from test_runtime import AGENTS, GroupLoadCheck, _reference

from dualpath_cli.cluster.system import RuntimeSystem
from dualpath_cli.runtime.options import RuntimeOptions
from dualpath_cli.services.runner import RunResult, TurnRecord, run_agents

pytestmark = pytest.mark.e2e  # engine processes


@pytest.mark.parametrize("victim_role", ["decode", "prefill"])
def test_killed_engine_work_is_requeued_and_tokens_unchanged(
        tmp_path: Path, victim_role: str) -> None:
    check = GroupLoadCheck()
    opts = RuntimeOptions(policy="round-robin", block_tokens=8, processes=True,
                          store_dir=tmp_path / "store",
                          prefill_nodes=2 if victim_role == "prefill" else 1,
                          decode_nodes=2,
                          # Far longer than the test: a death can only be seen by the
                          # cluster's supervisor, which waits on the process sentinels.
                          heartbeat_timeout=3600.0)
    first_turn = threading.Event()
    out: list[RunResult] = []

    def on_turn(rec: TurnRecord) -> None:
        first_turn.set()

    with RuntimeSystem(opts) as system:
        check.install(system)
        runner = threading.Thread(target=lambda: out.append(
            run_agents(system, AGENTS, on_turn=on_turn, timeout=60)))
        runner.start()
        assert first_turn.wait(60)
        victim = system.engine_ids(victim_role)[0]
        system.cluster.kill(victim)
        runner.join(120)
        assert not runner.is_alive()
        dead = [engine for engine, _ in system.scheduler.dead_events]
    assert dead == [victim]  # seen through the process exit (no heartbeat timed out)
    # the kept DE group loads matched at every fetch, the death's too
    assert check.checked and not check.bad, check.bad
    result = out[0]
    assert not result.errors
    assert result.tokens_by_turn() == _reference()
