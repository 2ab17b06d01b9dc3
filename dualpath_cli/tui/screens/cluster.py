"""The cluster screen: every engine with its load against alpha and beta, sortable and
filterable, each row marked by its class (overloaded / short read queue / long read queue)
with the class word shown, not by colour alone."""

from __future__ import annotations

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Input, Static

from dualpath_cli.tui.format import ENGINE_COLUMNS, engine_rows
from dualpath_cli.tui.screens.base import CockpitScreen
from dualpath_cli.tui.source import Frame

__all__ = ["ClusterScreen", "CLASS_STYLES"]

#: Row styles by class word (the word itself is always in the class column).
CLASS_STYLES = {"overloaded": "bold red", "long-rq": "yellow", "down": "dim strike",
                "starting": "dim", "draining": "dim"}
_KEYS = [k for k, _, _ in ENGINE_COLUMNS]


class ClusterScreen(CockpitScreen):
    """Engines table, filter box and a one-line summary."""

    NAME = "cluster"
    BINDINGS = [
        Binding("s", "sort_next", "Sort"),
        Binding("S", "sort_reverse", "Reverse", show=False),
        Binding("slash", "filter", "Filter"),
        Binding("escape", "clear_filter", "Clear filter", show=False),
    ]
    DEFAULT_CSS = """
    ClusterScreen #engines { height: 1fr; }
    ClusterScreen #filter { display: none; height: 3; }
    ClusterScreen #filter.-shown { display: block; }
    ClusterScreen #summary { height: 1; background: $panel; text-wrap: nowrap; }
    """

    def __init__(self) -> None:
        super().__init__()
        self.sort_key = "id"
        self.reverse = False
        self.filter_text = ""
        self.shown_rows = 0

    def body(self) -> ComposeResult:
        table: DataTable[str | Text] = DataTable(id="engines", cursor_type="row",
                                                 zebra_stripes=True)
        for key, label, width in ENGINE_COLUMNS:
            table.add_column(label, key=key, width=width)
        yield table
        yield Input(placeholder="filter engines: role, node (D1), state, class (overloaded)",
                    id="filter")
        yield Static("", id="summary", markup=False)

    def show_body(self, frame: Frame) -> None:
        table = self.query_one("#engines", DataTable)
        if frame.view is None:
            return
        rows = engine_rows(frame.view, self.filter_text, self.sort_key, self.reverse)
        keep = None
        if table.row_count and table.cursor_row >= 0:
            try:
                keep = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
            except Exception:  # noqa: BLE001 - no row under the cursor
                keep = None
        table.clear()
        counts: dict[str, int] = {}
        where = 0
        for i, r in enumerate(rows):
            counts[r.cls] = counts.get(r.cls, 0) + 1
            style = CLASS_STYLES.get(r.cls)
            key = str(r.engine_id)
            if style:
                table.add_row(*(Text(c, style=style) for c in r.cells), key=key)
            else:
                table.add_row(*r.cells, key=key)
            if key == keep:
                where = i
        if rows:
            table.move_cursor(row=where, animate=False)
        self.shown_rows = len(rows)
        total = len(frame.view.engines)
        parts = [" ".join(f"{w} {counts.get(w, 0)}" for w in
                          ("short-rq", "long-rq", "overloaded", "down"))]
        if self.filter_text:
            parts.append(f"filter {self.filter_text!r}: {len(rows)} of {total}")
        else:
            parts.append(f"{total} engines")
        parts.append(f"sort {self.sort_key}{' desc' if self.reverse else ''}")
        self.query_one("#summary", Static).update("  |  ".join(parts))

    def _rerender(self) -> None:
        if self.top.frame is not None:
            self.show(self.top.frame)

    def action_sort_next(self) -> None:
        """Sort by the next column."""
        self.sort_key = _KEYS[(_KEYS.index(self.sort_key) + 1) % len(_KEYS)]
        self._rerender()

    def action_sort_reverse(self) -> None:
        """Flip the sort order."""
        self.reverse = not self.reverse
        self._rerender()

    @on(DataTable.HeaderSelected)
    def _header(self, event: DataTable.HeaderSelected) -> None:
        key = str(event.column_key.value)
        if key == self.sort_key:
            self.reverse = not self.reverse
        else:
            self.sort_key, self.reverse = key, False
        self._rerender()

    def action_filter(self) -> None:
        """Open the filter box."""
        box = self.query_one("#filter", Input)
        box.set_class(True, "-shown")
        box.focus()

    def action_clear_filter(self) -> None:
        """Clear and close the filter box."""
        box = self.query_one("#filter", Input)
        box.value = ""
        box.set_class(False, "-shown")
        self.filter_text = ""
        self.query_one("#engines", DataTable).focus()
        self._rerender()

    @on(Input.Changed, "#filter")
    def _filter_changed(self, event: Input.Changed) -> None:
        self.filter_text = event.value
        self._rerender()

    @on(Input.Submitted, "#filter")
    def _filter_done(self, event: Input.Submitted) -> None:
        self.query_one("#engines", DataTable).focus()
