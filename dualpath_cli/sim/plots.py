"""Charts of simulator results: a PNG (matplotlib, Agg) and a terminal chart (plotext).

A thin presentation layer over :class:`SimResult`, two charts each drawn both ways:

* a comparison of policies (``sim compare``): :func:`compare_panels` picks what it carries
  (offline: JCT and storage-NIC Max/Avg; online: TTFT and TPOT against the SLO, trajectory
  time, Max/Avg);
* one run's storage-NIC reads over time (``sim run``), GB/s per node and time bin, prefill
  nodes (P0..) solid and blue, decode nodes (D0..) dashed and orange: where DualPath's
  balance, or basic's idle decode-side NICs, can be seen rather than read off one ratio.

matplotlib and plotext are imported on first use so that ``dualpath`` starts as fast
without them; no display is needed (matplotlib's ``Figure`` with the Agg canvas, no pyplot).
A PNG is rendered in memory and written atomically: a failed write never leaves half a file.
"""

from __future__ import annotations

import io
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dualpath_cli.atomicio import atomic_write_bytes
from dualpath_cli.errors import UsageError
from dualpath_cli.sim.metrics import SimResult, SnicSeries
from dualpath_cli.sim.online import SLO
from dualpath_cli.units import format_bandwidth, format_duration

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["Panel", "compare_panels", "check_png_path", "write_compare_png",
           "render_compare_terminal", "write_series_png", "render_series_terminal",
           "SERIES_NODE_LINES"]

#: Above this many nodes the terminal chart draws each role's max and mean, not every node.
SERIES_NODE_LINES = 16
_PNG_LEGEND_NODES = 12  # above this, the PNG's legend names the roles, not every node


@dataclass(frozen=True, slots=True)
class Panel:
    """One bar chart: a value per policy (NaN: no value), its label, an optional limit."""

    title: str
    policies: tuple[str, ...]
    values: tuple[float, ...]
    labels: tuple[str, ...]
    limit: float | None = None


def _panel(title: str, results: Sequence[SimResult], values: list[float], fmt: str,
           limit: float | None = None) -> Panel:
    labels = tuple("-" if math.isnan(v) else (format_duration(v) if fmt == "duration"
                                              else format(v, fmt)) for v in values)
    return Panel(title, tuple(r.policy for r in results), tuple(values), labels, limit)


def _stat(result: SimResult, name: str) -> float:
    stats = getattr(result, name)
    return float(stats.mean) if stats is not None else float("nan")


def compare_panels(results: Sequence[SimResult], slo: SLO | None = None) -> list[Panel]:
    """The panels a policy comparison shows; online results get latency panels."""
    if not results:
        raise UsageError("nothing to plot: no results")
    slo = slo or SLO()
    snic = _panel("storage-NIC Max/Avg (1.0 = balanced)", results,
                  [r.snic_max_avg for r in results], ".2f")
    if any(r.mode != "online" for r in results):
        return [_panel("JCT, s (when the last agent finishes)", results,
                       [r.jct for r in results], "duration"), snic]
    return [
        _panel(f"TTFT mean, s (SLO {slo.ttft_s:g} s)", results,
               [_stat(r, "ttft") for r in results], ".3f", slo.ttft_s),
        _panel(f"TPOT mean, ms (SLO {slo.tpot_s * 1e3:g} ms)", results,
               [_stat(r, "tpot") * 1e3 for r in results], ".1f", slo.tpot_s * 1e3),
        _panel("mean trajectory time, s", results,
               [r.jct for r in results], "duration"),
        snic,
    ]


