"""The one metrics table: conventions hold, seed families exist, the registry enforces it."""

from __future__ import annotations

import threading

import pytest

from dualpath_cli.telemetry import METRICS, MetricSpec, MetricsRegistry, MetricType, spec


def test_names_are_unique_prefixed_and_follow_prometheus_conventions() -> None:
    names = [m.name for m in METRICS]
    assert len(names) == len(set(names))
    for m in METRICS:
        assert m.name.startswith("dualpath_")
        assert m.name.endswith("_total") == (m.type is MetricType.COUNTER)
        assert m.help.endswith(".") and m.help[0].isupper()
        assert all(label.isidentifier() for label in m.labels)
        # identities are labels, never baked into names
        for ident in ("prefill", "decode", "node0", "snic0"):
            assert ident not in m.name


@pytest.mark.parametrize("name", [
    # storage (issue 3)
    "dualpath_storage_read_bytes_total", "dualpath_storage_read_blocks_total",
    "dualpath_storage_read_queue_length", "dualpath_storage_read_queue_tokens",
    "dualpath_storage_read_latency_seconds", "dualpath_storage_cache_hits_total",
    "dualpath_storage_cache_misses_total", "dualpath_storage_corrupt_blocks_total",
    "dualpath_storage_shaped_bandwidth_bytes_per_second",
    "dualpath_storage_actual_bandwidth_bytes_per_second",
    # seed families
    "dualpath_snic_utilization_ratio", "dualpath_storage_cache_hit_ratio",
    "dualpath_gpu_utilization_ratio", "dualpath_attention_bubble_seconds_total",
    "dualpath_flops_achieved_flops_per_second", "dualpath_hbm_usage_bytes",
    "dualpath_hbm_fragmentation_ratio", "dualpath_prefetch_accuracy_ratio",
    "dualpath_layer_cache_hits_total", "dualpath_nic_bytes_total",
])
def test_required_metrics_exist(name: str) -> None:
    assert spec(name).name == name


def test_labels_carry_identities() -> None:
    assert spec("dualpath_storage_read_bytes_total").labels == ("node", "role")
    assert "tier" in spec("dualpath_storage_cache_hits_total").labels
    assert set(spec("dualpath_layer_cache_hits_total").labels) == {"role", "layer", "tier"}
    assert {"nic", "role"} <= set(spec("dualpath_nic_bytes_total").labels)


@pytest.mark.parametrize("kwargs,match", [
    (dict(name="storage_bytes_total", type=MetricType.COUNTER, unit="bytes"), "names are"),
    (dict(name="dualpath_x_bytes", type=MetricType.COUNTER, unit="bytes"), "_total"),
    (dict(name="dualpath_x_total", type=MetricType.GAUGE, unit=""), "_total"),
    (dict(name="dualpath_x_ms", type=MetricType.GAUGE, unit="milliseconds"), "base unit"),
    (dict(name="dualpath_x_total", type=MetricType.COUNTER, unit="bytes"), "carry its unit"),
    (dict(name="dualpath_x_seconds", type=MetricType.HISTOGRAM, unit="seconds"), "buckets"),
])
def test_spec_rejects_convention_breaks(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        MetricSpec(labels=(), help="X.", **kwargs)


def test_registry_refuses_unknown_names_labels_and_types() -> None:
    reg = MetricsRegistry()
    with pytest.raises(KeyError, match="not in the metrics table"):
        reg.counter("dualpath_made_up_total")
    with pytest.raises(ValueError, match="do not match"):
        reg.counter("dualpath_storage_read_bytes_total", node=1)
    with pytest.raises(TypeError, match="is a counter"):
        reg.gauge("dualpath_storage_read_bytes_total", node=1, role="prefill")
    with pytest.raises(ValueError, match="only goes up"):
        reg.counter("dualpath_storage_read_bytes_total", node=1, role="prefill").inc(-1)


def test_registry_records_concurrently_and_snapshots() -> None:
    reg = MetricsRegistry()
    counter = reg.counter("dualpath_storage_read_blocks_total", node=0, role="prefill")
    hist = reg.histogram("dualpath_storage_read_latency_seconds", node=0, tier="store")
    start = threading.Barrier(4)

    def work() -> None:
        start.wait()
        for _ in range(1000):
            counter.inc()
        hist.observe_many([1e-4] * 10)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert reg.value("dualpath_storage_read_blocks_total", node=0, role="prefill") == 4000
    reg.gauge("dualpath_storage_read_queue_tokens", node=0).set(640)
    snap = reg.snapshot()
    assert snap["dualpath_storage_read_queue_tokens"] == [{"labels": {"node": "0"},
                                                           "value": 640.0}]
    row = snap["dualpath_storage_read_latency_seconds"][0]
    assert row["count"] == 40 and row["buckets"]["0.0001"] == 40 and row["buckets"]["+Inf"] == 40
