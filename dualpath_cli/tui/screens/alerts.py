"""The alerts panel: the diagnose workflows' live findings over the window, worst first,
each with its recommended action; the highlighted one's cause and evidence below."""

from __future__ import annotations

import json

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import DataTable, Static

from dualpath_cli.diagnose.model import Finding
from dualpath_cli.tui.screens.base import CockpitScreen
from dualpath_cli.tui.source import Frame

__all__ = ["AlertsScreen"]

_STYLE = {"CRITICAL": "bold red", "WARNING": "yellow", "UNKNOWN": "magenta", "OK": "green"}


class AlertsScreen(CockpitScreen):
    """Findings table and the selected finding's detail."""

    NAME = "alerts"
    BINDINGS = [Binding("o", "toggle_ok", "Show OK")]
    DEFAULT_CSS = """
    AlertsScreen #alerts { height: 1fr; }
    AlertsScreen #finding-box { height: 1fr; border-top: solid $primary; }
    """

    def __init__(self) -> None:
        super().__init__()
        self.show_ok = False
        self._findings: list[Finding] = []

    def body(self) -> ComposeResult:
        table: DataTable[str | Text] = DataTable(id="alerts", cursor_type="row")
        table.add_column("severity", key="severity", width=8)
        table.add_column("workflow", key="workflow", width=14)
        table.add_column("finding", key="title")
        table.add_column("do", key="action")
        yield table
        with VerticalScroll(id="finding-box"):
            yield Static("", id="finding", markup=False)

    def show_body(self, frame: Frame) -> None:
        table = self.query_one("#alerts", DataTable)
        findings = sorted((f for r in frame.reports for f in r.findings),
                          key=lambda f: -int(f.severity))
        if not self.show_ok:
            findings = [f for f in findings if int(f.severity) in (1, 2)]
        self._findings = list(findings)
        cursor = table.cursor_row
        table.clear()
        for i, f in enumerate(findings):
            sev = f.severity.name
            table.add_row(Text(sev, style=_STYLE.get(sev, "")), f.workflow, f.title,
                          f.action or "", key=str(i))
        detail = self.query_one("#finding", Static)
        if not findings:
            checked = len(frame.reports)
            detail.update(f"no warnings: {checked} workflows checked over "
                          f"{len(frame.history)} samples (o: show the OK checks)"
                          if checked else "no findings yet (the rules need a sample)")
            return
        table.move_cursor(row=min(max(cursor, 0), len(findings) - 1), animate=False)
        self._detail(table.cursor_row)

    def _detail(self, i: int) -> None:
        if not 0 <= i < len(self._findings):
            return
        f = self._findings[i]
        lines = [f"{f.severity.name} {f.workflow}: {f.title}"]
        if f.cause:
            lines.append(f"likely: {f.cause}")
        if f.action:
            lines.append(f"do:     {f.action}")
        if f.evidence:
            lines.append("evidence: " + json.dumps(f.evidence, sort_keys=True,
                                                   default=str)[:2000])
        self.query_one("#finding", Static).update(Text("\n".join(lines)))

    @on(DataTable.RowHighlighted, "#alerts")
    def _pick(self, event: DataTable.RowHighlighted) -> None:
        self._detail(event.cursor_row)

    def action_toggle_ok(self) -> None:
        """Show or hide the checks that passed."""
        self.show_ok = not self.show_ok
        if self.top.frame is not None:
            self.show(self.top.frame)
