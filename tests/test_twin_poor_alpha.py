"""Issue 14's twin test, end to end: record a served run with a deliberately poor alpha, ask
`dualpath tune suggest --from` for a better one, apply it live.

The cluster runs the ``seed-select`` read rule (the seed's ``select_loading_path``): a PE node
whose storage read queue exceeds alpha is not read from, so alpha decides which storage NIC
reads each prefix. (Under the paper's rule, policy ``dualpath``, alpha only classes the
fetching group's engines, which share one node's read queue, so no alpha changes a decision:
tests/test_twin.py pins that.) Alpha = 10^9 tokens reads every prefix on the PE node and
leaves the decode nodes' NICs idle; the right direction is down. Whether applying it makes
the job faster by what the twin predicts is a timing question, measured by
bench/twin_check.py. Here: the twin's replay of the suggested alpha spreads the reads over the
storage NICs (lower SNIC Max/Avg), and applied live the alpha is in force and decides every
read (a PE node whose queue exceeds it is not read from; whether a queue builds on this host
is timing, so no count of decode-side reads is asserted).

The twin's measured compute is stubbed (as in tests/test_twin.py), then calibrated to the
recording (the engines' busy time, the turns' stories: sim/twin_replay.py ``fit_world``); the
served run, the recording, the CLI and the simulator are real.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_api_server import SLOW_HOST_S

from dualpath_cli.api.app import create_app
from dualpath_cli.api.auth import TokenAuth
from dualpath_cli.api.client import DualPathClient
from dualpath_cli.api.server import ServerThread
from dualpath_cli.cli.app import main
from dualpath_cli.runtime.options import RuntimeOptions
from dualpath_cli.runtime.workloads import agentic_workload
from dualpath_cli.services import twin
from dualpath_cli.services.live import LiveCluster
from dualpath_cli.services.recording import collect, read_recording, write_recording
from dualpath_cli.services.remote_runner import run_agents_remote
from dualpath_cli.telemetry.gpu import FakeGpuBackend
from dualpath_cli.telemetry.view import Decision

pytestmark = pytest.mark.e2e  # a live cluster and its API server

POOR_ALPHA = 10**9
SNIC = 1e6  # bytes/s per node: reads queue up, as dualpath bench sizes the NICs
COMPUTE = {"flops": 3.3e9, "prefill_overhead_s": 0.002, "decode_step_s": 0.008}


@pytest.fixture(autouse=True)
def env(clean_config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(twin, "measure_compute", lambda model, context, new: dict(COMPUTE))


@pytest.fixture
def poor(tmp_path: Path) -> Iterator[tuple[LiveCluster, str, str]]:
    live = LiveCluster(RuntimeOptions(policy="seed-select", alpha=POOR_ALPHA, snic_bw=SNIC,
                                      block_tokens=16, heartbeat_timeout=SLOW_HOST_S,
                                      store_dir=tmp_path / "store"))
    live.start()
    auth = TokenAuth.generate(tmp_path / "token")
    try:
        with ServerThread(create_app(live, auth, gpu=FakeGpuBackend(()))) as server:
            yield live, server.url, auth.token
    finally:
        live.drain(30)


def serve_recorded(url: str, token: str, path: Path, seed: int) -> None:
    """Serve 4 agents x 5 turns while recording the cluster as ``dualpath record`` does
    (services/recording.collect, write_recording); the window closes after the run."""
    done = threading.Event()
    errors: list[str] = []

    def serve() -> None:
        try:
            run, _ = run_agents_remote(url, agentic_workload(4, turns=5, seed=seed),
                                       token=token, timeout=120)
            errors.extend(run.errors)
        finally:
            done.set()

    worker = threading.Thread(target=serve)
    samples = []
    decisions: list[Decision] = []
    stories: dict[int, dict[str, Any]] = {}
    with DualPathClient(url, token) as client:
        for sample in collect(client, 300.0, 0.25, decisions_out=decisions,
                              stories_out=stories):
            samples.append(sample)
            if len(samples) == 1:
                worker.start()  # after the first sample: every decision is in the window
            elif done.is_set():
                break
    worker.join(120)
    assert not errors, errors
    write_recording(path, {"source": url, "interval_s": 0.25,
                           "window_s": samples[-1].at - samples[0].at}, samples, decisions,
                    stories.values())


def suggest_json(capsys: pytest.CaptureFixture[str], path: Path) -> dict[str, Any]:
    code = main(["tune", "suggest", "--from", str(path), "--json", "--top", "30"])
    out = capsys.readouterr()
    assert code == 0, out.err
    return json.loads(out.out)


def test_a_recorded_poor_alpha_is_suggested_away_and_the_suggestion_applies(
        poor: tuple[LiveCluster, str, str], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    live, url, token = poor
    path = tmp_path / "poor.jsonl.gz"
    serve_recorded(url, token, path, seed=1)
    rec = read_recording(path)
    served = [d for d in rec.decisions if d.cached > 0]
    assert len({d.agent for d in rec.decisions}) == 4 and served
    assert {d.side for d in served} == {"pe"}  # alpha 10^9: the PE node reads everything

    data = suggest_json(capsys, path)
    fit = data["world"]["calibration"]  # calibrated from the run's own stories and views
    assert fit["measured"]["turns"] == 20 and fit["prefill_scale"] is not None
    today = data["current"]
    assert (today["read_side"], today["alpha_tokens"]) == ("seed-select", POOR_ALPHA)
    alpha = data["by_dimension"]["alpha"]
    assert alpha["alpha_tokens"] < POOR_ALPHA  # the right direction
    assert alpha["jct_change"] < -0.10 and alpha["jct_s"] < today["jct_s"]
    assert alpha["command"] == f"dualpath tune set alpha={alpha['alpha_tokens']}"
    assert data["best"][0]["jct_change"] <= alpha["jct_change"]  # nothing ranked above worse
    assert alpha["snic_max_avg"] < today["snic_max_avg"]  # the decode nodes' NICs read too

    with DualPathClient(url, token) as client:
        client.patch_scheduler({"alpha": alpha["alpha_tokens"]})
        assert client.view().scheduler.thresholds.alpha_tokens == alpha["alpha_tokens"]
        since = client.view().scheduler.last_decision_seq or 0
        run, _ = run_agents_remote(url, agentic_workload(2, turns=4, seed=2), token=token,
                                   timeout=120)
        assert not run.errors
        after = [d for d in client.decisions(since) if d.seq > since and d.cached > 0]
    assert after
    for d in after:  # the seed's rule with the applied alpha decided every read
        assert d.side == ("pe" if d.pe_read_q <= alpha["alpha_tokens"] else "de"), d
