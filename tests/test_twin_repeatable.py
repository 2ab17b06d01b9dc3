"""`dualpath tune suggest` answers the same twice, shows every asked split, bands each
change, suggests only beyond the band, prints apply lines that run, and shows thresholds
as `status` does (issue 33, item 2)."""

from __future__ import annotations

import dataclasses
import json
import shlex
from pathlib import Path
from typing import Any

import pytest
import typer
from test_twin import cluster_view, record, served, stub_measure

from dualpath_cli.api.fake import FakeClient
from dualpath_cli.cli import source
from dualpath_cli.cli.app import main
from dualpath_cli.cli.threshold_text import alpha_text
from dualpath_cli.cli.tune_live import print_suggestion
from dualpath_cli.config import load_config
from dualpath_cli.errors import UsageError
from dualpath_cli.runtime.workloads import agentic_workload
from dualpath_cli.services import twin
from dualpath_cli.sim import twin_replay, twin_search


@pytest.fixture(autouse=True)
def env(clean_config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "240")


def noisy_measure() -> tuple[list[int], Any]:
    """A compute measurement that moves on every call, as a loaded host's does."""
    calls: list[int] = []

    def measure(model: str, context: int, new: int) -> dict[str, float]:
        calls.append(1)
        got = stub_measure(model, context, new)
        return {k: v * (1 + 0.07 * len(calls)) for k, v in got.items()}

    return calls, measure


def suggest_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[str, dict[str, Any]]:
    assert main(["tune", "suggest", *args, "--json"]) == 0
    out = capsys.readouterr().out
    return out, json.loads(out)


