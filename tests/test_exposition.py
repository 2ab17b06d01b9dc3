"""Prometheus exposition: from the table, merged right, "not available" left out, promtool-clean."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dualpath_cli.api.render_bench import synthetic_view
from dualpath_cli.telemetry.exposition import VIEW_FAMILIES, render_prometheus
from dualpath_cli.telemetry.gpu import FakeGpuBackend, GpuDevice, UnavailableGpu
from dualpath_cli.telemetry.host import HostFacts, NicCounters, host_facts
from dualpath_cli.telemetry.metrics import METRICS, spec
from dualpath_cli.telemetry.registry import MetricsRegistry

PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _value(text: str, name: str, **labels: object) -> float:
    key = (name, tuple(sorted((k, str(v)) for k, v in labels.items())))
    return _samples(text)[key]


def _engine_registry(node: int, eid: int, hits: int, misses: int, ratio: float,
                     shaped: float, latency: list[float]) -> dict:
    r = MetricsRegistry()
    r.counter("dualpath_storage_read_bytes_total", node=node, role="prefill").inc(100 * eid)
    r.counter("dualpath_storage_cache_hits_total", node=node, tier="dram").inc(hits)
    r.counter("dualpath_storage_cache_misses_total", node=node, tier="dram").inc(misses)
    r.gauge("dualpath_storage_cache_hit_ratio", node=node, tier="dram").set(0.99)  # stale
    r.gauge("dualpath_prefetch_accuracy_ratio", node=node).set(ratio)
    r.gauge("dualpath_storage_shaped_bandwidth_bytes_per_second", node=node).set(shaped)
    r.gauge("dualpath_storage_reads_in_flight", node=node).set(eid + 1)
    r.histogram("dualpath_storage_read_latency_seconds", node=node, tier="store"
                ).observe_many(latency)
    r.gauge("dualpath_flops_achieved_flops_per_second", engine=eid, role="prefill").set(1e12)
    r.gauge("dualpath_storage_store_bytes", root='/srv/"kv"\\x').set(4096)
    # the view has these: the registry's copies must not be printed twice
    r.gauge("dualpath_hbm_usage_bytes", engine=eid).set(123)
    return {"role": "prefill", "node": node, "alive": True, "age_s": 0.1,
            "metrics": r.snapshot()}


def _scheduler_registry() -> dict:
    r = MetricsRegistry()
    for name in ("dualpath_ttft_seconds", "dualpath_tpot_seconds"):
        try:
            r.histogram(name).observe_many([0.002, 0.03])
        except KeyError:  # the scheduler's rows are not in the table yet
            pass
    return r.snapshot()


def _page(**kw: object) -> str:
    view = synthetic_view(1, 2, 2, layers=2)
    engines = {0: _engine_registry(0, 0, hits=30, misses=10, ratio=0.2, shaped=5e9,
                                   latency=[1e-4, 0.2]),
               1: _engine_registry(0, 1, hits=10, misses=50, ratio=0.6, shaped=7e9,
                                   latency=[3e-3])}
    args: dict = {"engine_metrics": engines, "scheduler_metrics": _scheduler_registry(),
                  "host": host_facts(), "gpu": FakeGpuBackend(
                      (GpuDevice(0, "H200", "GPU-0", 0.25, 2**30, 2**37),)).report()}
    args.update(kw)
    return render_prometheus(view, **args)  # type: ignore[arg-type]


def test_promtool_accepts_the_page() -> None:
    if not shutil.which(PROMTOOL):
        pytest.skip("promtool is not installed (Debian package prometheus)")
    text = _page()
    done = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == "" and done.stderr.strip() == ""  # no lint warnings either


def test_every_family_comes_from_the_table_with_its_help_type_and_unit() -> None:
    text = _page()
    by_name = {m.name: m for m in METRICS}
    families = list(text_string_to_metric_families(text))
    assert families
    for fam in families:
        name = fam.name if fam.name in by_name else fam.name + "_total"
        metric = by_name[name]
        assert fam.type == metric.type.value
        assert fam.documentation == metric.help
        assert f"# TYPE {metric.name} {metric.type.value}\n" in text
        if metric.unit:
            assert f"# UNIT {metric.name} {metric.unit}\n" in text
        for s in fam.samples:
            assert set(s.labels) - {"le"} == set(metric.labels), (metric.name, s.labels)
    for name in ("dualpath_snic_utilization_ratio", "dualpath_storage_read_queue_length",
                 "dualpath_storage_cache_hit_ratio", "dualpath_gpu_utilization_ratio",
                 "dualpath_hbm_usage_bytes", "dualpath_hbm_fragmentation_ratio",
                 "dualpath_prefetch_accuracy_ratio", "dualpath_layer_cache_hits_total",
                 "dualpath_nic_bytes_total", "dualpath_host_cpus",
                 "dualpath_host_nic_bytes_total", "dualpath_gpu_available"):
        assert f"\n{name}" in text, name


def test_engines_of_one_node_are_merged_by_the_rules() -> None:
    text = _page()
    # counters add up across the node's engines
    assert _value(text, "dualpath_storage_cache_hits_total", node=0, tier="dram") == 40
    # the hit ratio is recomputed from the merged counts (not the engines' stale 0.99)
    assert _value(text, "dualpath_storage_cache_hit_ratio", node=0, tier="dram") == 40 / 100
    # ratio gauges: the mean; configured bandwidth: the max; other gauges: the sum
    assert _value(text, "dualpath_prefetch_accuracy_ratio", node=0) == pytest.approx(0.4)
    assert _value(text, "dualpath_storage_reads_in_flight", node=0) == 3
    # histograms add bucket by bucket
    assert _value(text, "dualpath_storage_read_latency_seconds_count", node=0,
                  tier="store") == 3
    assert _value(text, "dualpath_storage_read_latency_seconds_bucket", node=0, tier="store",
                  le="0.0001") == 1
    assert _value(text, "dualpath_storage_read_latency_seconds_bucket", node=0, tier="store",
                  le="0.005") == 2
    assert _value(text, "dualpath_storage_read_latency_seconds_sum", node=0,
                  tier="store") == pytest.approx(0.2031)
    # per-engine families stay per engine
    assert _value(text, "dualpath_flops_achieved_flops_per_second", engine=1,
                  role="prefill") == 1e12


def test_the_view_wins_for_its_families_and_is_printed_once() -> None:
    text = _page()
    view = synthetic_view(1, 2, 2, layers=2)
    assert _value(text, "dualpath_hbm_usage_bytes", engine=0) == view.engines[0].hbm_used_bytes
    assert text.count('dualpath_hbm_usage_bytes{engine="0"}') == 1
    assert text.count("# TYPE dualpath_hbm_usage_bytes gauge") == 1
    # the view's node-level read bytes, not the engine registries' sum
    assert _value(text, "dualpath_storage_read_bytes_total", node=0,
                  role="prefill") == view.nodes[0].storage_read_bytes
    assert len(VIEW_FAMILIES) == len({spec(n).name for n in VIEW_FAMILIES})
    # per role: the decode engines' layer-1 store hits summed (engines x layers would be a
    # cardinality the size of the cluster times the model's depth)
    decode = [e for e in view.engines if e.role == "decode"]
    assert len(decode) > 1
    assert _value(text, "dualpath_layer_cache_hits_total", role="decode", layer=1,
                  tier="store") == sum(e.layers[1].store for e in decode)
    assert 'dualpath_layer_cache_hits_total{engine=' not in text
    assert _value(text, "dualpath_scheduler_threshold_tokens", threshold="alpha",
                  source="config") == 200_000
    assert _value(text, "dualpath_cluster_ready") == 1


def test_not_available_is_left_out_never_a_number() -> None:
    view = synthetic_view(1, 1, 1, layers=1)
    starting = dataclasses.replace(view.engines[0], state="starting", hbm_used_bytes=None,
                                   hbm_fragmentation=None, gpu_utilization=None,
                                   heartbeat_age_s=None)
    node = dataclasses.replace(view.nodes[0], snic_utilization=None)
    view = dataclasses.replace(view, state="starting", engines=(starting, *view.engines[1:]),
                               nodes=(node, *view.nodes[1:]))
    text = render_prometheus(view, gpu=UnavailableGpu("no driver").report())
    assert 'dualpath_hbm_usage_bytes{engine="0"}' not in text
    assert 'dualpath_gpu_utilization_ratio{engine="0"' not in text
    assert 'dualpath_snic_utilization_ratio{node="0"}' not in text
    assert 'dualpath_engine_up{engine="0",node="0",role="prefill"} 0' in text
    assert "\ndualpath_cluster_ready 0\n" in text
    assert "\ndualpath_gpu_available 0\n" in text
    assert "dualpath_gpu_memory_used_bytes" not in text
    assert "nan" not in text.lower()
    # NaN in a registry is "not available" too
    r = MetricsRegistry()
    r.gauge("dualpath_storage_reads_in_flight", node=5).set(float("nan"))
    r.gauge("dualpath_storage_reads_in_flight", node=6).set(2)
    text = render_prometheus(None, engine_metrics={0: r.snapshot()})
    assert 'node="5"' not in text and 'dualpath_storage_reads_in_flight{node="6"} 2' in text


def test_labels_are_escaped_and_gpu_facts_come_from_the_backend() -> None:
    text = _page()
    assert 'dualpath_storage_store_bytes{root="/srv/\\"kv\\"\\\\x"} 8192' in text
    assert _value(text, "dualpath_storage_store_bytes", root='/srv/"kv"\\x') == 8192
    assert _value(text, "dualpath_gpu_available") == 1
    assert _value(text, "dualpath_gpu_device_utilization_ratio", gpu=0, model="H200") == 0.25
    assert _value(text, "dualpath_gpu_memory_total_bytes", gpu=0) == 2**37


def test_host_facts_are_rendered_as_counters_per_device() -> None:
    host = HostFacts(cpu_count=2, cpu_utilization=0.5, memory_total_bytes=100,
                     memory_used_bytes=40, memory_available_bytes=60,
                     nics=(NicCounters("eth0", 10, 20, 1, 2, 3, 4),))
    text = render_prometheus(None, host=host)
    assert _value(text, "dualpath_host_nic_bytes_total", device="eth0", direction="tx") == 10
    assert _value(text, "dualpath_host_nic_bytes_total", device="eth0", direction="rx") == 20
    assert _value(text, "dualpath_host_nic_errors_total", device="eth0", direction="rx") == 1
    assert _value(text, "dualpath_host_nic_drops_total", device="eth0", direction="tx") == 4
    assert _value(text, "dualpath_host_memory_used_bytes") == 40
    assert _value(text, "dualpath_host_cpu_utilization_ratio") == 0.5
    real = host_facts()
    assert real.memory_total_bytes > 0 and real.cpu_count >= 1
    assert any(n.device == "lo" for n in real.nics)


def test_unknown_registry_metrics_are_dropped() -> None:
    snap = {"dualpath_from_a_newer_engine": [{"labels": {}, "value": 1.0}]}
    assert render_prometheus(None, engine_metrics={0: snap}) == ""


class _StubNvml:
    """Stands in for the pynvml module: two devices, the second's memory query fails."""

    class NVMLError(Exception):
        pass

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:  # NVML's names
        return i

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return b"NVIDIA H200"

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return f"GPU-{h}"

    def nvmlDeviceGetUtilizationRates(self, h: int) -> object:
        return type("Rates", (), {"gpu": 40 + h, "memory": 0})()

    def nvmlDeviceGetMemoryInfo(self, h: int) -> object:
        if h == 1:
            raise self.NVMLError("Not Supported")
        return type("Mem", (), {"used": 2**30, "total": 2**37, "free": 2**37 - 2**30})()


def test_nvml_backend_reports_devices_and_leaves_out_what_the_driver_does_not_say() -> None:
    from dualpath_cli.telemetry.gpu import NvmlBackend, detect_gpu_backend

    report = NvmlBackend(_StubNvml(), 2).report()
    assert report.available and report.backend == "nvml"
    assert [(d.index, d.name, d.uuid, d.utilization) for d in report.devices] == [
        (0, "NVIDIA H200", "GPU-0", 0.40), (1, "NVIDIA H200", "GPU-1", 0.41)]
    assert report.devices[1].memory_total_bytes is None
    text = render_prometheus(None, gpu=report)
    assert _value(text, "dualpath_gpu_memory_used_bytes", gpu=0) == 2**30
    assert 'dualpath_gpu_memory_used_bytes{gpu="1"}' not in text
    assert _value(text, "dualpath_gpu_device_utilization_ratio", gpu=1,
                  model="NVIDIA H200") == 0.41
    # on this host: NVML when a driver is present, else an explicit "not available"
    probed = detect_gpu_backend().report()
    assert probed.available or (probed.reason and not probed.devices)
