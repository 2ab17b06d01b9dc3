"""`dualpath sim compare --plot/--plot-terminal`: a real PNG, a text chart, clear path errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dualpath_cli.cli.app import main
from dualpath_cli.sim import make_setup, simulate_offline, simulate_online
from dualpath_cli.sim.plots import compare_panels, render_compare_terminal

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TINY = ["sim", "compare", "--agents", "8", "--max-len", "16K", "--policies",
        "basic,dualpath,oracle"]


@pytest.fixture(autouse=True)
def wide(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "120")


def test_plot_writes_a_valid_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "compare.png"
    assert main([*TINY, "--plot", str(out)]) == 0
    data = out.read_bytes()
    assert data[:8] == PNG_MAGIC
    assert len(data) > 10_000  # three labelled bar panels, not an empty canvas
    captured = capsys.readouterr()
    assert "basic" in captured.out and "vs basic" in captured.out  # the table is unchanged
    assert f"wrote {out}" in captured.err


def test_json_output_stays_one_object_with_plots(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "c.png"
    assert main([*TINY, "--json", "--plot", str(out), "--plot-terminal"]) == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert set(data) == {"model", "pd", "agents", "max_len", "results", "speedup_vs_basic"}
    assert [r["policy"] for r in data["results"]] == ["basic", "dualpath", "oracle"]
    assert "JCT" in captured.err  # the text chart went to stderr
    assert out.read_bytes()[:8] == PNG_MAGIC


def test_terminal_plot_names_every_policy(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*TINY, "--plot-terminal"]) == 0
    out = capsys.readouterr().out
    chart = out[out.index("JCT, s"):]  # after the table
    for policy in ("basic", "dualpath", "oracle"):
        assert policy in chart
    assert "\x1b[" not in out  # no colour codes when stdout is not a terminal
    assert "storage-NIC Max/Avg" in chart


@pytest.mark.parametrize(("name", "reason"), [
    ("missing/dir/x.png", "does not exist"),
    ("plot.txt", "must end in .png"),
])
def test_bad_plot_path_is_one_line_usage_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, reason: str) -> None:
    target = tmp_path / name
    assert main([*TINY, "--plot", str(target)]) == 2
    err = capsys.readouterr().err
    assert reason in err and err.count("\n") == 1
    assert "simulating" not in err  # refused before any simulation ran
    assert not target.exists()


def test_directory_as_plot_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "d.png"
    folder.mkdir()
    assert main([*TINY, "--plot", str(folder)]) == 2
    assert "is a directory" in capsys.readouterr().err


def test_online_compare_plots_latencies_against_the_slo(tmp_path: Path) -> None:
    results = [simulate_online(make_setup("ds27b", "1P1D", p), 0.2, horizon=120,
                               max_len=16_000) for p in ("basic", "dualpath")]
    panels = compare_panels(results)
    assert [p.limit for p in panels[:2]] == [4.0, 50.0]  # TTFT 4 s, TPOT 50 ms
    assert panels[0].values == tuple(r.ttft.mean for r in results if r.ttft)
    text = render_compare_terminal(results, "online")
    assert "TTFT mean" in text and "TPOT mean" in text and "dualpath" in text


def test_offline_panels_carry_jct_and_leave_missing_values_blank() -> None:
    results = [simulate_offline(make_setup(policy=p), agents=4, max_len=16_000)
               for p in ("basic", "oracle")]
    jct, snic = compare_panels(results)
    assert jct.values == tuple(r.jct for r in results)
    assert snic.labels[1] == "-"  # oracle reads nothing: no Max/Avg
