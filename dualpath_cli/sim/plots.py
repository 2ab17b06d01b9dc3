"""Charts of simulator results: a PNG (matplotlib, Agg) and a terminal chart (plotext).

A thin presentation layer over :class:`SimResult`: :func:`compare_panels` picks what a
comparison of policies carries (offline: JCT and storage-NIC Max/Avg; online: TTFT and TPOT
against the SLO, trajectory time, Max/Avg), and the two renderers draw the same panels.
matplotlib and plotext are imported on first use so that ``dualpath`` starts as fast
without them; no display is needed (matplotlib's ``Figure`` with the Agg canvas, no pyplot).
"""

from __future__ import annotations

import io
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dualpath_cli.errors import UsageError
from dualpath_cli.sim.metrics import SimResult
from dualpath_cli.sim.online import SLO
from dualpath_cli.units import format_duration

__all__ = ["Panel", "compare_panels", "check_png_path", "write_compare_png",
           "render_compare_terminal"]


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
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    panels = compare_panels(results, slo)
    cols = min(2, len(panels))
    rows_of_panels = math.ceil(len(panels) / cols)
    height = rows_of_panels * (0.9 + 0.45 * len(results)) + 0.4
    fig = Figure(figsize=(4.6 * cols, height), layout="constrained")
    FigureCanvasAgg(fig)
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
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, metadata={"Software": None})
    data = buffer.getvalue()
    try:
        path.write_bytes(data)
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
