"""docs/metrics.md is generated from the one metrics table and must not drift from it."""

from pathlib import Path

from dualpath_cli.telemetry.docs import render_metrics_doc
from dualpath_cli.telemetry.metrics import METRICS

DOC = Path(__file__).resolve().parents[1] / "docs" / "metrics.md"


def test_metrics_doc_is_current() -> None:
    assert DOC.read_text(encoding="utf-8") == render_metrics_doc(), (
        "docs/metrics.md is stale: run python -m dualpath_cli.telemetry.docs docs/metrics.md")


def test_every_metric_has_a_row() -> None:
    text = DOC.read_text(encoding="utf-8")
    for metric in METRICS:
        assert f"| `{metric.name}` | {metric.type.value} |" in text
