"""The engine table: a virtual table that draws only the rows on screen (Textual's Line API).

Why not DataTable: DataTable measures every cell it is given to size its columns, so
refreshing 1,152 engines x 12 columns each second cost seconds of CPU. Here the columns have
fixed widths (format.ENGINE_COLUMNS), rows are plain tuples of strings, and ``render_line``
draws one visible line on demand, so a refresh costs the rows' formatting plus what is on
screen, whatever the cluster's size. The header stays on the first line while the rows
scroll; clicking a header asks the screen to sort by that column.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.binding import Binding, BindingType
from textual.geometry import Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

from dualpath_cli.tui.format import EngineRow

__all__ = ["EngineTable"]


class EngineTable(ScrollView, can_focus=True):
    """Fixed-width columns, a sticky header, a row cursor; rows styled by class."""

    DEFAULT_CSS = """
    EngineTable { height: 1fr; background: $surface; }
    EngineTable > .engine-table--header { text-style: bold; background: $panel; }
    EngineTable > .engine-table--cursor { background: $accent 40%; }
    """
    COMPONENT_CLASSES: ClassVar[set[str]] = {"engine-table--header", "engine-table--cursor"}
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("up", "cursor(-1)", "Up", show=False),
        Binding("down", "cursor(1)", "Down", show=False),
        Binding("pageup", "page(-1)", "Page up", show=False),
        Binding("pagedown", "page(1)", "Page down", show=False),
    ]

    class HeaderClicked(Message):
        """A column header was clicked (the screen sorts by it)."""

        def __init__(self, key: str) -> None:
            super().__init__()
            self.key = key

    def __init__(self, columns: Sequence[tuple[str, str, int]],
                 styles: dict[str, str] | None = None, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.columns = tuple(columns)
        self.rows: list[EngineRow] = []
        self.cursor = 0
        self._class_styles = {k: Style.parse(v) for k, v in (styles or {}).items()}
        self._width = sum(w + 2 for _, _, w in self.columns)
        self._header = "".join(f" {label:<{w}} " for _, label, w in self.columns)

    # -- data --------------------------------------------------------------------------------
    def set_rows(self, rows: list[EngineRow], keep: int | None = None) -> None:
        """Show ``rows``; the cursor stays on engine ``keep`` when it is still shown."""
        self.rows = rows
        if keep is not None:
            where = next((i for i, r in enumerate(rows) if r.engine_id == keep), None)
            if where is not None:
                self.cursor = where
        self.cursor = max(0, min(self.cursor, len(rows) - 1))
        self.virtual_size = Size(self._width, len(rows) + 1)
        self.refresh()

    @property
    def cursor_engine(self) -> int | None:
        """The engine under the cursor (``None`` when there are no rows)."""
        return self.rows[self.cursor].engine_id if self.rows else None

    # -- drawing -----------------------------------------------------------------------------
    def _cell_line(self, row: EngineRow) -> str:
        return "".join(f" {c[:w]:<{w}} " for c, (_, _, w) in zip(row.cells, self.columns,
                                                                  strict=False))

    def render_line(self, y: int) -> Strip:
        """Line ``y`` of the widget: the header, or the row scrolled there."""
        scroll_x, scroll_y = self.scroll_offset
        width = self.scrollable_content_region.width
        base = self.rich_style
        if y == 0:
            style = base + self.get_component_rich_style("engine-table--header")
            text = self._header
        else:
            i = scroll_y + y - 1
            if i >= len(self.rows):
                return Strip.blank(width, base)
            row = self.rows[i]
            style = base + self._class_styles.get(row.cls, Style())
            if i == self.cursor:
                style += self.get_component_rich_style("engine-table--cursor")
            if row.node_style:  # the node's cell in its grade's colour (diagnose's)
                return self._graded_line(row, style, scroll_x, width)
            text = self._cell_line(row)
        text = text.ljust(max(self._width, scroll_x + width))
        return Strip([Segment(text, style)]).crop(scroll_x, scroll_x + width)

    def _graded_line(self, row: EngineRow, style: Style, scroll_x: int, width: int) -> Strip:
        """A row whose ``node`` cell is drawn in the node's grade colour."""
        graded = style + Style.parse(row.node_style)
        segments = []
        for c, (key, _, w) in zip(row.cells, self.columns, strict=False):
            segments.append(Segment(f" {c[:w]:<{w}} ", graded if key == "node" else style))
        pad = max(self._width, scroll_x + width) - self._width
        if pad > 0:
            segments.append(Segment(" " * pad, style))
        return Strip(segments).crop(scroll_x, scroll_x + width)

    # -- moving ------------------------------------------------------------------------------
    def _show_cursor(self) -> None:
        top = self.scroll_offset.y
        visible = max(1, self.scrollable_content_region.height - 1)
        if self.cursor < top:
            self.scroll_to(y=self.cursor, animate=False)
        elif self.cursor >= top + visible:
            self.scroll_to(y=self.cursor - visible + 1, animate=False)
        self.refresh()

    def action_cursor(self, step: int) -> None:
        """Move the cursor ``step`` rows."""
        if self.rows:
            self.cursor = max(0, min(len(self.rows) - 1, self.cursor + step))
            self._show_cursor()

    def action_page(self, direction: int) -> None:
        """Move the cursor a screenful."""
        self.action_cursor(direction * max(1, self.scrollable_content_region.height - 1))

    def on_click(self, event: events.Click) -> None:
        """A header click sorts; a row click moves the cursor there."""
        if event.y == 0:
            x = event.x + self.scroll_offset.x
            edge = 0
            for key, _, w in self.columns:
                edge += w + 2
                if x < edge:
                    self.post_message(self.HeaderClicked(key))
                    return
            return
        i = self.scroll_offset.y + event.y - 1
        if 0 <= i < len(self.rows):
            self.cursor = i
            self.refresh()
