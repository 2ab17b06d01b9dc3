"""The NIC screen: PE/DE x storage/compute NIC, each with its trend and Max/Avg imbalance;
a node is drawn in the colour of its worst open finding or fault in force, with its mark."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Grid

from dualpath_cli.tui.format import QUADRANTS, nic_quadrants, node_grades
from dualpath_cli.tui.screens.base import CockpitScreen
from dualpath_cli.tui.source import Frame
from dualpath_cli.tui.widgets.quadrant import QuadrantView

__all__ = ["NicScreen"]


class NicScreen(CockpitScreen):
    """Four quadrants in a 2x2 grid."""

    NAME = "nic"
    DEFAULT_CSS = """
    NicScreen Grid { grid-size: 2 2; height: 1fr; }
    """

    def body(self) -> ComposeResult:
        with Grid():
            for i, (_, _, title) in enumerate(QUADRANTS):
                yield QuadrantView(title, self.top.ascii_only, id=f"q{i}")

    def show_body(self, frame: Frame) -> None:
        if not frame.history:
            return
        grades = node_grades(frame.reports, frame.faults, frame.view)
        for i, q in enumerate(nic_quadrants(frame.history, grades)):
            self.query_one(f"#q{i}", QuadrantView).show(q)
