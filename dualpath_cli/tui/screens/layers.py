"""The layers screen: per-layer cache hits by tier as a heat map, and load-ahead slack.

The table is diagnose's ``layer_table`` over the window (blocks each tier served per layer,
median and worst slack); a layer whose median slack is below the rules' bubble tolerance is
marked ``late`` in words as well as colour.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import DataTable, Static

from dualpath_cli.telemetry.view import NA
from dualpath_cli.tui.format import shade
from dualpath_cli.tui.screens.base import CockpitScreen
from dualpath_cli.tui.source import Frame

__all__ = ["LayersScreen", "HEAT"]

#: Heat-map cell styles per tier, from an empty share to a full one (five steps); the
#: percentage is always printed in the cell, so the colour only repeats it.
HEAT = {
    "dram": ("", "on dark_green", "on green4", "bold on green3", "bold black on green1"),
    "store": ("", "on dark_blue", "on blue3", "bold on dodger_blue2",
              "bold black on deep_sky_blue1"),
    "peer": ("", "on purple4", "on magenta3", "bold on magenta2", "bold black on magenta1"),
}


def _ms(v: float | None) -> str:
    return NA if v is None else f"{v * 1e3:+.2f} ms"


class LayersScreen(CockpitScreen):
    """Heat map table and a legend."""

    NAME = "layers"
    DEFAULT_CSS = """
    LayersScreen #layers { height: 1fr; }
    LayersScreen #legend { height: auto; background: $panel; }
    """

    def body(self) -> ComposeResult:
        table: DataTable[str | Text] = DataTable(id="layers", cursor_type="row")
        for key, label, width in (("layer", "layer", 5), ("blocks", "blocks", 8),
                                  ("dram", "DRAM hit", 9), ("store", "store read", 10),
                                  ("peer", "peer (DE)", 9), ("slack", "slack median", 13),
                                  ("worst", "slack worst", 12), ("late", "", 6)):
            table.add_column(label, key=key, width=width)
        yield table
        yield Static("share of each layer's Layer Blocks by tier over the window (darker: "
                     "more); slack: how long a layer's KV was ready before its compute "
                     "(negative: compute waited, a bubble)", id="legend", markup=False)

    def show_body(self, frame: Frame) -> None:
        from dualpath_cli.diagnose.thresholds import BUBBLE_TOLERANCE_S
        from dualpath_cli.tui.format import layer_rows

        table = self.query_one("#layers", DataTable)
        table.clear()
        ascii_only = self.top.ascii_only
        rows = layer_rows(frame.history)
        for r in rows:
            total = r["dram"] + r["store"] + r["peer"]
            cells: list[str | Text] = [str(r["layer"]), str(total)]
            for tier in ("dram", "store", "peer"):
                share = r[f"{tier}_share"]
                text = shade(share, ascii_only)
                if share is None or ascii_only:
                    cells.append(text)
                else:
                    cells.append(Text(text, style=HEAT[tier][int(share * 4 + 0.5)]))
            slack = r["slack_s"]
            late = (slack is not None and slack < -BUBBLE_TOLERANCE_S and r["layer"] > 0)
            cells += [_ms(slack), _ms(r["worst_slack_s"]),
                      Text("late", style="bold red") if late else ""]
            table.add_row(*cells, key=str(r["layer"]))
        if not rows:
            table.add_row(NA, "", "", "", "", "no layer served yet", "", "")