def check_png_path(path: Path) -> Path:
    """``path`` if a PNG can be written there, else a one-line :class:`UsageError`.

    Checked before any simulation runs, so a typo does not cost a whole run.
    """
    if path.suffix.lower() != ".png":
        raise UsageError(f"{path}: plot file must end in .png")
    if path.is_dir():
        raise UsageError(f"{path}: is a directory, not a .png file")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise UsageError(f"{path}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise UsageError(f"{path}: directory {parent} is not writable")
    return path


def write_compare_png(results: Sequence[SimResult], path: Path, title: str,
                      slo: SLO | None = None) -> int:
    """Draw :func:`compare_panels` two to a row into ``path``; returns the bytes written."""
    panels = compare_panels(results, slo)
    cols = min(2, len(panels))
    rows_of_panels = math.ceil(len(panels) / cols)
    height = rows_of_panels * (0.9 + 0.45 * len(results)) + 0.4
    fig = _new_figure(4.6 * cols, height)
    axes = fig.subplots(rows_of_panels, cols, squeeze=False).ravel()
    for spare in axes[len(panels):]:
        spare.set_visible(False)
    for ax, panel in zip(axes[:len(panels)], panels, strict=True):
        rows = list(range(len(panel.policies)))[::-1]  # first policy on top
        values = [0.0 if math.isnan(v) else v for v in panel.values]
        bars = ax.barh(rows, values, color="#4c72b0")
        ax.set_yticks(rows, panel.policies)
        ax.bar_label(bars, labels=list(panel.labels), padding=3, fontsize=8)
        if panel.limit is not None:
            ax.axvline(panel.limit, color="#c44e52", linestyle="--", linewidth=1)
        ax.set_title(panel.title, fontsize=9)
        ax.margins(x=0.25)
        ax.tick_params(labelsize=8)
    fig.suptitle(title, fontsize=10)
    return _save_png(fig, path)


def _new_figure(width: float, height: float) -> Figure:
    """A pyplot-free figure on the Agg canvas (no display, no global state)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save_png(fig: Figure, path: Path) -> int:
    """Render ``fig`` in memory, then replace ``path`` atomically; returns the bytes written."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, metadata={"Software": None})
    data = buffer.getvalue()
    try:
        atomic_write_bytes(path, data)
    except OSError as err:
        raise UsageError(f"{path}: cannot write: {err.strerror or err}") from None
    return len(data)


def render_compare_terminal(results: Sequence[SimResult], title: str, width: int = 100,
                            color: bool = False, slo: SLO | None = None) -> str:
    """The same panels as horizontal bar charts in text, one under the other."""
    import plotext as plt

    width = max(40, min(width, 120))
    blocks = [title]
    for panel in compare_panels(results, slo):
        names = [f"{p} {label}" for p, label in zip(panel.policies, panel.labels, strict=True)]
        values = [0.0 if math.isnan(v) else v for v in panel.values]
        plt.clear_figure()
        plt.bar(names[::-1], values[::-1], orientation="h", width=0.5)
        if panel.limit is not None:
            plt.vline(panel.limit)
        plt.title(panel.title)
        plt.plotsize(width, 2 * len(names) + 4)
        plt.theme("clear")
        text = plt.build()
        blocks.append(text if color else plt.uncolorize(text))
    plt.clear_figure()
    return "\n".join(blocks) + "\n"


# --- one run's storage-NIC reads over time -----------------------------------------------

def _series(result: SimResult) -> SnicSeries:
    if result.snic_series is None:
        raise UsageError(f"nothing to plot: the {result.policy} run recorded no "
                         "storage-NIC series")
    return result.snic_series


def _series_title(series: SnicSeries, title: str) -> str:
    return (f"{title}: storage-NIC reads per node, GB/s per {series.bin_s:g} s "
            f"(line rate {format_bandwidth(series.line_rate)})")


def write_series_png(result: SimResult, path: Path, title: str) -> int:
    """Draw every node's storage-NIC read rate over time into ``path``; returns its size."""
    series = _series(result)
    fig = _new_figure(9.0, 4.2)
    ax = fig.subplots()
    if series.bins == 0:
        ax.text(0.5, 0.5, "no storage-NIC reads in this run", ha="center", va="center",
                transform=ax.transAxes)
    else:
        from matplotlib import colormaps
        from matplotlib.lines import Line2D

        blues, oranges = colormaps["Blues"], colormaps["Oranges"]
        prefill = [series.is_prefill(i) for i in range(len(series.nodes))]
        counts = {True: prefill.count(True), False: prefill.count(False)}
        seen = {True: 0, False: 0}
        edges = series.edges()
        per_node = len(series.nodes) <= _PNG_LEGEND_NODES
        for name, pe, row in zip(series.nodes, prefill, series.gb_per_s(), strict=True):
            # shades of one colour per role, light to dark in node order
            shade = 0.45 + 0.5 * seen[pe] / (counts[pe] - 1) if counts[pe] > 1 else 0.75
            seen[pe] += 1
            ax.stairs(row, edges, color=(blues if pe else oranges)(shade),
                      linestyle="-" if pe else "--", linewidth=1.2 if per_node else 0.7,
                      label=name if per_node else None, baseline=None)
        if per_node:
            ax.legend(fontsize=8, ncols=2 if len(series.nodes) > 6 else 1)
        else:  # one legend entry per role, not per node
            ax.legend(handles=[
                Line2D([], [], color=blues(0.75), label=f"PE nodes ({counts[True]})"),
                Line2D([], [], color=oranges(0.75), linestyle="--",
                       label=f"DE nodes ({counts[False]})")], fontsize=8)
        ax.set_xlim(0, edges[-1])
        ax.set_ylim(bottom=0)
    ax.set_xlabel("simulated time, s", fontsize=9)
    ax.set_ylabel("storage-NIC read, GB/s", fontsize=9)
    ax.tick_params(labelsize=8)
    ax.grid(alpha=0.3)
    ax.set_title(_series_title(series, title), fontsize=10)
    return _save_png(fig, path)


_PE_STYLE = (("blue", "hd"), ("cyan", "hd"), ("green", "hd"))
_DE_STYLE = (("orange", "x"), ("red", "+"), ("magenta", "o"), ("yellow", "*"))


def _terminal_lines(series: SnicSeries) -> list[tuple[str, list[float], str, str]]:
    """(label, GB/s per bin, colour, marker) per node, or per role's max and mean."""
    rates = series.gb_per_s()
    if len(series.nodes) <= SERIES_NODE_LINES:
        lines, seen = [], {True: 0, False: 0}
        for i, (name, row) in enumerate(zip(series.nodes, rates, strict=True)):
            pe = series.is_prefill(i)
            styles = _PE_STYLE if pe else _DE_STYLE
            colour, marker = styles[seen[pe] % len(styles)]
            seen[pe] += 1
            lines.append((name, row, colour, marker))
        return lines
    lines = []
    for pe, label in ((True, "PE"), (False, "DE")):
        rows = [row for i, row in enumerate(rates) if series.is_prefill(i) == pe]
        if not rows:
            continue
        styles = _PE_STYLE if pe else _DE_STYLE
        columns = list(zip(*rows, strict=True))
        lines.append((f"{label} max ({len(rows)} nodes)", [max(c) for c in columns],
                      *styles[0]))
        lines.append((f"{label} mean", [sum(c) / len(c) for c in columns], *styles[1]))
    return lines


def render_series_terminal(result: SimResult, title: str, width: int = 100,
                           color: bool = False) -> str:
    """The storage-NIC read rates over time as a text chart (per role above 16 nodes)."""
    import plotext as plt

    series = _series(result)
    head = _series_title(series, title)
    if series.bins == 0:
        return f"{head}\nno storage-NIC reads in this run\n"
    width = max(40, min(width, 160))
    times = [t + span / 2 for t, span in zip(series.times(), series.spans(), strict=True)]
    plt.clear_figure()
    for label, row, colour, marker in _terminal_lines(series):
        plt.plot(times, row, label=label, color=colour, marker=marker)
    plt.title(head)
    plt.xlabel("simulated time, s")
    plt.ylim(0, None)
    plt.plotsize(width, 22)
    plt.theme("clear")
    text = plt.build()
    plt.clear_figure()
    return (text if color else plt.uncolorize(text)) + "\n"
