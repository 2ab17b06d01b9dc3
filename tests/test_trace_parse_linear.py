"""Reading a trace costs work linear in its size (issue 34 item 11: a 1 MB line).

Counts, not timings: the validators run once per value, so a line 4x as long does 4x the
checks; ``sim compare`` reads its ``--trace`` once, not once per policy.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from dualpath_cli.cli import sim_cmd
from dualpath_cli.sim import trace as sim_trace
from dualpath_cli.workload import mooncake, trace_format
from dualpath_cli.workload.mooncake_link import read_agent_trace
from dualpath_cli.workload.trace_io import read_mooncake, read_trace


def _one_line_trace(path: Path, turns: int, shared: int = 1) -> Path:
    header = {"format": "dualpath-trace", "version": 1, "max_len": 10**9}
    line = {"agent_id": 0, "token_seed": 1, "shared": [[i, 1] for i in range(shared)],
            "turns": [[shared + 1, 1]] + [[3, 2]] * (turns - 1)}
    path.write_text(json.dumps(header) + "\n" + json.dumps(line) + "\n", encoding="utf-8")
    return path


def _counting(monkeypatch: pytest.MonkeyPatch, module: object) -> list[int]:
    """Count calls of ``module.is_int``: the per-value check of every decoder."""
    calls = [0]
    real = trace_format.is_int

    def counted(value: object) -> bool:
        calls[0] += 1
        return real(value)

    monkeypatch.setattr(module, "is_int", counted)
    return calls


def test_a_dualpath_line_four_times_as_long_costs_four_times_the_checks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _counting(monkeypatch, trace_format)
    work = []
    for n in (2_000, 8_000):
        calls[0] = 0
        trace = read_trace(_one_line_trace(tmp_path / f"t{n}.jsonl", n, shared=n // 4))
        assert len(trace.trajectories[0].turns) == n
        work.append(calls[0])
    assert work[0] >= 2_000  # every value is checked ...
    assert work[1] <= 4 * work[0] + 16  # ... once: no per-turn re-validation of the line


def test_a_mooncake_line_four_times_as_long_costs_four_times_the_checks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _counting(monkeypatch, mooncake)
    work = []
    for n in (2_000, 8_000):
        path = tmp_path / f"m{n}.jsonl"
        req = {"timestamp": 0, "input_length": 512 * n, "output_length": 1,
               "hash_ids": list(range(n))}
        path.write_text(json.dumps(req) + "\n", encoding="utf-8")
        calls[0] = 0
        assert len(read_mooncake(path)[0].hash_ids) == n
        work.append(calls[0])
        trace, counts = read_agent_trace(path)  # detect, read and link stay linear too
        assert counts is not None and len(trace.trajectories) == 1
    assert work[0] >= 2_000
    assert work[1] <= 4 * work[0] + 16


def test_sim_compare_reads_the_trace_once_for_every_policy(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _one_line_trace(tmp_path / "t.jsonl", 20)
    reads: list[str] = []
    real = sim_trace.read_agent_trace

    def counted(p: str | Path) -> object:
        reads.append(str(p))
        return real(p)

    monkeypatch.setattr(sim_trace, "read_agent_trace", counted)
    app = typer.Typer()
    app.add_typer(sim_cmd.app, name="sim")
    result = CliRunner().invoke(app, ["sim", "compare", "--trace", str(path), "--model",
                                      "ds27b", "--pd", "1P1D", "--policies",
                                      "basic,dualpath", "--json"])
    assert result.exit_code == 0, result.output
    assert len(json.loads(result.stdout)["results"]) == 2
    assert reads == [str(path)]
