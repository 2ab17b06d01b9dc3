"""The digital twin (services/twin.py) and `dualpath tune suggest` / live `tune set --dry-run`.

The embedded world's compute is stubbed (``measure``) so predictions do not depend on the
speed of the machine running the tests; everything else is the real simulator.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from test_diagnose_rules import T0, make_view

from dualpath_cli.api.fake import FakeClient
from dualpath_cli.cli import source
from dualpath_cli.cli.app import main
from dualpath_cli.errors import UsageError
from dualpath_cli.runtime.workloads import agentic_workload
from dualpath_cli.services import twin
from dualpath_cli.services.recording import read_recording, write_recording
from dualpath_cli.sim import twin_replay, twin_search
from dualpath_cli.telemetry.recording import Sample
from dualpath_cli.telemetry.view import ClusterView, Decision
from dualpath_cli.workload.trajectory import Trajectory

#: Compute of a reference-model engine, fixed (about what a 2-core VM measures).
COMPUTE = {"flops": 3.3e9, "prefill_overhead_s": 0.002, "decode_step_s": 0.008}
SNIC = 2e6  # bytes/s per node: storage-bound, as dualpath bench calibrates it


def stub_measure(model: str, context: int, new: int) -> dict[str, float]:
    return dict(COMPUTE)


def cluster_view(read_side: str = "dualpath", alpha: int = 10**9, beta: int = 10**9,
                 pd: str = "1P2D") -> ClusterView:
    v = make_view(0, bw={n: SNIC for n in range(6)})
    th = dataclasses.replace(v.scheduler.thresholds, alpha_tokens=alpha, beta_tokens=beta,
                             read_side=read_side)
    return dataclasses.replace(v, model="tiny", pd=pd, scheduler=dataclasses.replace(
        v.scheduler, thresholds=th, policy=read_side))


def served(trajectories: list[Trajectory], with_gen: bool = False) -> list[Decision]:
    """The decision log of serving ``trajectories`` (prompt lengths as the runtime logs;
    ``with_gen``: each turn's generated tokens too)."""
    out: list[Decision] = []
    for t in trajectories:
        ctx = 0
        for i, turn in enumerate(t.turns):
            length = ctx + turn.append
            seq = len(out) + 1
            extra = {"gen": turn.gen} if with_gen else {}
            out.append(Decision(seq, T0 + seq * 0.01, seq, 0, t.agent_id, i, length, ctx,
                                0, 1, 1, "pe", 0, 0, 0, 0, **extra))
            ctx = length + turn.gen
    return out


def record(path: Path, view: ClusterView, decisions: list[Decision]) -> Path:
    write_recording(path, {"source": "test", "interval_s": 1.0, "window_s": 1.0},
                    [Sample(view.at, view), Sample(view.at + 1, view)], decisions)
    return path


@pytest.fixture(autouse=True)
def env(clean_config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "220")
    monkeypatch.setattr(twin, "measure_compute", stub_measure)


def test_a_recording_replays_every_served_prompt(tmp_path: Path) -> None:
    traj = agentic_workload(4, turns=5)
    rec = read_recording(record(tmp_path / "r.jsonl", cluster_view(), served(traj)))
    tr = twin.traffic_from_recording(rec, "r.jsonl")
    assert (len(tr.plans), tr.turns, tr.pd, tr.model) == (4, 20, "1P2D", "tiny")
    assert tr.snic_bytes_per_s == SNIC and tr.current.read_side == "dualpath"
    for plan, t in zip(tr.plans, traj, strict=True):  # every prompt length comes back
        ctx, want = 0, []
        for turn in t.turns:
            want.append(ctx + turn.append)
            ctx += turn.append + turn.gen
        ctx, got = 0, []
        for turn in plan.turns:
            got.append(ctx + turn.append)
            ctx += turn.append + turn.gen
        assert got == want


def test_no_served_turns_is_a_clear_error(tmp_path: Path) -> None:
    rec = read_recording(record(tmp_path / "r.jsonl", cluster_view(), []))
    with pytest.raises(UsageError, match="no served turns to replay"):
        twin.traffic_from_recording(rec, "r.jsonl")


def test_a_poor_read_side_gets_a_better_one_and_the_command_to_apply_it() -> None:
    tr = twin.traffic_from_decisions(cluster_view("round-robin"),
                                     served(agentic_workload(16, turns=12)), "live")
    world = twin.world_for(tr, measure=stub_measure, host_cores=2)
    assert world.kind == "embedded" and world.calibration.full_blocks_only
    res = twin_search.suggest(tr, world)
    assert res.best is not res.current
    assert res.best.setting.read_side in ("dualpath", "split")
    assert res.change(res.best) < -0.05  # round robin loads one side's NIC twice as often
    assert res.best.setting.command(tr.current).startswith(
        f"dualpath tune set read_side={res.best.setting.read_side}")
    dims = {p.dimension for p in res.ranked}
    assert {"alpha", "beta", "quota", "read_side"} <= dims
    assert res.to_dict()["best"][0]["jct_change"] == pytest.approx(res.change(res.best))


def test_settings_the_model_cannot_tell_apart_keep_todays() -> None:
    """One PE node: alpha never separates engines (C2/C3 are judged within the fetching
    group, whose engines share a read queue), so no alpha is suggested as 'better'."""
    tr = twin.traffic_from_decisions(cluster_view(alpha=0), served(agentic_workload(8, 6)),
                                     "live")
    world = twin.world_for(tr, measure=stub_measure, host_cores=2)
    alphas = [p for p in twin_search.suggest(tr, world).ranked if p.dimension == "alpha"]
    assert alphas
    assert {round(p.jct_s, 9) for p in alphas} == {round(
        twin_replay.predict(tr, world, tr.current).jct_s, 9)}


def test_a_poor_alpha_under_the_seed_rule_gets_a_lower_one() -> None:
    """Under seed-select alpha decides the read side (a PE node whose read queue exceeds it
    is not read from): 10^9 reads every prefix on the PE node, so the best alpha is lower,
    and it is listed as alpha's best even when another knob wins overall."""
    tr = twin.traffic_from_decisions(cluster_view("seed-select", alpha=10**9),
                                     served(agentic_workload(16, turns=12)), "live")
    world = twin.world_for(tr, measure=stub_measure, host_cores=2)
    res = twin_search.suggest(tr, world, workers=1)
    best = res.best_by_dimension()["alpha"]
    assert best.setting.alpha < 10**9 and best.setting.read_side == "seed-select"
    assert res.change(best) < -0.3 and best.snic_max_avg < res.current.snic_max_avg
    entry = res.to_dict()["by_dimension"]["alpha"]
    assert entry["command"] == f"dualpath tune set alpha={best.setting.alpha}"
    assert res.change(res.best) <= res.change(best)


@pytest.mark.e2e  # the search's pool of worker processes
def test_the_search_answers_the_same_on_worker_processes_as_in_one() -> None:
    tr = twin.traffic_from_decisions(cluster_view("seed-select", alpha=10**9),
                                     served(agentic_workload(16, turns=12)), "live")
    world = twin.world_for(tr, measure=stub_measure, host_cores=2)
    alone = twin_search.suggest(tr, world, workers=1).to_dict()
    pooled = twin_search.suggest(tr, world, workers=2).to_dict()
    for answer in (alone, pooled):  # the one clock reading: the search's own wall_s
        assert isinstance(answer.pop("wall_s"), float)
        assert '"wall_s"' not in json.dumps(answer)
    assert json.dumps(pooled) == json.dumps(alone)


def test_proposed_setting_resolves_units_like_the_running_cluster() -> None:
    tr = twin.traffic_from_decisions(cluster_view(), served(agentic_workload(2, 2)), "live")
    world = twin.world_for(tr, measure=stub_measure)
    s = twin_search.proposed_setting(tr, world, {"alpha": "3s", "beta": "200K", "quota": "150ms"})
    kvpt = world.model.kv_bytes_per_token
    assert s.alpha == int(SNIC * 3 // kvpt) and s.beta == 200_000
    assert s.quota_s == pytest.approx(0.15)
    with pytest.raises(UsageError, match="beta in tokens"):
        twin_search.proposed_setting(tr, world, {"beta": "5s"})


def test_pd_search_tries_the_other_splits() -> None:
    tr = twin.traffic_from_decisions(cluster_view(pd="2P4D"),
                                     served(agentic_workload(8, 4)), "live")
    world = twin.world_for(tr, measure=stub_measure, host_cores=2)
    pds = {s.pd for d, s in twin_search.candidates(tr, world, pd=True) if d == "pd"}
    assert pds == {"1P5D", "3P3D", "4P2D", "5P1D"}


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    code = main([*args, "--json"])
    out = capsys.readouterr()
    assert code == 0, out.err
    return json.loads(out.out)


def test_suggest_from_a_recording(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = record(tmp_path / "poor.jsonl.gz", cluster_view("round-robin"),
                  served(agentic_workload(16, turns=12)))
    data = run_json(capsys, "tune", "suggest", "--from", str(path), "--top", "2")
    assert data["traffic"]["agents"] == 16 and data["world"]["kind"] == "embedded"
    assert len(data["best"]) == 2
    assert data["best"][0]["read_side"] != "round-robin"
    assert data["best"][0]["jct_s"] < data["current"]["jct_s"]
    assert data["best"][0]["command"].startswith("dualpath tune set ")
    assert main(["tune", "suggest", "--from", str(path)]) == 0
    out = capsys.readouterr().out
    assert "apply with: dualpath tune set" in out and "SNIC Max/Avg" in out
    # today's setting in full on its own line, each other row by what it changes: no row
    # repeats today's read side or its P/D (the search varies neither here but the side)
    today = [ln for ln in out.splitlines() if ln.startswith("today: alpha ")]
    assert len(today) == 1 and "round-robin" in today[0] and "quota " in today[0]
    rows = [ln for ln in out.splitlines() if ln.startswith("│ ")]
    assert rows[0].startswith("│ today ") and len(rows) > 1
    assert not any("round-robin" in ln or "1P2D" in ln for ln in rows), out


def test_suggest_refuses_both_sources(capsys: pytest.CaptureFixture[str],
                                      tmp_path: Path) -> None:
    assert main(["tune", "suggest", "--from", str(tmp_path / "x"), "--url", "http://x"]) == 2
    assert "exclude each other" in capsys.readouterr().err


def test_live_dry_run_uses_the_twin_and_applies_nothing(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeClient(cluster_view("round-robin"), served(agentic_workload(16, turns=12)),
                      metrics_text="")
    monkeypatch.setattr(source, "connect", lambda ref, timeout: fake)
    monkeypatch.setenv("DUALPATH_URL", "http://fake")
    data = run_json(capsys, "tune", "set", "read_side=dualpath", "--dry-run")
    assert data["live"] is True and data["applied"] is False
    assert data["proposed"]["read_side"] == "dualpath"
    assert data["jct_change"] < -0.05
    assert data["band"] >= twin_search.MIN_GAIN and data["clears_band"] is True
    assert "wall_s" not in data["proposed"] and data["replicates"] == twin_search.REPLICATES
    assert main(["tune", "set", "read_side=dualpath", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "beats today's by more than its band" in out and "band" in out
    assert fake.audit == []


def test_pd_search_stays_in_the_bottleneck_free_range_of_a_profile() -> None:
    view = dataclasses.replace(cluster_view(pd="2P4D"), model="ds660b")
    tr = twin.traffic_from_decisions(view, served(agentic_workload(4, 2)), "live")
    world = twin.world_for(tr)  # hopper: P/D from 1/7 to 3.5 is bottleneck-free
    assert world.kind == "profile"
    pds = {s.pd for d, s in twin_search.candidates(tr, world, pd=True) if d == "pd"}
    assert pds == {"1P5D", "3P3D", "4P2D"}  # 5P1D (ratio 5) would bottleneck


def test_live_suggest_replays_only_the_window(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    # story 2: `tune suggest --window 10m` replays the turns decided in that last stretch
    decisions = served(agentic_workload(16, turns=12))
    last = max(d.at for d in decisions)
    view = dataclasses.replace(cluster_view("round-robin"), at=last)
    fake = FakeClient(view, decisions, metrics_text="")
    monkeypatch.setattr(source, "connect", lambda ref, timeout: fake)
    monkeypatch.setenv("DUALPATH_URL", "http://fake")
    whole = run_json(capsys, "tune", "suggest", "--budget", "5s")
    inside = [d for d in decisions if d.at >= last - 0.5]
    part = run_json(capsys, "tune", "suggest", "--budget", "5s", "--window", "500ms")
    assert whole["traffic"]["turns"] == len(decisions)
    assert part["traffic"]["turns"] == len(inside) < len(decisions)
    assert part["traffic"]["window_s"] == 0.5
    assert main(["tune", "suggest", "--window", "0s"]) == 2
    assert main(["tune", "suggest", "--from", str(tmp_path / "r"), "--window", "1m"]) == 2
    assert "a recording replays its own window" in capsys.readouterr().err


def test_pd_lists_the_splits_to_try(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # story 5: `tune suggest --from REC --pd 4P8D,3P9D,6P6D` tries exactly those splits
    tr = twin.traffic_from_decisions(cluster_view(pd="2P4D"),
                                     served(agentic_workload(8, 4)), "live")
    world = twin.world_for(tr, measure=stub_measure, host_cores=2)
    pds = [s.pd for d, s in twin_search.candidates(tr, world, pd=["3P3D", "2P4D", "4P8D"])
           if d == "pd"]
    assert pds == ["3P3D", "4P8D"]  # today's is not a candidate
    path = record(tmp_path / "r.jsonl.gz", cluster_view("round-robin", pd="1P2D"),
                  served(agentic_workload(8, turns=4)))
    data = run_json(capsys, "tune", "suggest", "--from", str(path), "--pd", "2P1D, 1P3D",
                    "--budget", "20s")
    plain = run_json(capsys, "tune", "suggest", "--from", str(path), "--budget", "20s")
    assert data["current"]["pd"] == "1P2D" and not data["skipped"] and not plain["skipped"]
    assert data["searched"] >= plain["searched"] + 2  # the two listed splits (+ combined)
    assert {p["pd"] for p in data["best"]} <= {"1P2D", "2P1D", "1P3D"}
    assert main(["tune", "suggest", "--from", str(path), "--pd", "4P8X"]) == 2
    assert "--pd 4P8X: invalid P/D spec" in capsys.readouterr().err
