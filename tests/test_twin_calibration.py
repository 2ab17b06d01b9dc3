"""The twin's calibration from a recording (sim/twin_replay.py ``fit_world``) and the
simulation it runs (sim/measured.py: per-turn client gap, hand-off delay, recorded starts).

Compute is stubbed as in tests/test_twin.py; the fit and the simulator are real.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
from test_twin import cluster_view, env, stub_measure  # noqa: F401 - env: autouse
from test_twin import served as served_turns

from dualpath_cli.cli.app import main
from dualpath_cli.runtime.workloads import agentic_workload
from dualpath_cli.services import twin
from dualpath_cli.services.recording import read_recording, write_recording
from dualpath_cli.sim import make_setup, plans_from_trajectories, twin_replay
from dualpath_cli.sim.measured import TimedSimulation
from dualpath_cli.telemetry.recording import Sample
from dualpath_cli.telemetry.view import ClusterView, Decision
from dualpath_cli.workload.trajectory import Trajectory, Turn


def served(trajectories: list[Trajectory]) -> list[Decision]:
    """The decision log of serving ``trajectories``, with each turn's generated tokens."""
    return served_turns(trajectories, with_gen=True)


def _traffic(measured: twin_replay.Measured | None = None) -> twin_replay.Traffic:
    tr = twin.traffic_from_decisions(cluster_view(), served(agentic_workload(4, turns=5)),
                                     "test")
    return dataclasses.replace(tr, measured=measured)


def _measured(prefill: float, decode: float, decode_s: float | None = 0.2,
              gap_s: float | None = 0.05) -> twin_replay.Measured:
    return twin_replay.Measured(20, {"prefill": prefill, "decode": decode}, decode_s, 20, gap_s, 16)


def test_the_fit_replays_the_recorded_busy_time_hand_off_and_gap() -> None:
    m = _measured(8.0, 1.0)  # 20 two-token turns: 50 ms of decode each, 200 ms measured
    world = twin.world_for(_traffic(m), measure=stub_measure, host_cores=2)
    fit = world.fit
    assert fit is not None and fit.rounds <= twin_replay.FIT_ROUNDS
    assert fit.settled and fit.replayed_busy_s["prefill"] == pytest.approx(8.0, rel=0.02)
    # the decode scale is fitted before the hand-off, which then changes which turns
    # share a decode batch (hence the busy time); it is reported, not hidden
    assert fit.decode_scale is not None and fit.decode_scale > 1
    assert fit.replayed_busy_s["decode"] > 0
    assert fit.turn_gap_s == 0.05 and world.turn_gap_s == 0.05
    assert 0 < fit.handoff_s < 0.2 and world.handoff_s == fit.handoff_s
    plain = twin.world_for(_traffic(m), measure=stub_measure, host_cores=2, calibrate=False)
    assert plain.fit is None and plain.handoff_s == 0.0
    assert world.hardware.gpu_flops == pytest.approx(plain.hardware.gpu_flops
                                                     / fit.prefill_scale)
    note = world.notes[-1]
    assert note.startswith("calibrated from the recording's 20 served turns")
    assert "prefill x" in note and "hand-off" in note and "(median of 16)" in note


def test_twice_the_busy_time_fits_about_twice_the_compute_time() -> None:
    one = twin.world_for(_traffic(_measured(8.0, 1.0)), measure=stub_measure, host_cores=2)
    two = twin.world_for(_traffic(_measured(16.0, 2.0)), measure=stub_measure, host_cores=2)
    assert one.fit is not None and two.fit is not None
    assert one.fit.prefill_scale is not None and two.fit.prefill_scale is not None
    assert two.fit.prefill_scale / one.fit.prefill_scale == pytest.approx(2.0, rel=0.15)
    before = twin_replay.predict(_traffic(), one, _traffic().current)
    after = twin_replay.predict(_traffic(), two, _traffic().current)
    assert after.jct_s > before.jct_s  # slower compute, longer job


def test_what_cannot_be_fitted_is_said() -> None:
    m = twin_replay.Measured(20, {}, None, 0, None, 0)
    world = twin.world_for(_traffic(m), measure=stub_measure, host_cores=2)
    assert world.fit is not None and world.fit.prefill_scale is None
    assert world.fit.decode_scale is None and world.handoff_s == 0.0
    assert "not fitted: prefill speed" in world.notes[-1]


def _one_agent_jct(**kw: object) -> float:
    setup = make_setup("qwen32b", "1P1D", "dualpath")
    plans = plans_from_trajectories([Trajectory(0, (Turn(2000, 20),) * 5)])
    return TimedSimulation(setup, plans, **kw).run_offline().jct  # type: ignore[arg-type]


def test_a_gap_and_a_hand_off_lengthen_every_turn() -> None:
    base = _one_agent_jct()
    assert _one_agent_jct(turn_gap_s=0.1) - base == pytest.approx(0.4, rel=0.01)  # 4 gaps
    assert _one_agent_jct(handoff_s=0.05) - base == pytest.approx(0.25, rel=0.01)  # 5 turns
    with pytest.raises(ValueError, match="turn gap"):
        _one_agent_jct(turn_gap_s=-1.0)


def test_recorded_starts_delay_an_agent_and_its_trajectory_time_counts_from_there() -> None:
    setup = make_setup("qwen32b", "1P1D", "dualpath")
    plans = plans_from_trajectories([Trajectory(i, (Turn(2000, 20),) * 3) for i in range(2)])
    together = TimedSimulation(setup, plans).run_offline()
    apart = TimedSimulation(setup, plans, starts=[0.0, 30.0]).run_offline()
    assert apart.jct > 30.0 > together.jct
    assert apart.extra["mean_trajectory_s"] <= together.extra["mean_trajectory_s"] + 1e-9


def _busy_view(at: float, util: float) -> ClusterView:
    v = cluster_view()
    return dataclasses.replace(v, at=at, engines=tuple(
        dataclasses.replace(e, gpu_utilization=util) for e in v.engines))


def test_tune_suggest_shows_what_it_fitted_from_the_recording(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A recording with stories (as ``dualpath record`` takes them) is calibrated: the
    note says what, from how many turns; the JSON holds the fit."""
    decisions = served(agentic_workload(4, turns=5))
    stories = []
    for d in decisions:
        arrival = d.at - 0.001
        stories.append({"rid": d.rid, "agent": d.agent, "turn": d.turn, "arrival": arrival,
                        "ttft_s": 0.1, "tpot_s": None})
    samples = [Sample(t, _busy_view(t, 0.5)) for t in (decisions[0].at, decisions[0].at + 4)]
    path = tmp_path / "r.jsonl"
    write_recording(path, {"source": "test", "interval_s": 4.0, "window_s": 4.0}, samples,
                    decisions, stories)
    assert twin.traffic_from_recording(read_recording(path), "r").measured is not None
    assert main(["tune", "suggest", "--from", str(path)]) == 0
    err = capsys.readouterr().err
    assert "calibrated from the recording's 20 served turns" in err
    assert main(["tune", "suggest", "--from", str(path), "--json"]) == 0
    cal = json.loads(capsys.readouterr().out)["world"]["calibration"]
    assert cal["measured"]["turns"] == 20 and cal["measured"]["gaps"] == 16
    assert cal["prefill_scale"] > 0 and math.isfinite(cal["replayed_jct_s"])
