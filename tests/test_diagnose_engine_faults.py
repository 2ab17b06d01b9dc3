"""Engine faults diagnose must name (issue 33, the drill's engine rows), as pure functions:
a dead or restarting engine while a peer serves its role (membership), an engine whose
fabric link loses KV (rule ``kv-lost``), a slow engine's compute in ``/metrics``, and the
grade the documented hbm-frag rule gives the drill's ``hbm_frag:stride=4`` fault."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

from test_diagnose_rules import T0, make_view

from dualpath_cli.cluster.supervisor import EngineSupervisor
from dualpath_cli.core.restart_policy import RestartPolicy
from dualpath_cli.diagnose import thresholds as th
from dualpath_cli.diagnose.model import Evidence, Severity
from dualpath_cli.diagnose.verdict import RULES
from dualpath_cli.diagnose.workflows.fabric import fabric, lost_in_window
from dualpath_cli.diagnose.workflows.membership import membership
from dualpath_cli.runtime.fabric_loss import FABRIC_LOST, FABRIC_MISSING, kv_loss_engine
from dualpath_cli.runtime.hbm import HbmPool
from dualpath_cli.runtime.wire import ReadFailed
from dualpath_cli.services.drill_rows import ROWS
from dualpath_cli.services.drill_score import parse_metrics
from dualpath_cli.telemetry.exposition import render_prometheus
from dualpath_cli.telemetry.membership import Membership, NodeMember
from dualpath_cli.telemetry.recording import Extras, Sample

# -- membership: one dead engine while its role still serves -------------------------------


def _members(d1: NodeMember) -> Any:
    return Membership("1P1D", "1P2D", (NodeMember("P0", 0, "prefill", "serving", 1, 1),
                                       NodeMember("D0", 1, "decode", "serving", 1, 1), d1))


def _ev(d1: NodeMember, at: float = 1_000.8, state: str = "ready") -> Any:
    engines = [SimpleNamespace(engine_id=i, node=i) for i in range(3)]
    view = SimpleNamespace(state=state, pd="1P2D", at=at, engines=engines,
                           membership=_members(d1))
    return SimpleNamespace(samples=[SimpleNamespace(view=view)])


def test_a_dead_engine_is_critical_and_named_while_its_peer_serves() -> None:
    dead = NodeMember("D1", 2, "decode", "dead", 1, 0, down_since=1_000.0, restarting=True)
    (f,) = membership(_ev(dead))
    assert f.severity == Severity.CRITICAL and f.subject == "node D1"
    assert f.title == "node D1: decode engine 2 died 0.8 s ago, restarting (0 restarts)"


def test_a_restarting_engine_stays_critical_until_it_serves_again() -> None:
    back = NodeMember("D1", 2, "decode", "joining", 1, 0, said_hello=False, restarts=1,
                      down_since=1_000.0, restarting=True)
    (f,) = membership(_ev(back, at=1_003.0))
    assert f.severity == Severity.CRITICAL
    assert f.title == "node D1: decode engine 2 died 3.0 s ago, restarting (1 restart)"
    serving = NodeMember("D1", 2, "decode", "serving", 1, 1, restarts=1)
    assert [x.severity for x in membership(_ev(serving))] == [Severity.OK]


def test_a_node_joining_for_the_first_time_is_not_down() -> None:
    new = NodeMember("D1", 2, "decode", "joining", 1, 0, said_hello=False)
    assert [x.severity for x in membership(_ev(new))] == [Severity.OK]
    # at start-up the cluster says "starting" until every hello: no incident
    assert [x.title for x in membership(_ev(new, state="starting"))] == [
        "starting: 1P1D of 1P2D serve so far"]


def test_a_restart_is_critical_while_the_cluster_says_starting() -> None:
    """The scheduler registers a restarted engine again before its new process says hello,
    so the whole cluster reads "starting" for the restart's length: the dead node is still
    the finding (the drill's kill_decode, in a full run, looked only in that window)."""
    for d1 in (NodeMember("D1", 2, "decode", "dead", 1, 0, down_since=1_000.0,
                          restarting=True),
               NodeMember("D1", 2, "decode", "joining", 1, 0, said_hello=False, restarts=1,
                          down_since=1_000.0, restarting=True)):
        (f,) = membership(_ev(d1, state="starting"))
        assert f.severity == Severity.CRITICAL and f.subject == "node D1"


def test_a_dead_engine_nobody_restarts_says_so_and_a_crash_loop_is_one_finding() -> None:
    dead = NodeMember("D1", 2, "decode", "dead", 1, 0)
    (f,) = membership(_ev(dead))
    assert f.severity == Severity.CRITICAL and f.title == (
        "node D1: decode engine 2 died, not restarted (0 restarts)")
    loop = NodeMember("D1", 2, "decode", "dead", 1, 0, restarts=4, crash_loop=True,
                      down_since=1_000.0)
    (f,) = membership(_ev(loop))
    assert "crash-looping" in f.title


class _Sched:
    def __init__(self) -> None:
        self.dead: list[int] = []

    def mark_dead(self, engine_id: int) -> None:
        self.dead.append(engine_id)


def test_the_supervisor_reports_a_death_by_node_until_the_engine_is_back() -> None:
    spec: Any = SimpleNamespace(engine_id=2, node=2, role="decode")  # what it reads of one
    sched = _Sched()
    sup = EngineSupervisor(sched, object(), [spec], {2: "D1"},  # type: ignore[arg-type]
                           RestartPolicy(), enabled=False)
    assert sup.down_by_node() == {}
    sup.on_death(2)
    ((node, (since, restarting)),) = sup.down_by_node().items()
    assert node == 2 and since > 0 and not restarting and sched.dead == [2]


# -- fabric: turns whose KV the engine's link lost ------------------------------------------


def _lost(per_sample: list[int], engine: int = 0) -> Evidence:
    samples = []
    for i, n in enumerate(per_sample):
        v = make_view(i)
        engines = tuple(dataclasses.replace(e, kv_lost_turns=n if e.engine_id == engine
                                            else 0) for e in v.engines)
        samples.append(Sample(T0 + i, dataclasses.replace(v, engines=engines), Extras()))
    return Evidence(samples, [])


def test_lost_turns_are_counted_in_the_window_across_a_restart() -> None:
    assert lost_in_window([5, 7, 9]) == 4
    assert lost_in_window([5, 7, 1, 2]) == 4  # restarted: counts from zero again
    assert lost_in_window([None, 3]) == 0


def test_an_engine_that_loses_kv_is_a_warning_from_the_minimum() -> None:
    (f,) = fabric(_lost([10, 10 + th.KV_LOST_MIN_TURNS]))
    assert f.severity == Severity.WARNING and f.subject == "engine 0"
    assert f.rule == "kv-lost" and f"{th.KV_LOST_MIN_TURNS} turns" in f.title


def test_fewer_lost_turns_than_the_minimum_is_not_enough_evidence() -> None:
    findings = fabric(_lost([0, th.KV_LOST_MIN_TURNS - 1]))
    assert all(f.severity == Severity.OK for f in findings)
    assert any("not enough evidence" in f.title for f in findings)
    assert [f.severity for f in fabric(_lost([4, 4, 4]))] == [Severity.OK]


def test_the_warning_holds_inside_the_band() -> None:
    ev = _lost([0, th.KV_LOST_WARN])
    kept = Evidence(ev.samples, [], previous={"kv-lost|engine 0": Severity.WARNING})
    assert fabric(kept)[0].severity == Severity.WARNING


def test_a_lost_kv_message_is_counted_against_the_engine_whose_link_lost_it() -> None:
    def rf(eid: int, why: str) -> ReadFailed:
        return ReadFailed(eid, 1, 0, -1, why)

    down = f"{FABRIC_LOST} to tcp://x was dropped (this engine's fabric link is down)"
    peer = f"{FABRIC_LOST} to tcp://x was dropped (the peer did not take it)"
    assert kv_loss_engine(rf(0, down), pe=0, de=2) == 0
    assert kv_loss_engine(rf(2, peer), pe=0, de=2) == 0
    assert kv_loss_engine(rf(0, peer), pe=0, de=2) == 2
    assert kv_loss_engine(rf(2, f"{FABRIC_MISSING} 0 missing"), pe=0, de=2) == 0
    assert kv_loss_engine(rf(2, "HBM: need 4 blocks"), pe=0, de=2) is None
    assert kv_loss_engine(ReadFailed(2, 1, 0, 3, "fabric: x"), pe=0, de=2) is None


# -- slow compute: a metric that shows it ---------------------------------------------------


def test_each_engines_compute_per_request_is_exported() -> None:
    text = render_prometheus(make_view(0, service={5: 0.16}))
    got = {s.labels["engine"]: s.value for s in parse_metrics(text)
           if s.name == "dualpath_engine_service_seconds"}
    assert got["5"] == 0.16 and got["4"] == 0.02 and len(got) == 6
    slow = next(r for r in ROWS if r.name == "slow_compute")
    made = SimpleNamespace(engine=5)
    assert slow.metrics_report(made, [], parse_metrics(text))  # type: ignore[arg-type]
    made.engine = 4
    assert not slow.metrics_report(made, [], parse_metrics(text))  # type: ignore[arg-type]


# -- hbm_frag: the drill expects what the documented rule says ------------------------------


def test_the_hbm_frag_rows_grade_is_the_rules_grade_of_its_fault() -> None:
    pool = HbmPool(3072, 16)
    pool.pin_stride(owner=-7, stride=4)  # what hbm_frag:stride=4 does
    score = pool.stats().fragmentation
    assert score > th.HBM_FRAG_CRIT  # runs of 3 blocks: 1 - 3/free, not 0.75
    row = next(r for r in ROWS if r.name == "hbm_frag")
    assert row.grade == RULES["hbm-frag"].raw(score).name == "CRITICAL"
