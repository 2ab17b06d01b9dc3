"""One quadrant of the NIC screen: a role's storage or compute NIC over time.

Why a widget: the four quadrants (PE/DE x storage/compute NIC) are the same picture of
different data: the role's mean utilisation as a sparkline, the Max/Avg imbalance across its
nodes now, and each node's utilisation with its own trend.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, Label, Sparkline, Static

from dualpath_cli.tui.format import GRADE_MARKS, Quadrant, graded_name, pct, sparkline

__all__ = ["QuadrantView"]

#: Characters of each node's trend column.
TREND_WIDTH = 20


class QuadrantView(Vertical):
    """Title with Max/Avg, the mean sparkline, the nodes' table."""

    DEFAULT_CSS = """
    QuadrantView { border: round $primary; height: 1fr; width: 1fr; }
    QuadrantView > Label { width: 1fr; text-style: bold; }
    QuadrantView > Sparkline { height: 2; margin: 0 1; }
    QuadrantView > Static.spark { height: 1; margin: 0 1; }
    QuadrantView > DataTable { height: 1fr; }
    """

    def __init__(self, title: str, ascii_only: bool, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.title_text = title
        self.ascii_only = ascii_only

    def compose(self) -> ComposeResult:
        yield Label(self.title_text, classes="title")
        if self.ascii_only:
            yield Static("", classes="spark", markup=False)
        else:
            yield Sparkline([], summary_function=max)
        table: DataTable[str] = DataTable(cursor_type="row", show_cursor=False,
                                          zebra_stripes=False)
        table.add_column("node", key="node", width=5)
        table.add_column("util", key="util", width=5)
        table.add_column("trend", key="trend", width=TREND_WIDTH)
        yield table

    def show(self, q: Quadrant) -> None:
        """Render one quadrant's data."""
        ratio = "n/a" if q.max_avg is None else f"{q.max_avg:.2f}"
        now = q.mean[-1] if q.mean else None
        self.query_one(Label).update(f"{q.title}  mean {pct(now)}  Max/Avg {ratio}")
        series = [v if v is not None else 0.0 for v in q.mean]
        if self.ascii_only:
            width = max(4, self.size.width - 4)
            self.query_one(".spark", Static).update(sparkline(q.mean, width, True, top=1.0))
        else:
            self.query_one(Sparkline).data = series or [0.0]
        table = self.query_one(DataTable)
        table.clear()
        for i, (name, util, trend) in enumerate(q.nodes):
            grade = q.grades[i] if i < len(q.grades) else None
            style = GRADE_MARKS[grade][1] if grade in GRADE_MARKS else ""
            table.add_row(Text(graded_name(name, grade), style=style), pct(util),
                          sparkline(trend, TREND_WIDTH, self.ascii_only, top=1.0), key=name)
