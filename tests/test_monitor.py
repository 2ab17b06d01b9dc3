"""``dualpath-monitor`` against the shipped FakeClient and against a recording.

The command runs through the real entry points (``dualpath monitor`` via ``app.main`` and
the ``dualpath-monitor`` console script's ``main``); only the connection is the fake, through
the one seam ``source.connect``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_diagnose_rules import decision, make_view

from dualpath_cli.api.fake import FakeClient
from dualpath_cli.cli import monitor_cmd, source
from dualpath_cli.cli.app import main as dualpath_main
from dualpath_cli.services.recording import write_recording
from dualpath_cli.telemetry.metrics import spec
from dualpath_cli.telemetry.recording import Extras, Sample


@pytest.fixture()
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeClient:
    views = [make_view(i, frag={4: 0.1 * i}, layer_blocks=8) for i in range(6)]
    client = FakeClient(views, [decision(s) for s in range(1, 5)])
    monkeypatch.setattr(source, "connect", lambda ref, timeout: client)
    return client


def test_every_short_name_maps_onto_the_metrics_table() -> None:
    assert set(monitor_cmd.MONITOR_METRICS) == {
        "hbm_frag", "cache_hit", "snic_util", "read_queue", "gpu_util", "bubble",
        "prefetch_accuracy", "warm"}
    for m in monitor_cmd.MONITOR_METRICS.values():
        assert spec(m.metric).name == m.metric  # KeyError if the table lacks it


def test_json_lines_parse_one_object_per_sample(fake: FakeClient,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    code = monitor_cmd.main(["--metric", "hbm_frag", "--metric", "snic_util", "--interval",
                             "250ms", "--count", "3", "--json"])
    assert code == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3
    objs = [json.loads(line) for line in lines]
    frag = [next(r for r in o["metrics"]["hbm_frag"]["rows"] if r["engine"] == 4)
            for o in objs]
    assert [round(r["value"], 2) for r in frag] == [0.0, 0.1, 0.2]
    assert frag[0]["delta"] is None and frag[2]["delta"] == pytest.approx(0.1)
    assert objs[0]["metrics"]["snic_util"]["metric"] == "dualpath_snic_utilization_ratio"
    assert {r["key"] for r in objs[0]["metrics"]["snic_util"]["rows"]} == {
        "node P0", "node P1", "node D2", "node D3", "node D4", "node D5"}


def test_once_when_piped_and_the_seed_commands(fake: FakeClient,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert dualpath_main(["monitor", "--metric", "hbm_frag", "--interval", "1s"]) == 0
    out = capsys.readouterr().out
    assert out.count("dualpath-monitor  2P4D") == 1  # one sample: stdout is not a terminal
    assert "engine 4" in out and "hbm_frag" in out
    assert monitor_cmd.main(["--metric", "cache_hit", "--by-layer"]) == 0
    out = capsys.readouterr().out
    for layer in range(4):
        assert f"│ {layer}     │" in out
    assert "bubble" in out  # layer 0's negative slack is shown as a bubble


def test_by_node_role_and_by_engine(fake: FakeClient,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert monitor_cmd.main(["-m", "gpu_util", "--by-node", "--role", "decode", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["metrics"]["gpu_util"]["rows"]
    assert [r["key"] for r in rows] == ["node D2", "node D3", "node D4", "node D5"]
    assert monitor_cmd.main(["-m", "read_queue", "--by-engine", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["metrics"]["read_queue"]["rows"]
    assert [r["engine"] for r in rows] == [0, 1, 2, 3, 4, 5]


@pytest.mark.parametrize("argv,message", [
    (["--metric", "hbm_fragmentation"], "unknown metric 'hbm_fragmentation' (did you mean "
     "'hbm_frag'?); choose one of: hbm_frag, cache_hit, snic_util"),
    (["--interval", "100ms"], "--interval 100ms is too short: the minimum is 250ms"),
    (["--interval", "fast"], "invalid"),
    (["--by-node", "--by-engine"], "exclude each other"),
    (["--role", "router"], "choose prefill or decode"),
])
def test_bad_arguments_are_refused_with_one_line(argv: list[str], message: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert monitor_cmd.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in " ".join(err.split()) and len(err.splitlines()) == 1, err


@pytest.mark.e2e
def test_console_script_refuses_in_a_subprocess() -> None:
    exe = Path(sys.executable).with_name("dualpath-monitor")
    argv = [str(exe)] if exe.exists() else [sys.executable, "-m",
                                             "dualpath_cli.cli.monitor_cmd"]
    proc = subprocess.run([*argv, "--metric", "nope", "--interval", "1s"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("error: unknown metric 'nope'")
    assert len(proc.stderr.strip().splitlines()) == 1


def test_no_cluster_is_exit_3(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.delenv("DUALPATH_URL", raising=False)
    assert monitor_cmd.main(["--metric", "hbm_frag"]) == 3
    assert "no cluster running" in capsys.readouterr().err
    assert monitor_cmd.main(["--url", "http://127.0.0.1:9", "--metric", "hbm_frag"]) == 3
    assert "cannot reach the dualpath API" in capsys.readouterr().err


def test_from_a_recording_plays_every_sample(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "rec.jsonl.gz"
    samples = [Sample(v.at, v, Extras(prefetch_accuracy={0: 0.5 + 0.1 * i},
                                      cache_hit_ratio={"0/dram": 0.25, "2/store": 1.0}))
               for i, v in enumerate(make_view(i, frag={2: 0.2}) for i in range(4))]
    write_recording(path, {"source": "test"}, samples, [decision(1)])
    assert monitor_cmd.main(["--from", str(path), "-m", "prefetch_accuracy", "-m",
                             "cache_hit", "--json"]) == 0
    objs = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert len(objs) == 4
    acc = [o["metrics"]["prefetch_accuracy"]["rows"][0]["value"] for o in objs]
    assert acc == pytest.approx([0.5, 0.6, 0.7, 0.8])
    hits = objs[0]["metrics"]["cache_hit"]["rows"]
    assert [(r["key"], r["value"]) for r in hits] == [("node P0 dram", 0.25),
                                                      ("node D2 store", 1.0)]
    assert monitor_cmd.main(["--from", str(path), "-m", "hbm_frag", "--once", "--json"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1
    assert monitor_cmd.main(["--from", str(tmp_path / "missing.jsonl")]) == 2
    assert "no such recording" in capsys.readouterr().err


def test_sparkline_and_history() -> None:
    assert monitor_cmd.sparkline([0.0, 0.5, 1.0, None]) == "▁▅█ "
    assert monitor_cmd.sparkline([None]) == ""
    assert monitor_cmd.sparkline([3.0, 3.0]) == "▁▁"
