"""The cluster screen: every engine with its load against alpha and beta, sortable and
filterable, each row marked by its class (overloaded / short read queue / long read queue)
with the class word shown, not by colour alone."""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import Input, Static

from dualpath_cli.tui.format import ENGINE_COLUMNS, engine_rows, node_grades
from dualpath_cli.tui.screens.base import CockpitScreen
from dualpath_cli.tui.source import Frame
from dualpath_cli.tui.widgets.engine_table import EngineTable

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
        yield EngineTable(ENGINE_COLUMNS, CLASS_STYLES, id="engines")
        yield Input(placeholder="filter engines: role, node (D1), state, class (overloaded)",
                    id="filter")
        yield Static("", id="summary", markup=False)

    def show_body(self, frame: Frame) -> None:
        table = self.query_one("#engines", EngineTable)
        if frame.view is None:
            return
        rows = engine_rows(frame.view, self.filter_text, self.sort_key, self.reverse,
                           node_grades(frame.reports, frame.faults, frame.view))
        table.set_rows(rows, keep=table.cursor_engine)
        counts: dict[str, int] = {}
        for r in rows:
            counts[r.cls] = counts.get(r.cls, 0) + 1
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

    @on(EngineTable.HeaderClicked)
    def _header(self, event: EngineTable.HeaderClicked) -> None:
        key = event.key
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
        self.query_one("#engines", EngineTable).focus()
        self._rerender()

    @on(Input.Changed, "#filter")
    def _filter_changed(self, event: Input.Changed) -> None:
        self.filter_text = event.value
        self._rerender()

    @on(Input.Submitted, "#filter")
    def _filter_done(self, event: Input.Submitted) -> None:
        self.query_one("#engines", EngineTable).focus()
