"""Simulating an operator's own trace: `Workload` and the `--trace` option of sim and tune."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from dualpath_cli.cli import sim_cmd, tune_cmd
from dualpath_cli.errors import TraceError, UsageError
from dualpath_cli.sim import Workload
from dualpath_cli.sim.trace import MAX_AGENTS
from dualpath_cli.workload.build import synthetic_trace
from dualpath_cli.workload.trace_io import write_trace

_app = typer.Typer()
_app.add_typer(sim_cmd.app, name="sim")
_app.add_typer(tune_cmd.app, name="tune")
runner = CliRunner()


@pytest.fixture()
def trace_file(tmp_path: Path) -> Path:
    path = tmp_path / "agents.jsonl"
    write_trace(path, synthetic_trace(16_000, 12, 3))
    return path


def test_plans_replay_the_trace_first_agents(trace_file: Path) -> None:
    wl = Workload.from_file(trace_file)
    trace = wl.trace
    assert trace is not None and wl.max_len == 16_000 and wl.trace_agents == 12
    plans = wl.plans(5)
    assert [p.turns for p in plans] == [t.turns for t in trace.trajectories[:5]]
    assert len(wl.plans(12)) == 12


def test_more_agents_than_the_trace_are_augmented_within_its_max_len(trace_file: Path) -> None:
    wl = Workload.from_file(trace_file, seed=7)
    trace = wl.trace
    assert trace is not None
    plans = wl.plans(30)
    assert len(plans) == 30
    bases = [t.turns for t in trace.trajectories]
    for plan in plans:  # a synthetic first round, then one of the trace's agents (the last
        assert plan.turns[0].gen == 1  # turn may be cut at max_len)
        n = len(plan.turns)
        assert any(base[:n - 2] == plan.turns[1:n - 1] and len(base) >= n - 1
                   for base in bases)
        assert sum(t.append + t.gen for t in plan.turns) <= wl.max_len
    assert [p.turns for p in Workload.from_file(trace_file, seed=7).plans(30)] == \
        [p.turns for p in plans]  # the seed decides the augmentation


def test_an_augmented_trace_is_not_augmented_again(tmp_path: Path) -> None:
    path = tmp_path / "augmented.jsonl"
    write_trace(path, synthetic_trace(16_000, 20, 1, base_agents=5))
    wl = Workload.from_file(path)
    assert len(wl.plans(20)) == 20
    with pytest.raises(UsageError, match="20, already augmented"):
        wl.plans(21)


def test_request_logs_are_linked_and_bad_files_refused(tmp_path: Path) -> None:
    mooncake = tmp_path / "mc.jsonl"
    mooncake.write_text('{"timestamp": 0, "input_length": 600, "output_length": 10, '
                        '"hash_ids": [1, 2]}\n{"timestamp": 5, "input_length": 700, '
                        '"output_length": 10, "hash_ids": [1, 3]}\n')
    wl = Workload.from_file(mooncake)  # linked into one two-turn trajectory
    assert [(t.append, t.gen) for t in wl.plans(1)[0].turns] == [(600, 10), (90, 10)]
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    with pytest.raises(TraceError, match="bad.jsonl:1: invalid JSON"):
        Workload.from_file(bad)
    with pytest.raises(UsageError, match="agent count must be at least 1"):
        Workload(16_000).plans(0)


def test_a_run_too_large_to_hold_is_refused_before_it_is_built() -> None:
    with pytest.raises(UsageError, match="1,000,001 agents is more than one run replays"):
        Workload(16_000).plans(MAX_AGENTS + 1)
    res = runner.invoke(_app, ["sim", "run", "--aps", "1000", "--horizon", "100000"])
    assert res.exit_code != 0
    assert "130,000,050 agents is more than one run replays" in str(res.exception)


def _json(args: list[str]) -> dict[str, Any]:
    res = runner.invoke(_app, [*args, "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_sim_run_replays_the_whole_trace_by_default(trace_file: Path) -> None:
    out = _json(["sim", "run", "--trace", str(trace_file), "--model", "ds27b", "--pd", "1P1D"])
    wl = Workload.from_file(trace_file)
    assert wl.trace is not None
    assert out["workload"] == str(trace_file) and out["max_len"] == 16_000
    assert out["agents"] == 12
    assert out["turns"] == sum(len(t.turns) for t in wl.trace.trajectories)
    more = _json(["sim", "run", "--trace", str(trace_file), "--model", "ds27b", "--pd", "1P1D",
                  "--agents", "20"])
    assert more["agents"] == 20 and more["turns"] > out["turns"]


def test_sim_compare_and_capacity_take_a_trace(trace_file: Path) -> None:
    out = _json(["sim", "compare", "--trace", str(trace_file), "--model", "ds27b", "--pd",
                 "1P1D", "--policies", "basic,dualpath"])
    assert out["workload"] == str(trace_file) and out["agents"] == 12
    assert {r["turns"] for r in out["results"]} == {out["results"][0]["turns"]}
    cap = _json(["sim", "capacity", "--trace", str(trace_file), "--model", "ds27b", "--pd",
                 "1P1D", "--lo", "0.05", "--hi", "0.1", "--horizon", "120", "--steps", "0"])
    assert cap["workload"] == str(trace_file) and cap["probes"]


def test_trace_and_max_len_together_are_a_usage_error(trace_file: Path) -> None:
    res = runner.invoke(_app, ["sim", "run", "--trace", str(trace_file), "--max-len", "32K"])
    assert res.exit_code != 0
    assert "a --trace has its own" in str(res.exception)


def test_tune_dry_run_on_a_trace_writes_nothing(trace_file: Path, tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    out = _json(["tune", "set", "alpha=2s", "--dry-run", "-c", str(config), "--trace",
                 str(trace_file), "--model", "ds27b", "--pd", "1P1D"])
    assert out["written"] is False and not config.exists()
    assert out["scenario"]["workload"] == str(trace_file)
    assert out["scenario"]["agents"] == 12 and out["scenario"]["max_len"] == 16_000
    assert out["simulation"]["current"]["agents"] == 12
