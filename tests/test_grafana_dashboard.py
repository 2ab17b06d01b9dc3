"""The shipped Grafana dashboard: importable, reads only metrics of the table, and every
panel's PromQL answers with data from a real Prometheus that scraped a cluster under load.

The cluster is a real one (engine processes over ZeroMQ, a PosixStore, shaped storage NICs,
a DRAM buffer) serving agents' turns while Prometheus scrapes it every second; a panel
whose query errors or comes back empty fails the test, naming the panel.
"""

from __future__ import annotations

import json
import os
import re
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

# the Prometheus fixture and query helpers of the scrape test (tests/ is on sys.path)
from test_api_prometheus import PROMETHEUS, _query, _wait, prometheus_for  # noqa: F401

from dualpath_cli.api.app import create_app
from dualpath_cli.api.auth import TokenAuth
from dualpath_cli.api.server import ServerThread
from dualpath_cli.runtime.options import RuntimeOptions
from dualpath_cli.services.live import LiveCluster
from dualpath_cli.telemetry.gpu import UnavailableGpu
from dualpath_cli.telemetry.metrics import METRICS, MetricType

DASHBOARD = Path(__file__).resolve().parents[1] / "deploy" / "grafana" / "dualpath.json"
#: What Grafana substitutes for $__rate_interval at a 1 s scrape interval (4 x scrape,
#: at least the 15 s default floor); Prometheus needs two samples in the window.
RATE_INTERVAL = "30s"


def _dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return data


def _targets() -> list[tuple[str, str]]:
    """(panel title, expr) of every query panel."""
    return [(p["title"], t["expr"]) for p in _dashboard()["panels"] if p["type"] != "row"
            for t in p["targets"]]


def test_dashboard_is_importable() -> None:
    dash = _dashboard()
    assert dash["uid"] and dash["title"] and dash["schemaVersion"] >= 30
    inputs = {i["name"] for i in dash["__inputs"] if i["type"] == "datasource"}
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dash["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24 and pos["h"] > 0
        if panel["type"] == "row":
            continue
        assert panel["targets"], panel["title"]
        for t in panel["targets"]:
            uid = t["datasource"]["uid"]
            assert uid.startswith("${") and uid[2:-1] in inputs, panel["title"]


def test_panels_read_only_metrics_of_the_table() -> None:
    names = {m.name for m in METRICS}
    hist = {m.name for m in METRICS if m.type is MetricType.HISTOGRAM}
    used: set[str] = set()
    for title, expr in _targets():
        for name in re.findall(r"\b(dualpath_[a-z0-9_]+)", expr):
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            assert name in names or base in hist, f"{title}: {name} is not in METRICS"
            used.add(base if base in hist else name)
    seed = {"dualpath_snic_utilization_ratio", "dualpath_storage_read_queue_length",
            "dualpath_storage_cache_hit_ratio", "dualpath_gpu_utilization_ratio",
            "dualpath_attention_bubble_seconds_total",
            "dualpath_flops_achieved_flops_per_second", "dualpath_hbm_usage_bytes",
            "dualpath_hbm_fragmentation_ratio", "dualpath_prefetch_accuracy_ratio",
            "dualpath_layer_cache_hits_total", "dualpath_nic_bytes_total",
            "dualpath_kv_miss_blocks_total", "dualpath_kv_hit_tokens_total",
            "dualpath_kv_requested_tokens_total", "dualpath_kv_layer_hit_tokens_total",
            "dualpath_ttft_seconds", "dualpath_tpot_seconds",
            "dualpath_scheduler_decisions_total"}
    assert seed <= used, sorted(seed - used)


def _agents(live: LiveCluster, agents: int, turns: int, errors: list[BaseException]) -> None:
    def one(agent: int) -> None:
        try:
            ctx: list[int] = []
            for t in range(turns):
                new = [(agent * 37 + t * 11 + i * 7) % 250 + 1
                       for i in range(48 if t == 0 else 16)]
                prompt = ctx + new
                ticket = live.submit(prompt, 3, f"agent-{agent}")
                ctx = prompt + list(ticket.wait(120).tokens)
                live.done(ticket)
        except BaseException as err:  # reported by the test thread
            errors.append(err)

    threads = [threading.Thread(target=one, args=(a,)) for a in range(agents)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(300)


@pytest.mark.e2e
@pytest.mark.skipif(not os.access(PROMETHEUS, os.X_OK),
                    reason="prometheus is not installed (Debian package prometheus)")
def test_every_panel_answers_from_a_scraped_cluster_under_load(
        tmp_path: Path, prometheus_for: Any) -> None:  # noqa: F811 (the imported fixture)
    opts = RuntimeOptions(policy="round-robin", block_tokens=8, processes=True,
                          store_dir=tmp_path / "store", heartbeat_timeout=30.0,
                          snic_bw=200e6, dram_cache_bytes=8 << 20)
    live = LiveCluster(opts)
    live.start()
    try:
        auth = TokenAuth.generate(tmp_path / "token")
        app = create_app(live, auth, gpu=UnavailableGpu("test host"))
        with ServerThread(app) as server:
            base, proc, log = prometheus_for(server.url.removeprefix("http://"))
            _wait("prometheus ready",
                  lambda: httpx.get(f"{base}/-/ready", timeout=2).status_code == 200,
                  60, proc, log)
            errors: list[BaseException] = []
            _agents(live, agents=3, turns=3, errors=errors)
            assert not errors, errors

            def scraped_after_load() -> list[dict[str, Any]]:
                got = _query(base, 'sum_over_time(up{job="dualpath"}[30s])')
                done = _query(base, "sum(dualpath_scheduler_decisions_total)")
                return got if got and done and float(got[0]["value"][1]) >= 3 and \
                    float(done[0]["value"][1]) >= 9 else []

            _wait("scrapes that saw the load", scraped_after_load, 90, proc, log)
            empty = []
            for title, expr in _targets():
                promql = expr.replace("$__rate_interval", RATE_INTERVAL)
                resp = httpx.get(f"{base}/api/v1/query", params={"query": promql}, timeout=10)
                body = resp.json()
                assert resp.status_code == 200 and body["status"] == "success", \
                    f"panel {title!r}: {promql}: {body}"
                if not body["data"]["result"]:
                    empty.append(f"{title}: {promql}")
            assert not empty, "panels with no data:\n" + "\n".join(empty)
    finally:
        live.drain(10)
