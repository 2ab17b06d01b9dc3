"""Telemetry adapters: the one metrics table and the in-process registry that records it."""

from dualpath_cli.telemetry.metrics import METRICS, MetricSpec, MetricType, spec
from dualpath_cli.telemetry.registry import (
    REGISTRY,
    Counter,
    Gauge,
    Histogram,
    MetricsRegistry,
)

__all__ = [
    "METRICS",
    "MetricSpec",
    "MetricType",
    "spec",
    "REGISTRY",
    "MetricsRegistry",
    "Counter",
    "Gauge",
    "Histogram",
]
