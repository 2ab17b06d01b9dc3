"""`dualpath sim` front-end: --json keys and one-line errors."""

from __future__ import annotations

import json

import typer
from typer.testing import CliRunner

from dualpath_cli.cli import sim_cmd

_app = typer.Typer()
_app.add_typer(sim_cmd.app, name="sim")
runner = CliRunner()


def _json(args: list[str]) -> dict:  # type: ignore[type-arg]
    res = runner.invoke(_app, ["sim", *args, "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_run_json_keys() -> None:
    out = _json(["run", "--model", "ds660b", "--pd", "2P4D", "--agents", "16",
                 "--max-len", "16K", "--policy", "dualpath"])
    for key in ("jct_s", "turns", "policy", "pd", "snic_max_avg", "turns_per_s",
                "mean_trajectory_s", "dram_util", "dram_peak"):
        assert key in out
    assert out["policy"] == "dualpath" and out["pd"] == "2P4D" and out["turns"] > 0
    assert 0 < out["mean_trajectory_s"] <= out["jct_s"]


def test_run_online_json_keys() -> None:
    out = _json(["run", "--agents", "4", "--max-len", "16K", "--aps", "0.2",
                 "--horizon", "120"])
    assert out["mode"] == "online" and "ttft" in out and "tpot" in out


def test_compare_json() -> None:
    out = _json(["compare", "--agents", "16", "--max-len", "16K", "--policies",
                 "basic,oracle"])
    assert [r["policy"] for r in out["results"]] == ["basic", "oracle"]
    assert out["speedup_vs_basic"]["basic"] == 1.0


def test_capacity_json() -> None:
    out = _json(["capacity", "--max-len", "16K", "--lo", "0.05", "--hi", "0.1",
                 "--horizon", "120", "--steps", "1"])
    assert "capacity_aps" in out and out["probes"]


def test_bad_policy_is_a_usage_error() -> None:
    res = runner.invoke(_app, ["sim", "run", "--policy", "nope", "--agents", "2"])
    assert res.exit_code != 0
    assert "unknown scheduling policy 'nope'" in str(res.exception)


def test_bad_arrival_rate_names_the_rate_not_a_derived_agent_count() -> None:
    # A negative --aps used to size the trace first and fail on "agent count ... -2290".
    for aps in ("-1", "nan", "inf"):
        res = runner.invoke(_app, ["sim", "run", "--aps", aps, "--horizon", "60"])
        assert res.exit_code != 0
        assert "arrival rate must be a finite number > 0" in str(res.exception), aps
    res = runner.invoke(_app, ["sim", "compare", "--aps", "nan", "--policies", "basic"])
    assert "arrival rate must be a finite number > 0" in str(res.exception)
    res = runner.invoke(_app, ["sim", "run", "--aps", "0.1", "--horizon", "inf"])
    assert "horizon must be a finite number > 0" in str(res.exception)


def test_negative_bisection_steps_are_refused() -> None:
    res = runner.invoke(_app, ["sim", "capacity", "--steps", "-3"])
    assert res.exit_code != 0
    assert "--steps: -3 is below the minimum 0" in str(res.exception)


def test_text_tables_fit_eighty_columns_without_cutting_values() -> None:
    # CliRunner has no TTY, so rich lays the table out in 80 columns, as in cron or CI logs.
    res = runner.invoke(_app, ["sim", "compare", "--agents", "8", "--max-len", "16K",
                               "--policies", "basic,layerwise,dualpath,oracle"])
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines)
    rows = {line.split()[0]: line.split() for line in lines if line.split()
            and line.split()[0] in ("basic", "layerwise", "dualpath", "oracle")}
    assert set(rows) == {"basic", "layerwise", "dualpath", "oracle"}
    assert rows["basic"][-1] == "1.00x" and all(r[-1].endswith("x") for r in rows.values())
    assert rows["oracle"][4] == "-"  # no reads: no storage-NIC balance, not "nan"


def test_online_run_says_how_it_ended() -> None:
    over = ["sim", "run", "--model", "qwen32b", "--pd", "1P2D", "--max-len", "16K",
            "--policy", "basic", "--aps", "5", "--horizon", "600"]
    res = runner.invoke(_app, over)
    assert res.exit_code == 0, res.output
    assert "basic: SLO missed; stopped at" in res.stdout
    assert "mean TTFT over the last 150 s above 4 s" in res.stdout
    out = _json(over[1:])
    assert out["stop_reason"] == "ttft" and out["slo_ok"] is False
    assert out["sim_time_s"] < 600
    full = _json([*over[1:], "--full-horizon"])
    assert full["stop_reason"] == "horizon" and full["sim_time_s"] == 600
