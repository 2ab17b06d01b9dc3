"""Engines restart (issue 34, item 8): kill -9 the only prefill engine under load and every
turn is served, with the reference tokens, none lost: in the bench's runner, in a launched
cluster, and as fault-matrix rows (bench/reliability.py ``--faults``). Five deaths in 60 s
is a crash loop: the engine stays down, one CRITICAL line, a CRITICAL membership finding.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import CLI, wait_for_turns, wait_until
from test_fault_matrix import (
    FaultRow,
    Sessions,
    _busy_engine,
    _check,
    _cluster,
    _opts,
    _row,
    _serving,
    join,
)
from test_runtime import AGENTS, _reference

from dualpath_cli.api.client import DualPathClient
from dualpath_cli.cluster.local import LocalCluster
from dualpath_cli.cluster.system import RuntimeSystem
from dualpath_cli.diagnose.grading import CRITICAL
from dualpath_cli.diagnose.workflows.membership import membership
from dualpath_cli.runtime.options import RuntimeOptions
from dualpath_cli.services.live import LiveCluster
from dualpath_cli.services.runner import RunResult, TurnRecord, run_agents

pytestmark = pytest.mark.e2e  # engine processes


def _pe_node(system: RuntimeSystem) -> Any:
    return next(n for n in system.view().membership.nodes if n.role == "prefill")


def test_the_only_prefill_engine_killed_mid_bench_restarts_and_every_turn_is_served(
        tmp_path: Path) -> None:
    """1P2D, the bench's runner: the PE is killed with SIGKILL after the first turn; its
    turns are re-queued, it restarts (dead -> joining -> serving) and the run finishes."""
    opts = RuntimeOptions(policy="dualpath", block_tokens=8, processes=True,
                          store_dir=tmp_path / "store", heartbeat_timeout=3600.0)
    first = threading.Event()
    out: list[RunResult] = []

    def on_turn(rec: TurnRecord) -> None:
        first.set()

    with RuntimeSystem(opts) as system:
        cluster = system.cluster
        assert isinstance(cluster, LocalCluster)
        old = cluster.pid(0)
        runner = threading.Thread(target=lambda: out.append(
            run_agents(system, AGENTS, on_turn=on_turn, timeout=120)))
        runner.start()
        assert first.wait(120)
        cluster.kill(0)
        runner.join(300)
        assert not runner.is_alive()
        wait_until(lambda: _pe_node(system).state == "serving", 60, "P0 to serve again")
        node = _pe_node(system)
        restarts = system.scheduler.registry.value("dualpath_engine_restarts_total",
                                                   role="prefill")
        new = cluster.pid(0)
        assert system.down() == {}
    result = out[0]
    assert not result.errors, result.errors
    assert result.tokens_by_turn() == _reference()  # every turn, the reference tokens
    assert new != old and node.restarts == 1 and not node.crash_loop
    assert restarts == 1


def test_five_deaths_in_a_minute_is_a_crash_loop_that_stays_down(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """With a 10 ms backoff (cluster.restart_backoff) the PE is killed each time it is back:
    the fifth death leaves it down, with one CRITICAL log line and a CRITICAL finding."""
    opts = RuntimeOptions(policy="dualpath", block_tokens=8, processes=True,
                          store_dir=tmp_path / "store", heartbeat_timeout=3600.0,
                          restart_backoff_s=0.01)
    caplog.set_level(logging.WARNING, logger="dualpath_cli.cluster.supervisor")
    with RuntimeSystem(opts) as system:
        cluster = system.cluster
        assert isinstance(cluster, LocalCluster)
        sup = system.supervisor
        for n in range(5):
            pid = cluster.pid(0)
            cluster.kill(0)
            if n < 4:  # killed again once its new process is up
                wait_until(lambda p=pid: cluster.pid(0) != p and 0 not in sup.restarting()
                           or 0 in sup.crash_looping(), 60, "the restart")
        wait_until(lambda: 0 in sup.crash_looping(), 30, "the crash loop")
        assert sup.restarts()[0] == 4 and 0 in system.down()
        node = _pe_node(system)
        view = system.view()
    assert node.crash_loop and node.state == "dead" and node.restarts == 4
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.CRITICAL]
    assert lines == ["engine 0 (P0) is crash-looping: 5 deaths in 60 s; left down (fix its "
                     "cause, then restart the cluster; cluster.restart)"]
    ev: Any = type("Ev", (), {"samples": [type("S", (), {"view": view})()]})()
    findings = membership(ev)
    loop = [f for f in findings if f.subject == "node P0"]
    assert loop and loop[0].severity == CRITICAL and "crash-looping" in loop[0].title


# -- fault-matrix rows (bench/reliability.py --faults) ---------------------------------------
@contextlib.contextmanager
def _under_load(store: Path, **kw: Any) -> Iterator[
        tuple[LiveCluster, LocalCluster, Sessions, list[threading.Thread]]]:
    """The fault matrix's cluster (``_opts(store, **kw)``) with every agent's first turn
    served and its next two running: the cluster, its engine processes, the sessions and
    their threads."""
    with _cluster(_opts(store, **kw)) as live:
        s = Sessions(live)
        s.run(range(0, 1))
        threads = s.start(range(1, 3))
        cluster = live.system.cluster
        assert isinstance(cluster, LocalCluster)
        yield live, cluster, s, threads


def _restart_pe(tmp: Path) -> FaultRow:
    """kill -9 the only PE of 1P2D while it holds turns: it restarts, nothing is lost."""
    store = tmp / "store"
    t_start = time.monotonic()
    with _under_load(store, prefill_nodes=1) as (live, cluster, s, threads):
        victim = _busy_engine(live, "prefill")
        t0 = time.monotonic()
        os.kill(cluster.pid(victim), signal.SIGKILL)
        sup = live.system.supervisor
        wait_until(lambda: sup.restarts()[victim] >= 1, 60, "the restart")
        back = wait_until(lambda: (live.view().engine(victim).state == "ready"
                                   and time.monotonic() - t0), 60, "its hello")
        join(threads)
        return _row("kill -9 the only PE (restart)", s, live, store, back, 30.0, t_start,
                    _serving(live), engine=victim, restarts=sup.restarts()[victim],
                    state_after=live.view().engine(victim).state)


def _crash_loop_pe(tmp: Path) -> FaultRow:
    """A PE of 2P2D dies five times in a minute (10 ms backoff): it stays down, a CRITICAL
    finding names it, and the other PE serves every turn."""
    store = tmp / "store"
    t_start = time.monotonic()
    with _under_load(store, restart_backoff_s=0.01) as (live, cluster, s, threads):
        sup = live.system.supervisor
        victim = _busy_engine(live, "prefill")
        t0 = time.monotonic()
        for _ in range(5):
            pid = cluster.pid(victim)
            os.kill(pid, signal.SIGKILL)
            wait_until(lambda p=pid: cluster.pid(victim) != p
                       or victim in sup.crash_looping(), 60, "the restart or the loop")
        detected = wait_until(lambda: victim in sup.crash_looping()
                              and time.monotonic() - t0, 60, "the crash loop")
        join(threads)
        ev: Any = type("Ev", (), {"samples": [type("S", (), {"view": live.view()})()]})()
        finding = [f.severity.name for f in membership(ev) if "crash-looping" in f.title]
        return _row("PE crash loop (5 deaths)", s, live, store, detected, 60.0, t_start,
                    _serving(live), engine=victim, restarts=sup.restarts()[victim],
                    crash_loop=True, finding=finding)


#: fault name -> scenario (bench/reliability.py runs them with the matrix)
RESTART_FAULTS: dict[str, Callable[[Path], FaultRow]] = {
    "restart_pe": _restart_pe,
    "crash_loop_pe": _crash_loop_pe,
}


@pytest.mark.parametrize("name", list(RESTART_FAULTS))
def test_restart_fault_row(name: str, tmp_path: Path) -> None:
    row = RESTART_FAULTS[name](tmp_path)
    _check(row)
    if name == "restart_pe":
        assert row.requeued >= 1 and row.detail["restarts"] == 1, row
        assert row.detail["state_after"] == "ready", row
    else:
        assert row.detail["restarts"] == 4 and row.detail["finding"] == ["CRITICAL"], row


# -- a launched cluster ------------------------------------------------------------------
def test_a_launched_cluster_restarts_its_killed_prefill_engine_and_answers_every_request(
        env: dict[str, str], launch_cluster: Callable[..., Any], tmp_path: Path) -> None:
    """``dualpath launch`` (1P2D), ``dualpath bench --url`` feeding it; the PE's process is
    killed with SIGKILL mid-run: the bench finishes with every turn answered."""
    up = launch_cluster("--store", str(tmp_path / "store"))
    work = subprocess.Popen([*CLI, "bench", "--url", up.url, "--agents", "4", "--turns", "6",
                             "--json"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        with DualPathClient(up.url, None) as client:
            wait_for_turns(client, 4, work)
            pid = next(e.pid for e in client.view().engines if e.role == "prefill")
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
            out, err = work.communicate(timeout=600)
            assert work.returncode == 0, err[-2000:]
            wait_until(lambda: next(n for n in client.view().membership.nodes
                                    if n.role == "prefill").state == "serving", 60,
                       "P0 to serve again")
            node = next(n for n in client.view().membership.nodes if n.role == "prefill")
            text = client.metrics_text()
    finally:
        if work.poll() is None:
            work.kill()
            work.communicate(timeout=30)
    assert "bench incomplete" not in err
    assert node.restarts == 1 and not node.crash_loop
    assert 'dualpath_engine_restarts_total{role="prefill"} 1' in text