def test_two_runs_answer_byte_for_byte_the_same_but_wall_s(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls, measure = noisy_measure()
    monkeypatch.setattr(twin, "measure_compute", measure)
    path = record(tmp_path / "r.jsonl.gz", cluster_view("round-robin"),
                  served(agentic_workload(8, turns=4)))
    args = ("--from", str(path), "--pd", "2P1D,1P3D", "--top", "2")
    texts = []
    for _ in range(2):
        text, data = suggest_json(capsys, *args)
        assert isinstance(data.pop("wall_s"), float)
        assert '"wall_s"' not in json.dumps(data)  # the one clock reading is the top one
        texts.append(text.replace(f'"wall_s": {json.dumps(json.loads(text)["wall_s"])}', ""))
    assert texts[0] == texts[1]
    assert len(calls) == 1  # this host's compute measured once, then kept
    assert twin.compute_path().exists()
    # --remeasure measures again (and may answer differently: a new measurement)
    suggest_json(capsys, *args, "--remeasure")
    assert len(calls) == 2


def test_the_kept_measurement_is_per_turn_shape_and_says_when_it_was_taken(
        monkeypatch: pytest.MonkeyPatch) -> None:
    shapes: list[tuple[int, int]] = []

    def measure(model: str, context: int, new: int) -> dict[str, float]:
        shapes.append((context, new))
        return stub_measure(model, context, new)

    monkeypatch.setattr(twin, "measure_compute", measure)
    short = twin.traffic_from_decisions(cluster_view(), served(agentic_workload(4, 2)), "a")
    long = twin.traffic_from_decisions(cluster_view(), served(agentic_workload(4, 6)), "b")
    assert twin.mean_turn(short.plans) != twin.mean_turn(long.plans)
    notes = [twin.world_for(tr, host_cores=2).notes for tr in (short, long, short, long)]
    # measured at each traffic's own mean turn, once per shape, then kept
    assert shapes == [twin.mean_turn(short.plans), twin.mean_turn(long.plans)]
    assert notes[0] == notes[2] and notes[1] == notes[3]  # the same answer twice
    context, new = twin.mean_turn(short.plans)
    assert f"{new} new tokens after {context}" in notes[0][0]
    assert "kept from 20" in notes[0][0] and "--remeasure" in notes[0][0]
    kept = json.loads(twin.compute_path().read_text())
    assert all({"taken_unix", "load_average"} <= set(v) for v in kept.values())


def test_every_listed_split_is_a_row_even_when_it_loses(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(twin, "measure_compute", stub_measure)
    path = record(tmp_path / "r.jsonl.gz", cluster_view("round-robin", pd="1P2D"),
                  served(agentic_workload(8, turns=4)))
    _, data = suggest_json(capsys, "--from", str(path), "--pd", "2P1D,1P3D,1P2D",
                           "--top", "1")
    rows = {r["pd"]: r for r in data["rows"] if r["varied"] in ("pd", "current")}
    assert {"2P1D", "1P3D", "1P2D"} <= set(rows)
    assert rows["2P1D"]["asked"] and rows["1P3D"]["asked"] and not rows["1P2D"]["asked"]
    for r in data["rows"]:
        assert "error" in r or (r["band"] >= 0 and isinstance(r["clears_band"], bool))
    assert data["searched"] == len([r for r in data["rows"] if "error" not in r])
    assert main(["tune", "suggest", "--from", str(path), "--pd", "2P1D,1P3D", "--top",
                 "1"]) == 0
    table = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("│ ")]
    assert any("2P1D" in ln for ln in table) and any("1P3D" in ln for ln in table)


def _prediction(setting: twin_replay.Setting, jct_s: float, dim: str,
                replicates: tuple[float, ...]) -> twin_replay.Prediction:
    return twin_replay.Prediction(setting, jct_s, jct_s / 2, 0.1, 0.2, 1.0, dim, 0.0,
                                  tuple((j, j / 2) for j in replicates))


def _suggestion(change: float, replicate_changes: tuple[float, ...]) -> twin_search.Suggestion:
    tr = twin.traffic_from_decisions(cluster_view(pd="6P6D"), served(agentic_workload(2, 2)),
                                     "live")
    world = twin.world_for(tr, measure=stub_measure, host_cores=2)
    today = _prediction(tr.current, 100.0, "current", (100.0, 100.0))
    other = _prediction(dataclasses.replace(tr.current, pd="4P8D"), 100.0 * (1 + change),
                        "pd", tuple(100.0 * (1 + c) for c in replicate_changes))
    res = twin_search.Suggestion(tr, world, today, [today, other], 0.0, asked=("4P8D",))
    best = next((p for p in res.rows() if res.clears(p)), today)
    res.ranked = [best, *(p for p in res.rows() if p is not best)]
    return res


def test_a_change_inside_its_band_keeps_todays_and_says_why() -> None:
    res = _suggestion(-0.009, (-0.04, 0.022))
    other = res.runner_up()
    assert other is not None and res.band(other) == pytest.approx(0.031)
    assert res.best is res.current and not res.clears(other)
    assert res.why() == "best change 4P8D -0.9% JCT is inside its band +-3.1%"
    data = res.to_dict()
    assert (data["decision"], data["apply"]) == ("keep", None)
    # beyond its band (and at least MIN_GAIN): suggested, with the launch line for a P/D
    res = _suggestion(-0.08, (-0.07, -0.09))
    assert res.best.setting.pd == "4P8D" and res.band(res.best) == pytest.approx(0.01)
    assert res.to_dict()["decision"] == "change"
    assert res.why().startswith("4P8D -8.0% JCT beats today's by more than its band +-1.0%")


def _parse(argv: list[str]) -> None:
    """Parse ``argv`` (after ``dualpath``) with the app's own Click command, running nothing."""
    from dualpath_cli.cli.app import app

    group: Any = typer.main.get_command(app)  # the root group (Typer's own Click)
    ctx = group.make_context("dualpath", ["--help"], resilient_parsing=True)
    cmd = group.get_command(ctx, argv[0])
    assert argv[0] == "launch" and cmd is not None
    cmd.make_context(argv[0], list(argv[1:]), parent=ctx)  # a bad option or value raises


def test_the_apply_lines_run_as_printed(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    tr = twin.traffic_from_decisions(cluster_view("round-robin"),
                                     served(agentic_workload(8, turns=4)), "live")
    now = tr.current
    alpha_quota = dataclasses.replace(now, alpha=4321, quota_s=0.15, read_side="split")
    line = alpha_quota.command(now)
    assert line == "dualpath tune set alpha=4321 compute_quota=150ms read_side=split"
    assert now.command(now) is None
    fake = FakeClient(cluster_view("round-robin"), metrics_text="")
    monkeypatch.setattr(source, "connect", lambda ref, timeout: fake)
    monkeypatch.setenv("DUALPATH_URL", "http://fake")
    monkeypatch.setenv("DUALPATH_TOKEN", "fake-token")
    argv = shlex.split(line)
    assert argv[0] == "dualpath" and main([*argv[1:], "--yes"]) == 0, capsys.readouterr().err
    assert fake.audit[-1].new == {"alpha": "4321", "quota": "150ms", "read_side": "split"}
    # another P/D: the whole launch line, every threshold of the setting on it
    launch = dataclasses.replace(alpha_quota, pd="2P1D").command(now, nodes_per_group=2)
    assert launch is not None and launch.startswith("dualpath launch --pd 2P1D --set ")
    argv = shlex.split(launch)
    _parse(argv[1:])
    sets = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
    cfg = load_config(overrides=["cluster.pd=2P1D", *sets]).config
    assert (cfg.scheduler.alpha.form, cfg.scheduler.alpha.amount) == ("tokens", 4321)
    assert (cfg.scheduler.read_side, cfg.cluster.nodes_per_group) == ("split", 2)
    with pytest.raises(Exception, match="No such option"):  # the parse can fail
        _parse(["launch", "--pd", "2P1D", "--no-such-option"])


def test_thresholds_read_as_status_shows_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(twin, "measure_compute", stub_measure)
    view = cluster_view(alpha=300_000)
    th = dataclasses.replace(view.scheduler.thresholds, alpha_s=3.0)  # status: "alpha 3s"
    view = dataclasses.replace(view, scheduler=dataclasses.replace(view.scheduler,
                                                                    thresholds=th))
    assert alpha_text(th.alpha_tokens, th.alpha_s) == "3s"
    path = record(tmp_path / "r.jsonl.gz", view, served(agentic_workload(4, turns=3)))
    assert main(["tune", "suggest", "--from", str(path), "--replicates", "1"]) == 0
    out = capsys.readouterr().out
    today = next(ln for ln in out.splitlines() if ln.startswith("today: "))
    assert today.startswith("today: alpha 3s, beta ") and " tok, quota 300ms" in today


class _StatusKnowsTheNicRate(FakeClient):
    """A live cluster: its view carries alpha in tokens only; its status, which knows the
    storage NICs' rate, also in seconds (``/api/v1/status``'s ``alpha_s``)."""

    def status(self) -> Any:
        st = super().status()
        return dataclasses.replace(st, thresholds=dataclasses.replace(st.thresholds,
                                                                      alpha_s=3.0))


def test_live_suggest_reads_alpha_as_status_shows_it(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(twin, "measure_compute", stub_measure)
    view = cluster_view(alpha=300_000)
    assert view.scheduler.thresholds.alpha_s is None
    fake = _StatusKnowsTheNicRate(view, served(agentic_workload(4, turns=3)), metrics_text="")
    monkeypatch.setattr(source, "connect", lambda ref, timeout: fake)
    monkeypatch.setenv("DUALPATH_URL", "http://fake")
    assert main(["tune", "suggest", "--replicates", "1"]) == 0
    out = capsys.readouterr().out
    today = next(ln for ln in out.splitlines() if ln.startswith("today: "))
    assert today.startswith("today: alpha 3s, beta "), today


def test_a_listed_split_the_simulator_refuses_is_a_row_with_its_reason(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    tr = twin.traffic_from_decisions(cluster_view("round-robin"),
                                     served(agentic_workload(4, turns=3)), "live")
    world = twin.world_for(tr, measure=stub_measure, host_cores=2)
    real = twin_search.predict

    def predict(traffic: Any, w: Any, setting: twin_replay.Setting, *args: Any,
                **kw: Any) -> twin_replay.Prediction:
        if setting.pd == "2P1D":
            raise UsageError("2P1D: the decode engines' HBM cannot hold the context")
        return real(traffic, w, setting, *args, **kw)

    monkeypatch.setattr(twin_search, "predict", predict)
    res = twin_search.suggest(tr, world, pd=["2P1D", "1P3D"], workers=1)
    rows = {(r["varied"], r["pd"]): r for r in res.to_dict()["rows"]}
    assert rows[("pd", "2P1D")]["asked"] and "HBM cannot hold" in rows[("pd", "2P1D")]["error"]
    assert rows[("pd", "1P3D")]["asked"] and "band" in rows[("pd", "1P3D")]
    print_suggestion(res, 1)
    line = next(ln for ln in capsys.readouterr().out.splitlines() if "2P1D" in ln)
    assert "not replayed: 2P1D: the decode engines' HBM" in line
