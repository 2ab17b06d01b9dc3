"""A real Prometheus server scrapes a real cluster's /metrics and answers queries about it.

The cluster is the real thing: engine processes over ZeroMQ and a PosixStore in tmp_path.
Prometheus (Debian package ``prometheus``) runs on a free loopback port with a temporary
config scraping every second and temporary storage, and is stopped (by pid) at the end.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from dualpath_cli.api.app import create_app
from dualpath_cli.api.auth import TokenAuth
from dualpath_cli.api.listen import free_port
from dualpath_cli.api.server import ServerThread
from dualpath_cli.runtime.options import RuntimeOptions
from dualpath_cli.services.live import LiveCluster
from dualpath_cli.telemetry.gpu import UnavailableGpu

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(  # e2e: Prometheus and an API server
    not os.access(PROMETHEUS, os.X_OK),
    reason="prometheus is not installed (Debian package prometheus; CI installs it)")]


def _wait(what: str, check: Any, timeout: float, proc: subprocess.Popen[bytes],
          log: Path) -> Any:
    """Poll ``check()`` until it returns something truthy (Prometheus has no push event)."""
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"prometheus exited ({proc.returncode}) while waiting for "
                                 f"{what}: {log.read_text()[-2000:]}")
        try:
            got = check()
        except httpx.HTTPError:
            got = None
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}: {log.read_text()[-2000:]}")
        time.sleep(0.2)


@pytest.fixture()
def prometheus_for(tmp_path: Path) -> Iterator[Any]:
    procs: list[subprocess.Popen[bytes]] = []

    def start(target: str) -> tuple[str, subprocess.Popen[bytes], Path]:
        port = free_port()
        cfg = tmp_path / "prometheus.yml"
        cfg.write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            "scrape_configs:\n  - job_name: dualpath\n    scrape_interval: 1s\n"
            f"    scrape_timeout: 1s\n    static_configs:\n      - targets: ['{target}']\n")
        log = tmp_path / "prometheus.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [PROMETHEUS, f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path)
        procs.append(proc)
        return f"http://127.0.0.1:{port}", proc, log

    yield start
    for proc in procs:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(5)
        assert proc.returncode is not None


def _query(base: str, promql: str) -> list[dict[str, Any]]:
    resp = httpx.get(f"{base}/api/v1/query", params={"query": promql}, timeout=5)
    resp.raise_for_status()
    body = resp.json()
    assert body["status"] == "success", body
    return list(body["data"]["result"])


def test_prometheus_scrapes_a_process_cluster_and_answers_queries(
        tmp_path: Path, prometheus_for: Any) -> None:
    opts = RuntimeOptions(policy="dualpath", block_tokens=8, processes=True,
                          store_dir=tmp_path / "store", heartbeat_timeout=30.0)  # loaded CI
    live = LiveCluster(opts)
    live.start()
    try:
        auth = TokenAuth.generate(tmp_path / "token")
        app = create_app(live, auth, gpu=UnavailableGpu("test host"))
        with ServerThread(app) as server:
            ctx: list[int] = []
            for t in range(2):  # turn 2 hits turn 1's blocks: latency, decisions, hits
                prompt = ctx + [(i * 7 + t) % 250 + 1 for i in range(40 if t == 0 else 12)]
                ticket = live.submit(prompt, 3, "prom")
                ctx = prompt + list(ticket.wait(60).tokens)
                live.done(ticket)
            target = server.url.removeprefix("http://")
            base, proc, log = prometheus_for(target)
            _wait("prometheus ready",
                  lambda: httpx.get(f"{base}/-/ready", timeout=2).status_code == 200,
                  60, proc, log)

            def scraped_a_few_times() -> list[dict[str, Any]]:
                # successful scrapes (up=1); on a loaded CI host one may miss the 1 s timeout
                got = _query(base, 'sum_over_time(up{job="dualpath"}[1m])')
                return got if got and float(got[0]["value"][1]) >= 3 else []

            _wait("three successful scrapes", scraped_a_few_times, 90, proc, log)
            targets = httpx.get(f"{base}/api/v1/targets", timeout=5).json()
            active = targets["data"]["activeTargets"]
            assert [t["scrapeUrl"] for t in active] == [f"{server.url}/metrics"], active
            ready = _query(base, "dualpath_cluster_ready")
            assert [r["value"][1] for r in ready] == ["1"]
            engines = _query(base, "sum(dualpath_engine_up)")
            assert float(engines[0]["value"][1]) == 3
            names = {r["metric"]["__name__"] for r in _query(base, '{__name__=~"dualpath_.+"}')}
            for family in ("dualpath_engine_up", "dualpath_ttft_seconds_bucket",
                           "dualpath_scheduler_decisions_total", "dualpath_hbm_usage_bytes",
                           "dualpath_layer_cache_hits_total", "dualpath_gpu_available",
                           "dualpath_host_memory_total_bytes"):
                assert family in names, (family, sorted(names))
            assert _query(base, "dualpath_gpu_available")[0]["value"][1] == "0"
            decided = _query(base, "sum(dualpath_scheduler_decisions_total)")
            assert float(decided[0]["value"][1]) >= 2
    finally:
        live.drain(10)
    assert all(not pid_alive(pid) for pid in _engine_pids(live))


def _engine_pids(live: LiveCluster) -> list[int]:
    pids = getattr(live.system.cluster, "pids", None)
    return list(pids().values()) if callable(pids) else []


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
