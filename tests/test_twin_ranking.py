"""The twin's ranking when the recorded arrivals set the JCT (sim/twin_search.py
``ranking_measure``).

A recording with stories replays each agent from its recorded first arrival. With first
arrivals spread over the whole window, the job ends one short trajectory after the last
arrival whatever the setting, so the JCT cannot tell settings apart: the twin then ranks by
the mean trajectory time (each agent from its own arrival), with the same keep-today rule,
and says so. Where some candidate's JCT moves beyond the noise (tests/test_twin_poor_alpha.py,
an offline replay), the JCT ranks as before.

Compute is stubbed as in tests/test_twin.py; the simulator and the search are real.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
from test_twin import cluster_view, env, served, stub_measure  # noqa: F401 - env: autouse

from dualpath_cli.cli.app import main
from dualpath_cli.runtime.workloads import agentic_workload
from dualpath_cli.services import twin
from dualpath_cli.services.recording import read_recording, write_recording
from dualpath_cli.sim import twin_replay, twin_search
from dualpath_cli.telemetry.recording import Sample
from dualpath_cli.telemetry.view import ClusterView, Decision

#: 160 agents of 6 turns, one arriving every 0.4 s: a few in flight at a time (a poor read
#: side queues their reads), the last arriving 64 s in, about a second before the job ends.
AGENTS, TURNS, GAP_S = 160, 6, 0.4
BY_TRAJECTORY = "ranked by mean trajectory time: arrivals set the JCT"


def spread(tr: twin_replay.Traffic, gap_s: float = GAP_S) -> twin_replay.Traffic:
    """``tr`` with agent ``i``'s first turn arriving at ``i x gap_s``."""
    return dataclasses.replace(tr, starts=tuple(i * gap_s for i in range(len(tr.plans))))


def poor_read_side() -> twin_replay.Traffic:
    return twin.traffic_from_decisions(cluster_view("round-robin"),
                                       served(agentic_workload(AGENTS, turns=TURNS)), "live")


def test_arrivals_set_the_jct_so_a_poor_read_side_is_ranked_by_trajectory_time() -> None:
    tr = spread(poor_read_side())
    world = twin.world_for(tr, measure=stub_measure, host_cores=2)
    res = twin_search.suggest(tr, world, workers=1)
    assert tr.starts is not None and tr.starts[-1] > 0.95 * res.current.jct_s
    # no setting moves the JCT beyond the noise: by JCT this would be "(no change)"
    assert all(abs(res.change(p)) <= twin_search.MIN_GAIN for p in res.ranked)
    assert res.ranked_by == "mean_trajectory" and res.ranking == BY_TRAJECTORY
    best = res.best
    assert best is not res.current and best.setting.read_side in ("dualpath", "split")
    assert res.gain(best) == res.trajectory_change(best) < -0.2  # round robin queues reads
    assert best.ttft_mean_s < res.current.ttft_mean_s
    ranked = [p.mean_trajectory_s for p in res.ranked]
    assert ranked == sorted(ranked)
    data = res.to_dict()
    assert (data["ranked_by"], data["ranking"]) == ("mean_trajectory", BY_TRAJECTORY)
    entry = data["best"][0]
    assert entry["mean_trajectory_change"] == pytest.approx(res.trajectory_change(best))
    assert entry["command"] == f"dualpath tune set read_side={best.setting.read_side}"
    assert data["by_dimension"]["read_side"]["read_side"] == best.setting.read_side

    # the same turns all at t = 0: one job, whose JCT the read side moves: ranked by JCT
    offline = twin_search.suggest(dataclasses.replace(tr, starts=None), world, workers=1)
    assert offline.ranked_by == "jct" and offline.ranking == "ranked by JCT"
    assert offline.best.setting.read_side != "round-robin"
    assert offline.change(offline.best) < -0.05


def test_arrivals_no_setting_slows_or_speeds_keep_todays() -> None:
    # one-turn agents, one every 0.5 s: nothing to read, nothing queues; no setting moves
    # the JCT or a trajectory beyond the noise
    tr = spread(twin.traffic_from_decisions(cluster_view(), served(agentic_workload(
        40, turns=1)), "live"), gap_s=0.5)
    world = twin.world_for(tr, measure=stub_measure, host_cores=2)
    res = twin_search.suggest(tr, world, workers=1)
    assert res.ranked_by == "mean_trajectory" and res.best is res.current
    assert all(abs(res.trajectory_change(p)) <= twin_search.MIN_GAIN for p in res.ranked)
    data = res.to_dict()
    assert data["best"][0]["command"] is None and data["apply"] is None  # nothing to run
    assert data["decision"] == "keep"
    assert "is inside its band" in data["why"] or "predicted better than today" in data["why"]


