"""The requests screen: recent scheduling decisions (the turns in flight and just placed),
newest first; the highlighted one's decision-log entry, with its inputs, below.

The API serves the decision log, not the turns' progress, so the age shown is time since the
decision (against the view's clock), not time to first token.
"""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import DataTable, Static

from dualpath_cli.tui.format import DECISION_COLUMNS, decision_detail, decision_rows
from dualpath_cli.tui.screens.base import CockpitScreen
from dualpath_cli.tui.source import Frame

__all__ = ["RequestsScreen"]


class RequestsScreen(CockpitScreen):
    """Decisions table over the selected decision's entry."""

    NAME = "requests"
    DEFAULT_CSS = """
    RequestsScreen #decisions { height: 1fr; }
    RequestsScreen #detail-box { height: 1fr; border-top: solid $primary; }
    """

    def __init__(self) -> None:
        super().__init__()
        self.selected: int | None = None

    def body(self) -> ComposeResult:
        table: DataTable[str] = DataTable(id="decisions", cursor_type="row")
        for name in DECISION_COLUMNS:
            table.add_column(name, key=name)
        yield table
        with VerticalScroll(id="detail-box"):
            yield Static("no decision selected (up/down, enter)", id="detail", markup=False)

    def show_body(self, frame: Frame) -> None:
        table = self.query_one("#decisions", DataTable)
        at = frame.view.at if frame.view is not None else None
        rows = decision_rows(frame.decisions, at)
        table.clear()
        where = 0
        for i, (seq, cells) in enumerate(rows):
            table.add_row(*cells, key=str(seq))
            if seq == self.selected:
                where = i
        if rows:
            table.move_cursor(row=where, animate=False)
        else:
            self.query_one("#detail", Static).update("no decisions logged yet")
        self._show_detail(frame)

    def _show_detail(self, frame: Frame) -> None:
        if self.selected is None:
            return
        d = next((x for x in frame.decisions if x.seq == self.selected), None)
        text = (decision_detail(d) if d is not None
                else f"decision #{self.selected} is no longer in the window")
        self.query_one("#detail", Static).update(text)

    @on(DataTable.RowHighlighted, "#decisions")
    @on(DataTable.RowSelected, "#decisions")
    def _pick(self, event: DataTable.RowHighlighted | DataTable.RowSelected) -> None:
        key = event.row_key.value
        if key is None:
            return
        self.selected = int(key)
        if self.top.frame is not None:
            self._show_detail(self.top.frame)
