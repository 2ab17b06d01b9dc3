"""Golden output: ``dualpath bench``'s human rendering at 80 and 120 columns.

The report is built here (no run), so the text is fixed; a change to the layout shows up as
a diff against tests/golden/. Regenerate after an intended change with
``DUALPATH_UPDATE_GOLDEN=1 pytest tests/test_golden_bench.py`` and review the diff.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
from rich.console import Console

from dualpath_cli.cli.bench_cmd import render_bench
from dualpath_cli.services.bench import BenchReport, Demand, PolicyReport, calibrate_snic

GOLDEN = Path(__file__).parent / "golden"


def _policy(name: str, jct: float, per_node: dict[int, int], max_avg: float,
            busy: float, *, slo: bool = True, match: bool = True) -> PolicyReport:
    return PolicyReport(
        policy=name, jct_s=jct, turns=192, ttft_p50_s=jct / 40, ttft_p99_s=jct / 9,
        ttst_p50_s=0.012, ttst_p99_s=0.031, tpot_p50_s=0.0021, tpot_p99_s=0.0104,
        slo_met=slo, snic_read_bytes=per_node, snic_max_avg=max_avg, gpu_busy=busy,
        bubble_s=0.126, cached_tokens=78_208, pe_batch_mean=1.41, pe_chunks=0,
        tokens_match=match, foreign_cores=0.42)


def fixed_report(online: bool = False) -> BenchReport:
    """A 1P2D report with every policy; one row deliberately has different tokens."""
    cal = calibrate_snic(Demand(37_836_554_240.0, 85_786_624), 9.9e9, prefill_nodes=1,
                         decode_nodes=2, probes=12, probe_s=2.1)
    third = 85_786_624 // 3
    policies = [
        _policy("basic", 10.31, {0: 85_786_624, 1: 0, 2: 0}, 3.0, 0.38, slo=False),
        _policy("dualpath", 4.87, {0: third, 1: third + 65_536, 2: third - 65_536}, 1.02,
                0.74),
        _policy("oracle", 4.52, {0: 85_786_624, 1: 0, 2: 0}, float("nan"), 0.81),
        _policy("split", 5.02, {0: third, 1: third, 2: third}, 1.0, 0.71),
        _policy("round-robin", 6.93, {0: 42_893_312, 1: 21_446_656, 2: 21_446_656}, 1.5,
                0.52, match=False),
    ]
    setup = {"pd": "1P2D", "agents": 16, "turns": 192, "model": "tiny",
             "snic_bw": cal.snic_bw, "mode": "online 2.0 APS" if online else "offline",
             "slo": {"scale": 0.25, "ttft_s": 1.0, "tpot_s": 0.0125},
             "snic_source": "calibrated", "snic_calibration": cal.to_dict()}
    return BenchReport(setup, policies)


def render(report: BenchReport, width: int, online: bool) -> str:
    """Plain text at ``width`` columns; trailing spaces (rich pads titles) dropped."""
    buf = io.StringIO()
    console = Console(file=buf, width=width, color_system=None, force_terminal=False,
                      legacy_windows=False)
    render_bench(report, console, online)
    return "".join(line.rstrip() + "\n" for line in buf.getvalue().splitlines())


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("online", [False, True], ids=["offline", "online"])
def test_bench_rendering_matches_golden(width: int, online: bool) -> None:
    text = render(fixed_report(online), width, online)
    path = GOLDEN / f"bench_{'online' if online else 'offline'}_{width}.txt"
    if os.environ.get("DUALPATH_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"{path} missing: run with DUALPATH_UPDATE_GOLDEN=1"
    assert text == path.read_text()
    assert max(len(line) for line in text.splitlines()) <= width


def test_bench_rendering_keeps_every_cell_whole_at_80_columns() -> None:
    """No value is folded across lines (the old single table cut cells into stubs)."""
    text = render(fixed_report(online=True), 80, online=True)
    for cell in ("round-robin", "DIFFERENT", "MISSED", "28.6 28.7 28.5", "10.31",
                 "2.1/10.4", "8.98MB/s"):
        assert cell in text, cell
