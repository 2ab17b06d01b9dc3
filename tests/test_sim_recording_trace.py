"""A recording (``dualpath record``) as a simulator workload, and ``trace convert`` of one.

What carries over: every agent's turn chain (prompt and generated lengths) and each agent's
first arrival (``start_s``), which an offline run honours; the file is told apart by its
content, whatever its name; the twin replays the same conversion.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from test_twin import cluster_view, record, served

from dualpath_cli.cli.app import main
from dualpath_cli.errors import TraceError
from dualpath_cli.runtime.workloads import agentic_workload
from dualpath_cli.services import twin
from dualpath_cli.services.recording import read_recording
from dualpath_cli.services.recording_trace import is_recording, trace_with_arrivals
from dualpath_cli.sim import make_setup, plans_from_trajectories, simulate_offline
from dualpath_cli.workload.trace_format import Trace, TraceHeader, decode_lines, encode_lines
from dualpath_cli.workload.trace_io import read_trace
from dualpath_cli.workload.trajectory import Trajectory, Turn

AGENTS, TURNS = 4, 5


@pytest.fixture
def recording(tmp_path: Path, clean_config: Path) -> Path:
    """A zstd recording of 4 agents' 5 turns each, named without a suffix (read by content);
    ``served`` logs agent k's first turn 0.05 s after agent k - 1's."""
    path = record(tmp_path / "incident.jsonl.zst", cluster_view(),
                  served(agentic_workload(AGENTS, turns=TURNS), with_gen=True))
    plain = tmp_path / "incident"
    plain.write_bytes(path.read_bytes())
    return plain


def _prompts(turns: tuple[Turn, ...]) -> list[int]:
    ctx, out = 0, []
    for t in turns:
        out.append(ctx + t.append)
        ctx += t.append + t.gen
    return out


def _json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    code = main([*args, "--json"])
    out = capsys.readouterr()
    assert code == 0, out.err
    return json.loads(out.out)


def test_sim_run_replays_a_recording(recording: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert recording.read_bytes()[:4] == b"\x28\xb5\x2f\xfd" and is_recording(recording)
    out = _json(capsys, "sim", "run", "--trace", str(recording), "--model", "ds27b",
                "--pd", "1P1D")
    assert (out["agents"], out["turns"]) == (AGENTS, AGENTS * TURNS)
    assert out["workload"] == str(recording)
    cmp = _json(capsys, "sim", "compare", "--trace", str(recording), "--model", "ds27b",
                "--pd", "1P1D", "--policies", "basic,dualpath")
    assert [r["turns"] for r in cmp["results"]] == [AGENTS * TURNS] * 2


def test_trace_convert_keeps_chains_lengths_and_arrivals(
        recording: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_path = tmp_path / "agents.jsonl"
    summary = _json(capsys, "trace", "convert", str(recording), "-o", str(out_path))
    assert summary["from"] == "recording" and summary["trajectories"] == AGENTS
    assert summary["turns"] == AGENTS * TURNS and summary["with_arrivals"] == AGENTS
    trace = read_trace(out_path)
    want = agentic_workload(AGENTS, turns=TURNS)
    for got, traj in zip(trace.trajectories, want, strict=True):
        assert _prompts(got.turns) == _prompts(traj.turns)  # every prompt length
        assert [t.gen for t in got.turns] == [t.gen for t in traj.turns]  # recorded gen
    # served() logs one turn every 0.01 s, an agent's 5 turns in a row
    assert [t.start_s for t in trace.trajectories] == pytest.approx([0.0, 0.05, 0.1, 0.15])
    # the twin replays the same turns (one conversion)
    rec = read_recording(recording)
    traffic = twin.traffic_from_recording(rec, "r")
    assert [p.turns for p in traffic.plans] == [t.turns for t in trace.trajectories]
    assert trace_with_arrivals(rec, "r").trajectories == trace.trajectories


def test_trace_convert_of_a_recording_to_stdout(
        recording: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``-o -`` is stdout for a recording as for a Mooncake log: the trace there, the
    summary on stderr, and no file named ``-``."""
    file_path = tmp_path / "agents.jsonl"
    assert main(["trace", "convert", str(recording), "-o", str(file_path)]) == 0
    capsys.readouterr()
    assert main(["trace", "convert", str(recording), "-o", "-"]) == 0
    out = capsys.readouterr()
    assert decode_lines(out.out.splitlines(), "-") == read_trace(file_path)
    assert "trajectories" in out.err and not Path("-").exists()


def test_not_a_workload_file_is_one_line(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    packed = tmp_path / "notes.jsonl"
    packed.write_bytes(gzip.compress(b'{"hello": 1}\n'))
    assert main(["sim", "run", "--trace", str(packed), "--model", "ds27b", "--pd",
                 "1P1D"]) == 2
    err = capsys.readouterr().err
    assert "not a recording" in err and "dualpath trace" in err
    assert len(err.strip().splitlines()) <= 2  # one line (rich may wrap a long path)
    with pytest.raises(TraceError, match="compressed file that is not a recording"):
        is_recording(packed)


def test_trace_convert_of_a_dualpath_trace_needs_none(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.jsonl"
    assert main(["trace", "gen", "--agents", "2", "--max-len", "4K", "-o", str(trace)]) == 0
    capsys.readouterr()
    assert main(["trace", "convert", str(trace), "-o", str(tmp_path / "o.jsonl")]) == 2
    assert "needs no conversion" in capsys.readouterr().err
    # the twin needs a recording's view of the cluster: a trace is named as such
    assert main(["tune", "suggest", "--from", str(trace)]) == 2
    assert "a dualpath trace, not a recording" in capsys.readouterr().err


def test_start_s_round_trips_and_is_checked() -> None:
    trace = Trace(TraceHeader(100), (Trajectory(0, (Turn(10, 2),), start_s=1.5),
                                     Trajectory(1, (Turn(10, 2),))))
    back = decode_lines(encode_lines(trace), "t")
    assert [t.start_s for t in back.trajectories] == [1.5, None]
    bad = ['{"format": "dualpath-trace", "version": 1, "max_len": 100}',
           '{"agent_id": 0, "token_seed": 0, "start_s": -1, "turns": [[10, 2]]}']
    with pytest.raises(TraceError, match="t:2: field 'start_s' must be a number"):
        decode_lines(bad, "t")


def test_an_offline_run_starts_each_agent_at_its_arrival() -> None:
    setup = make_setup("qwen32b", "1P1D", "dualpath")
    turns = (Turn(2000, 20),) * 3
    together = simulate_offline(setup, plans_from_trajectories(
        [Trajectory(i, turns) for i in range(2)]))
    apart = simulate_offline(setup, plans_from_trajectories(
        [Trajectory(0, turns), Trajectory(1, turns, start_s=30.0)]))
    assert apart.jct > 30.0 > together.jct
    # each agent's trajectory time counts from its own arrival
    assert apart.extra["mean_trajectory_s"] < 30.0
