"""Render docs/metrics.md from the one metrics table, so the reference cannot drift.

``python -m dualpath_cli.telemetry.docs docs/metrics.md`` rewrites the file;
tests/test_metrics_docs.py fails when the file and :data:`METRICS` disagree.
"""

from __future__ import annotations

import sys
from pathlib import Path

from dualpath_cli.telemetry.metrics import METRICS, MetricSpec

__all__ = ["render_metrics_doc"]

_INTRO = """\
# Metrics

Every metric the project records is defined once, in `dualpath_cli/telemetry/metrics.py`
(`METRICS`). This page is generated from that table
(`python -m dualpath_cli.telemetry.docs docs/metrics.md`) and a test fails when they differ.

Conventions follow Prometheus: the `dualpath_` prefix, base units (bytes, seconds, ratios
from 0 to 1, tokens), `_total` for counters, and identities (engine, node, role, layer, tier,
nic) as labels rather than parts of names.
"""


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _row(metric: MetricSpec) -> str:
    labels = ", ".join(f"`{label}`" for label in metric.labels) or "-"
    unit = metric.unit or "count"
    return (f"| `{metric.name}` | {metric.type.value} | {unit} | {labels} | "
            f"{_cell(metric.help)} |")


def render_metrics_doc() -> str:
    """The whole docs/metrics.md text."""
    lines = [_INTRO, "| name | type | unit | labels | meaning |", "|---|---|---|---|---|"]
    lines += [_row(m) for m in METRICS]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    """Write the rendered page to the path given (default docs/metrics.md)."""
    target = Path(argv[0]) if argv else Path("docs/metrics.md")
    target.write_text(render_metrics_doc(), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
