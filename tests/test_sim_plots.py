"""`dualpath sim compare/run --plot/--plot-terminal`: real PNGs, text charts, clear errors."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import dualpath_cli.sim
from dualpath_cli.cli.app import main
from dualpath_cli.core.types import Role
from dualpath_cli.errors import UsageError
from dualpath_cli.sim import make_setup, simulate_offline, simulate_online
from dualpath_cli.sim.metrics import snic_series
from dualpath_cli.sim.plots import (
    compare_panels,
    render_compare_terminal,
    render_series_terminal,
    write_series_png,
)

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
    assert set(data) == {"model", "pd", "agents", "workload", "max_len", "results",
                         "speedup_vs_basic"}
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


# --- sim run: storage-NIC reads per node over time ------------------------------------------

RUN = ["sim", "run", "--agents", "16", "--max-len", "16K"]
NODES_2P4D = ("P0", "P1", "D0", "D1", "D2", "D3")


def test_run_plot_writes_a_valid_png_and_keeps_the_table(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run.png"
    assert main([*RUN, "--plot", str(out)]) == 0
    data = out.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 10_000
    captured = capsys.readouterr()
    assert "SNIC max/avg" in captured.out and "dualpath" in captured.out
    assert "GB/s" not in captured.out  # no chart unless asked for
    assert f"wrote {out}" in captured.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.png"]  # no temp file left


def test_run_terminal_plot_labels_every_node(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*RUN, "--plot-terminal"]) == 0
    out = capsys.readouterr().out
    chart = out[out.index("storage-NIC reads per node"):]
    for node in NODES_2P4D:
        assert f" {node}" in chart
    assert "simulated time, s" in chart and "\x1b[" not in out


def test_run_json_is_unchanged_unless_series_is_asked_for(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*RUN, "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert "snic_series" not in plain
    assert main([*RUN, "--json", "--series"]) == 0
    full = json.loads(capsys.readouterr().out)
    series = full.pop("snic_series")
    assert set(full) == set(plain)
    assert series["nodes"] == list(NODES_2P4D) and series["bin_s"] == 5.0
    rows = series["read_bytes"]
    assert len({len(row) for row in rows}) == 1  # every node over the same bins
    # the series adds up to what the utilisation counts: every byte read, nothing else
    total = sum(map(sum, rows))
    capacity = len(rows) * series["line_rate_bytes_per_s"] * full["sim_time_s"]
    assert total == pytest.approx(full["snic_util"] * capacity, rel=1e-9)
    assert sum(map(sum, rows[:2])) > 0 and sum(map(sum, rows[2:])) > 0  # PE and DE sides


def test_run_json_with_terminal_plot_keeps_stdout_one_object(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*RUN, "--json", "--plot-terminal"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["policy"] == "dualpath"
    assert "P0" in captured.err and "D3" in captured.err


def test_series_without_json_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*RUN, "--series"]) == 2
    err = capsys.readouterr().err
    assert "--json" in err and err.count("\n") == 1


@pytest.mark.parametrize(("name", "reason"), [
    ("missing/dir/x.png", "does not exist"),
    ("plot.jpg", "must end in .png"),
])
def test_run_bad_plot_path_fails_before_simulating(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        name: str, reason: str) -> None:
    def must_not_run(*args: object, **kwargs: object) -> None:
        raise AssertionError("simulated despite a bad --plot path")

    # sim_cmd imports the simulator inside the command (a fast CLI start), from here
    monkeypatch.setattr(dualpath_cli.sim, "simulate_offline", must_not_run)
    target = tmp_path / name
    assert main([*RUN, "--plot", str(target)]) == 2
    err = capsys.readouterr().err
    assert reason in err and err.count("\n") == 1
    assert not target.exists()


def test_failed_png_write_keeps_the_old_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    result = simulate_offline(make_setup(), agents=4, max_len=16_000)
    target = tmp_path / "run.png"
    target.write_bytes(b"old chart")

    def full_disk(src: object, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)
    with pytest.raises(UsageError, match="cannot write: No space left on device"):
        write_series_png(result, target, "t")
    assert target.read_bytes() == b"old chart"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.png"]


def test_series_labels_roles_and_divides_a_short_last_bin_by_its_length() -> None:
    series = snic_series([(Role.PREFILL, {0: 10e9, 2: 5e9}), (Role.DECODE, {1: 20e9}),
                          (Role.PREFILL, {})], bin_s=5.0, end_s=12.5, line_rate=50e9)
    assert series.nodes == ("P0", "D0", "P1")
    assert series.read_bytes == ((10e9, 0.0, 5e9), (0.0, 20e9, 0.0), (0.0, 0.0, 0.0))
    assert series.edges() == [0.0, 5.0, 10.0, 12.5]
    assert series.gb_per_s()[0] == [2.0, 0.0, 2.0]  # 5 GB over the last 2.5 s
    assert [series.is_prefill(i) for i in range(3)] == [True, False, True]


def test_large_clusters_chart_each_roles_max_and_mean() -> None:
    nodes = [(Role.PREFILL if i < 8 else Role.DECODE, {0: float(i) * 1e9, 1: 1e9})
             for i in range(24)]
    result = simulate_offline(make_setup(policy="oracle"), agents=2, max_len=16_000)
    result.snic_series = snic_series(nodes, bin_s=5.0, end_s=10.0, line_rate=50e9)
    text = render_series_terminal(result, "big", width=100)
    assert "PE max (8 nodes)" in text and "DE max (16 nodes)" in text and "DE mean" in text
    assert "P0" not in text


def test_a_run_without_reads_says_so() -> None:
    result = simulate_offline(make_setup(policy="oracle"), agents=2, max_len=16_000)
    assert result.snic_series is not None and result.snic_series.bins == 0
    assert "no storage-NIC reads" in render_series_terminal(result, "oracle")
