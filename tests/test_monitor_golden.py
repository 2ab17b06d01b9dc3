"""Golden output: the monitor's tables and diagnose's findings at fixed widths.

Built from the hand-made views of tests/test_diagnose_rules.py (fixed times, fixed values),
so a layout change shows up as a diff against tests/golden/. Regenerate after an intended
change with ``DUALPATH_UPDATE_GOLDEN=1 pytest tests/test_monitor_golden.py`` and review it.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from rich.console import Console
from test_diagnose_rules import hbm_fragmented, make_view, nic_throttled

from dualpath_cli.cli.diagnose_cmd import render_reports
from dualpath_cli.cli.monitor_cmd import MONITOR_METRICS, History, render_table
from dualpath_cli.diagnose import rules
from dualpath_cli.telemetry.recording import Extras, Sample

GOLDEN = Path(__file__).parent / "golden"


def _render(draw: Callable[[Console], None], width: int) -> str:
    buf = io.StringIO()
    console = Console(file=buf, width=width, color_system=None, force_terminal=False,
                      legacy_windows=False)
    draw(console)
    return "".join(line.rstrip() + "\n" for line in buf.getvalue().splitlines())


def _check(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("DUALPATH_UPDATE_GOLDEN") == "1":
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert path.exists(), f"{path} missing: run with DUALPATH_UPDATE_GOLDEN=1"
    assert text == path.read_text(encoding="utf-8")


def _monitor(names: list[str], by: str | None, by_layer: bool) -> Callable[[Console], None]:
    def draw(console: Console) -> None:
        history = History()
        metrics = [MONITOR_METRICS[n] for n in names]
        table = None
        for i in range(5):  # five samples: the last table has deltas and sparklines
            view = make_view(i, frag={4: min(0.97, 0.2 * i)}, util={3: 0.2 + 0.2 * i},
                             slack={0: -0.001, 2: -0.004 + 0.002 * i}, layer_blocks=16)
            sample = Sample(view.at, view, Extras(cache_hit_ratio={"0/dram": 0.3,
                                                                   "0/store": 1.0}))
            table = render_table(sample, metrics, by, None, history, by_layer)
        console.print(table)
    return draw


@pytest.mark.parametrize("width", [80, 120])
def test_monitor_table(width: int) -> None:
    _check(f"monitor_hbm_frag_snic_{width}.txt",
           _render(_monitor(["hbm_frag", "snic_util"], None, False), width))


def test_monitor_by_layer() -> None:
    _check("monitor_by_layer_100.txt", _render(_monitor(["cache_hit"], None, True), 100))


def test_monitor_by_node() -> None:
    _check("monitor_gpu_by_node_100.txt", _render(_monitor(["gpu_util"], "node", False), 100))


@pytest.mark.parametrize("width", [80, 120])
def test_diagnose_findings(width: int) -> None:
    reports = [*rules.run_all(nic_throttled()),
               rules.run_workflow("hbm-frag", hbm_fragmented())]

    def draw(console: Console) -> None:
        render_reports(console, reports, "incident.jsonl.zst")
    _check(f"diagnose_all_{width}.txt", _render(draw, width))