def _prediction(jct_s: float, trajectory_s: float) -> twin_replay.Prediction:
    return twin_replay.Prediction(poor_read_side().current, jct_s, trajectory_s, 0.1, 0.2, 1.0,
                                  "alpha")


def test_a_jct_that_moves_beyond_the_noise_either_way_ranks() -> None:
    tr = spread(twin.traffic_from_decisions(cluster_view(), served(agentic_workload(2, 2)),
                                            "live"))
    today = dataclasses.replace(_prediction(100.0, 2.0), dimension="current")
    within = _prediction(100.0 * (1 - twin_search.MIN_GAIN / 2), 1.0)
    for moved in (100.0 * (1 - 2 * twin_search.MIN_GAIN), 100.0 * (1 + 2 * twin_search.MIN_GAIN)):
        assert twin_search.ranking_measure(tr, today, [today, within, _prediction(moved, 2.0)]
                                    ) == "jct"
    assert twin_search.ranking_measure(tr, today, [today, within]) == "mean_trajectory"
    # an offline replay (every agent at t = 0) is one job: its JCT ranks
    assert twin_search.ranking_measure(dataclasses.replace(tr, starts=None), today,
                                [today, within]) == "jct"
    # no trajectory time (a simulation without it): the JCT ranks
    nan = dataclasses.replace(today, mean_trajectory_s=math.nan)
    assert twin_search.ranking_measure(tr, nan, [nan, within]) == "jct"


def _recording(path: Path, view: ClusterView, decisions: list[Decision]) -> Path:
    """A recording of serving ``decisions`` with each turn's story, as ``dualpath record``
    keeps them: agent ``i`` first arrives at ``i x GAP_S``, its next turns right after its
    last token (no client gap); the engines report no busy time (nothing to fit)."""
    first = min(d.at for d in decisions)
    out, stories = [], []
    turn_at: dict[int, float] = {}
    for d in decisions:
        at = first + d.agent * GAP_S if d.turn == 0 else turn_at[d.agent] + 0.001
        turn_at[d.agent] = at
        out.append(dataclasses.replace(d, at=at + 0.001))
        stories.append({"rid": d.rid, "agent": d.agent, "turn": d.turn, "arrival": at,
                        "ttft_s": 0.1, "tpot_s": None})
    idle = dataclasses.replace(view, engines=tuple(
        dataclasses.replace(e, gpu_utilization=None) for e in view.engines))
    end = max(d.at for d in out)
    write_recording(path, {"source": "test", "interval_s": end - first,
                           "window_s": end - first},
                    [Sample(first, idle), Sample(end, idle)], out, stories)
    return path


def test_tune_suggest_says_which_measure_ranked(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    path = _recording(tmp_path / "r.jsonl.gz", cluster_view("round-robin"),
                      served(agentic_workload(AGENTS, turns=TURNS)))
    tr = twin.traffic_from_recording(read_recording(path), "r")
    assert tr.starts is not None and tr.starts[-1] == pytest.approx((AGENTS - 1) * GAP_S)
    assert main(["tune", "suggest", "--from", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["ranked_by"], data["ranking"]) == ("mean_trajectory", BY_TRAJECTORY)
    best = data["best"][0]
    assert best["read_side"] in ("dualpath", "split") and best["mean_trajectory_change"] < -0.2
    assert abs(best["jct_change"]) <= twin_search.MIN_GAIN

    assert main(["tune", "suggest", "--from", str(path)]) == 0
    out = capsys.readouterr().out
    words = " ".join(out.split())
    assert f"; {BY_TRAJECTORY})" in words and "traj. change" in words
    line = next(x for x in out.splitlines() if x.startswith("best: "))
    assert " mean trajectory time (" in line and "JCT: arrivals set it); apply with: " in line
    assert line.startswith(f"best: {best['mean_trajectory_change']:+.1%} +-{best['band']:.1%} ")
    assert line.endswith(f"dualpath tune set read_side={best['read_side']}")
