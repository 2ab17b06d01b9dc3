"""``dualpath bench --url``: the agentic workload driven through a live cluster's HTTP API
(a real uvicorn server on loopback over engine processes and a PosixStore)."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import pytest
from openai_server import Served, serve_processes, tiny_opts

from dualpath_cli.cli.app import main
from dualpath_cli.cluster.system import RuntimeSystem
from dualpath_cli.runtime.workloads import agentic_workload
from dualpath_cli.services.remote_runner import run_agents_remote
from dualpath_cli.services.runner import run_agents

pytestmark = pytest.mark.e2e  # an API server over engine processes

AGENTS = agentic_workload(3, turns=3, first_append=40, append=12, gen=4, seed=5)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with serve_processes(tmp_path_factory.mktemp("store")) as s:
        yield s


def test_remote_run_hits_each_agents_chain_and_matches_in_process(served: Served) -> None:
    run, info = run_agents_remote(served.url, AGENTS, timeout=60)
    assert not run.errors and len(run.turns) == 9
    assert info.model == "tiny"
    for t in run.turns:
        assert t.ttft > 0 and t.latency >= t.ttft and len(t.tokens) == 4
        assert (t.cached > 0) == (t.turn > 0)  # every later turn hits its own agent's KV
    with RuntimeSystem(tiny_opts()) as system:
        local = run_agents(system, AGENTS, timeout=60)
    assert run.tokens_by_turn() == local.tokens_by_turn()
    assert {(t.agent, t.turn): t.cached for t in run.turns} == {
        (t.agent, t.turn): t.cached for t in local.turns}


def test_bench_url_prints_the_bench_json(served: Served,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "--url", served.url, "--agents", "2", "--turns", "2", "--json"])
    out = capsys.readouterr().out
    assert code == 0, out
    report = json.loads(out)
    row = report["policies"][0]
    assert report["setup"]["url"] == served.url and report["setup"]["agents"] == 2
    assert row["turns"] == 4 and row["errors"] == [] and row["cached_tokens"] > 0
    # the hits are the cluster's own lookup counters (its /metrics), over this run only
    assert row["hit_tokens"] == row["cached_tokens"] and row["prompt_tokens"] > 0
    assert row["hit_ratio"] == row["hit_tokens"] / row["prompt_tokens"]
    assert row["jct_s"] > 0 and row["ttft_p50_s"] > 0 and row["tpot_p99_s"] >= 0
    assert report["jct_s"] == {row["policy"]: row["jct_s"]}


def test_bench_url_table(served: Served, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "--url", served.url, "--agents", "1", "--turns", "2"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"dualpath bench --url {served.url}" in out
    assert "TTFT" in out and "cached" in out


def test_bench_url_refuses_in_process_options_and_reports_no_server(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--url", "http://127.0.0.1:9", "--pd", "2P4D"]) == 2
    assert "--pd: not with --url" in capsys.readouterr().err
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    assert main(["bench", "--url", f"http://127.0.0.1:{port}", "--agents", "1",
                 "--turns", "1"]) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert f"cannot reach http://127.0.0.1:{port}" in err and "Traceback" not in err
