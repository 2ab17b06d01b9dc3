"""Dynamic controllers: the bounded core steps, and both worlds running them (the simulator;
the running scheduler's decision log, view, status and live switches)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from conftest import wait_until

from dualpath_cli.api.app import _status
from dualpath_cli.api.control import SystemUnits, parse_scheduler_change
from dualpath_cli.cluster.system import RuntimeSystem
from dualpath_cli.core.controllers import (
    CONTROLLERS,
    TAIL_MIN_TURNS,
    Bounds,
    Controllers,
    ttft_tail,
)
from dualpath_cli.errors import UsageError
from dualpath_cli.runtime.control import SchedulerChange
from dualpath_cli.runtime.options import RuntimeOptions
from dualpath_cli.runtime.workloads import agentic_workload
from dualpath_cli.services.runner import run_agents
from dualpath_cli.sim import Simulation, make_setup, synthetic_plans
from dualpath_cli.storage import MemoryStore

AGENTS = agentic_workload(2, turns=3, first_append=40, append=12, gen=4, seed=1)
VALUES = {"alpha": 1000.0, "beta": 2000.0, "quota": 0.3}


def _ctl(*on: str) -> Controllers:
    return Controllers(on={n: n in on for n in CONTROLLERS}, bases=dict(VALUES),
                       minimum={"beta": 64.0})


def test_each_rule_moves_its_value_the_seeds_way() -> None:
    c = _ctl("alpha", "beta", "quota")
    hot = c.step(VALUES, {"snic_util": 0.95, "gpu_util": 0.95, "ttft_tail": 6.0})
    assert [(s.name, s.new, s.reason) for s in hot] == [
        ("alpha", pytest.approx(900.0), "down: signal above band"),
        ("beta", pytest.approx(1800.0), "down: signal above band"),
        ("quota", pytest.approx(0.27), "down: signal above band")]
    cold = c.step(VALUES, {"snic_util": 0.1, "gpu_util": 0.1, "ttft_tail": 1.5})
    assert [s.new for s in cold] == [pytest.approx(1100.0), pytest.approx(2200.0),
                                     pytest.approx(0.33)]
    calm = c.step(VALUES, {"snic_util": 0.6, "gpu_util": 0.7, "ttft_tail": 3.0})
    assert all(not s.moved and s.reason == "hold: signal in band" for s in calm)
    none = c.step(VALUES, {})
    assert all(not s.moved and s.reason == "hold: no signal" for s in none)
    assert _ctl().step(VALUES, {"snic_util": 0.99}) == []  # all off: no step at all


def test_steps_are_bounded_by_floor_ceiling_and_max_change() -> None:
    c = _ctl("alpha", "beta")
    b = c.bounds("alpha")
    assert (b.floor, b.ceiling, b.max_change) == (250.0, 4000.0, 0.1)
    value = dict(VALUES)
    for _ in range(200):  # a saturated NIC and GPU for a long time
        steps = c.step(value, {"snic_util": 1.0, "gpu_util": 1.0})
        for s in steps:
            assert abs(s.new - s.old) <= s.max_change * s.old * (1 + 1e-9)
            assert s.floor <= s.new <= s.ceiling
            value[s.name] = s.new
    assert value["alpha"] == 250.0 and value["beta"] == 500.0
    assert c.step(value, {"snic_util": 1.0})[0].reason == "hold: at bound"
    # a value below the floor walks back in by at most max_change, whatever the signal
    low = c.step({**value, "beta": 100.0}, {"gpu_util": 1.0})[1]
    assert (low.new, low.reason) == (pytest.approx(110.0), "up: back above the floor")
    tiny = Controllers(on={"beta": True}, bases={"beta": 100.0}, minimum={"beta": 64.0})
    assert tiny.bounds("beta").floor == 64.0  # beta never below one block
    # a rule that wants more than max_change is clipped to it
    wide = Bounds.around(CONTROLLERS["alpha"], 1000.0)
    assert wide.max_change == 0.1
    c.rebase("alpha", 100.0)
    assert c.bounds("alpha").floor == 25.0
    state = c.state()
    assert state["alpha"]["on"] and state["alpha"]["last"]["signal_name"] == "snic_util"
    assert state["quota"] == {"on": False, "floor": 0.075, "ceiling": 1.2,
                              "max_change": 0.1, "last": None}


def test_ttft_tail_needs_enough_turns() -> None:
    assert ttft_tail([1.0] * (TAIL_MIN_TURNS - 1)) is None
    assert ttft_tail([1.0] * 9 + [5.0]) == 5.0
    assert ttft_tail([0.0] * 10) is None


def test_the_simulator_runs_the_same_controllers_bounded() -> None:
    plans = synthetic_plans(16_000, 16, 1)
    sim = Simulation(make_setup("ds27b", "1P2D", controllers=("alpha", "beta", "quota"),
                                control_interval_s=1.0), plans)
    res = sim.run_offline()
    off = Simulation(make_setup("ds27b", "1P2D"), plans).run_offline()
    assert res.turns == off.turns and res.extra["controller_moves"] == len(sim.control_steps)
    assert {s.name for s in sim.control_steps} >= {"alpha", "beta"}
    for s in sim.control_steps:
        assert abs(s.new - s.old) <= s.max_change * s.old * (1 + 1e-9)
        assert s.floor <= s.new <= s.ceiling and s.signal is not None
    assert res.extra["alpha_tokens"] == round(sim.controllers.last["alpha"].new)
    assert "controller_moves" not in off.extra  # controllers off: the run is as before


def test_the_running_scheduler_steps_logs_and_shows_its_controllers() -> None:
    opts = RuntimeOptions(policy="dualpath", block_tokens=8, flops_rate=1e9, snic_bw=2e6,
                          controllers={"alpha": True}, control_interval_s=0.2)
    with RuntimeSystem(opts, MemoryStore()) as system:
        result = run_agents(system, AGENTS, timeout=60)
        wait_until(lambda: any(d.kind == "control" for d in system.decisions()), 20,
                   "a controller step in the decision log")
        moves = [d for d in system.decisions() if d.kind == "control"]
        view = system.view()
        live = SimpleNamespace(ready_s=1.0, audit=[], faults=lambda: [], system=system,
                               readiness=lambda: (True, ""))
        status = _status(live, view)  # type: ignore[arg-type]
    assert not result.errors
    first = moves[0]
    assert first.side == "alpha" and first.rid == -1
    inp = first.inputs
    assert inp["signal_name"] == "snic_util" and inp["signal"] is not None
    assert inp["new"] == pytest.approx(inp["old"] * (0.9 if inp["signal"] > 0.8 else 1.1))
    assert inp["floor"] <= inp["new"] <= inp["ceiling"] and inp["max_change"] == 0.1
    assert "signals" in inp and inp["interval_s"] == 0.2
    th = view.scheduler.thresholds
    assert th.source["alpha"] == "controller" and th.alpha_tokens == round(moves[-1].inputs[
        "new"])
    assert th.controllers["alpha"]["on"] and not th.controllers["beta"]["on"]
    assert status["thresholds"]["controllers"]["alpha"]["last"]["controller"] == "alpha"
    # turn decisions are counted apart from controller moves
    assert view.scheduler.decisions.total == sum(t.num_turns for t in AGENTS)


def test_controllers_switch_live_and_the_quota_reaches_the_engines() -> None:
    opts = RuntimeOptions(policy="dualpath", block_tokens=8, flops_rate=1e9,
                          control_interval_s=60.0)
    with RuntimeSystem(opts, MemoryStore()) as system:
        old, new = system.update_scheduler(SchedulerChange(dynamic_quota=True))
        assert (old, new) == ({"dynamic_quota": False}, {"dynamic_quota": True})
        sched = system.scheduler
        with sched._lock:
            sched._ttfts = [0.1] * 9 + [5.0]  # a long tail: the quota steps down
            [step] = sched._control(time.monotonic())
        assert step.name == "quota" and step.new == pytest.approx(0.27)
        pes = system.engine_ids("prefill")
        wait_until(lambda: all((sched.heartbeats()[e] or SimpleNamespace(quota_s=0)).quota_s
                               == pytest.approx(0.27) for e in pes), 20,
                   "every PE's heartbeat to carry the new quota")
        assert sched.sources["quota"] == "controller"
        system.update_scheduler(SchedulerChange(quota_s=0.5))  # an operator's value rebases
        assert sched.controllers.bounds("quota").ceiling == pytest.approx(2.0)
        with pytest.raises(UsageError, match="dynamic_beta: expected true or false"):
            system.update_scheduler(SchedulerChange(dynamic_beta="yes"))  # type: ignore[arg-type]
        with pytest.raises(UsageError, match="fixed at launch"):
            system.update_scheduler(SchedulerChange(read_side="oracle"))


def test_the_patch_body_takes_the_switches() -> None:
    units = SystemUnits(kv_bytes_per_token=1024, block_tokens=8)
    change = parse_scheduler_change({"dynamic_alpha": True, "dynamic_beta": False}, units)
    assert (change.dynamic_alpha, change.dynamic_beta, change.dynamic_quota) == (True, False,
                                                                                None)
    with pytest.raises(UsageError, match="dynamic_alpha 'on': expected true or false"):
        parse_scheduler_change({"dynamic_alpha": "on"}, units)
    assert parse_scheduler_change({"read_side": "dual-rr"}, units).read_side == "dual-rr"
