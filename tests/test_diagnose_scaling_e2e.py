"""The scaling workflow (seed 6.3, "adding nodes does not help") end to end.

Units: a prefill engine inside a batch longer than the view's window reads idle (busy time
is reported when a batch ends); the rule counts it busy when it holds unfinished requests
with nothing left to load, and not when it waits on storage or holds nothing.

End to end, one launched 1P2D (engine processes over ZeroMQ): healthy (one agent served),
``diagnose scaling`` exits 0; with six agents and the prefill engine's compute slowed 8x
(``PATCH /api/v1/faults`` slow_compute) the cluster is prefill-bound and diagnose exits 1
with a finding that names the prefill side and the P/D change with its exact commands, live
and from a recording of the same seconds. What deciding costs (the scheduler thread's CPU,
the scheduling calls' latency) is measured on the healthy cluster and judged by the rule.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from conftest import CLI, recording, run_cli, wait_for_turns, wait_until

from dualpath_cli.api.client import DualPathClient
from dualpath_cli.diagnose import thresholds
from dualpath_cli.diagnose.model import Evidence, Severity
from dualpath_cli.diagnose.workflows.scaling import role_busy, scaling
from dualpath_cli.services import statefile
from dualpath_cli.telemetry.recording import Extras, Sample

if TYPE_CHECKING:
    from conftest import Launched



def _pd_window(pe_util: float, pe_seq: int, pe_read_q: int) -> Evidence:
    """2P4D, ten samples: decode GPUs 10% busy; the PEs as given, finishing nothing."""
    from test_diagnose_rules import make_view

    def make(i: int) -> Any:
        v = make_view(i, gpu={0: pe_util, 1: pe_util, 2: 0.1, 3: 0.1, 4: 0.1, 5: 0.1},
                      seq={0: pe_seq, 1: pe_seq}, read_q={0: pe_read_q, 1: pe_read_q})
        from dataclasses import replace

        return replace(v, engines=tuple(
            replace(e, service_time_s=None) if e.role == "prefill" else e for e in v.engines))
    return Evidence([Sample(float(i), make(i), Extras()) for i in range(10)], [])


def test_a_prefill_engine_inside_a_long_batch_counts_busy() -> None:
    busy, in_batch = role_busy(_pd_window(0.0, 3, 0))
    assert busy["prefill"] == 1.0 and in_batch == 20
    (f,) = [f for f in scaling(_pd_window(0.0, 3, 0)) if f.severity]
    assert f.severity is Severity.WARNING and f.subject == "role prefill"
    assert f.evidence["suggested_pd"] == "3P3D" and "prefill-bound" in f.title
    assert "dualpath launch --pd 3P3D" in (f.action or "")
    # one request per PE, busy: nothing waits for a prefill, so no P/D change is asked for
    (lone,) = [f for f in scaling(_pd_window(1.0, 1, 0)) if "prefill GPUs" in f.title]
    assert lone.severity is Severity.OK and "none wait" in lone.title
    # waiting on storage (blocks still queued on its node) or holding nothing: idle
    for pe_seq, pe_read_q in ((3, 50_000), (0, 0)):
        busy, in_batch = role_busy(_pd_window(0.0, pe_seq, pe_read_q))
        assert busy["prefill"] == 0.0 and in_batch == 0
        assert not [f for f in scaling(_pd_window(0.0, pe_seq, pe_read_q))
                    if f.severity]


@pytest.fixture()
def cluster(launch_cluster: Callable[..., Launched], tmp_path: Path) -> tuple[str, int]:
    """A launched 1P2D: its URL and port (stopped after the test)."""
    url, port, _ = launch_cluster("--store", str(tmp_path / "store"), "--drain-timeout", "5s")
    return url, port


def _scaling(env: dict[str, str], *source: str) -> tuple[int, dict[str, Any], list[str]]:
    done = run_cli(env, "diagnose", "scaling", *source, "--json")
    assert done.stdout.strip(), done.stderr
    doc = json.loads(done.stdout)
    titles = [f"{f['severity']} {f['title']}" for r in doc["reports"] for f in r["findings"]]
    return done.returncode, doc, titles


def _bound(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for r in doc["reports"] for f in r["findings"]
            if f["severity"] in ("WARNING", "CRITICAL") and f["subject"] == "role prefill"]


def _check_scheduler_cost(client: DualPathClient, doc: dict[str, Any]) -> None:
    """What deciding costs is measured on the live cluster: the scheduler thread's CPU and
    the timed scheduling calls of both kinds are present and positive in the view and in
    /metrics, and diagnose scaling judged them with their numbers (no timing asserted)."""
    sched = client.view().scheduler
    assert sched.cpu_s is not None and sched.cpu_s > 0
    for kind in ("de_fetch", "pe_fetch"):
        hist = sched.decision_latency[kind]
        assert hist.count > 0 and hist.sum_s > 0 and hist.buckets[-1][1] <= hist.count
    text = client.metrics_text()
    cpu = [float(line.split()[-1]) for line in text.splitlines()
           if line.startswith("dualpath_scheduler_cpu_seconds_total")]
    assert cpu and cpu[0] > 0, cpu
    counts = [float(line.split()[-1]) for line in text.splitlines()
              if line.startswith("dualpath_scheduler_decision_latency_seconds_count")]
    assert len(counts) == 2 and min(counts) > 0, counts
    (cost,) = [f for r in doc["reports"] for f in r["findings"]
               if f["title"].startswith("scheduler thread")]
    e = cost["evidence"]
    assert e["scheduler_cpu_cores"] > 0 and e["requests_per_s"] > 0, cost
    assert e["cpu_s_per_decision"] > 0 and sum(e["decision_calls"].values()) > 0, cost


def test_a_slowed_prefill_engine_reads_prefill_bound_live_and_from_a_recording(
        env: dict[str, str], cluster: tuple[str, int], tmp_path: Path) -> None:
    url, port = cluster

    def bench(agents: int) -> subprocess.Popen[str]:
        return subprocess.Popen([*CLI, "bench", "--url", url, "--agents", str(agents),
                                 "--turns", "200", "--json"], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    # healthy: one agent, its turns never queue (the embedded model's prompts keep the PE
    # the busier side, but nothing waits for it); then six agents on a PE slowed 8x
    work = bench(1)
    rec = tmp_path / "prefill-bound.jsonl.gz"
    try:
        with DualPathClient.from_token_file(url, statefile.token_path(port)) as client:
            wait_for_turns(client, 4, work)  # turns flow
            code, healthy, titles = _scaling(env, "--url", url, "--window", "4s")
            assert code == 0 and not _bound(healthy), titles
            _check_scheduler_cost(client, healthy)
            work.kill()
            work.communicate(timeout=60)
            work = bench(6)

            def pe_service_s() -> float | None:
                pe = next(e for e in client.view().engines if e.role == "prefill")
                return pe.service_time_s

            # the PE's service time per request under the six agents, before the fault (a
            # base read after it could already be slowed, and then never be beaten 4x)
            wait_for_turns(client, client.view().scheduler.decisions.total + 12, work)
            base = wait_until(pe_service_s, 60, "the PE's service time under six agents",
                              pace=lambda: client.decisions(-1))
            client.set_faults(["slow_compute:engine=0,factor=8"])
            # wait (bounded) until the slowed compute shows: the PE's measured service time
            # per request several times what it was
            wait_until(lambda: (pe_service_s() or 0.0) > 4 * base, 60,
                       "the fault to slow the PE 4x", pace=lambda: client.decisions(-1))
            with recording(env, url, "6s", rec):
                live = _scaling(env, "--url", url, "--window", "6s")
            recorded = _scaling(env, "--from", str(rec))
            client.clear_faults()
    finally:
        work.kill()
        work.communicate(timeout=60)
    for code, doc, titles in (live, recorded):
        assert code in (1, 2), titles
        found = _bound(doc)
        assert len(found) == 1, titles
        f = found[0]
        assert f["evidence"]["bottleneck"] == "prefill"
        assert f["evidence"]["prefill_busy"] >= thresholds.PD_BUSY_HIGH
        assert f["evidence"]["decode_busy"] <= thresholds.PD_BUSY_LOW
        assert f["evidence"]["suggested_pd"] == "2P1D"
        assert "dualpath plan pd-ratio --pd 2P1D" in f["action"]
        assert "dualpath launch --pd 2P1D" in f["action"]
