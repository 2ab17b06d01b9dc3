"""`dualpath tune set`: dry run writes nothing, a real set edits only its keys, bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dualpath_cli.cli.app import main
from dualpath_cli.config.edit import edit_config_text, write_config_values
from dualpath_cli.errors import UsageError

SMALL = ["--agents", "8", "--max-len", "16K"]
USER_TEXT = """\
# my deployment
preset: paper
cluster:
  pd: 2P4D   # the lab cluster
scheduler:
  alpha: 3s
  read_side: dualpath
storage:
  block_size: 64
"""


@pytest.fixture(autouse=True)
def home(clean_config: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An isolated user config dir, no system file, no stray DUALPATH_* variables
    (conftest.clean_config)."""
    monkeypatch.setenv("COLUMNS", "200")
    return clean_config


def user_file(home: Path, text: str = USER_TEXT) -> Path:
    home.mkdir(parents=True, exist_ok=True)
    path = home / "config.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    code = main([*args, "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(captured.out)


def test_dry_run_writes_nothing_and_reports_both_settings(
        home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = user_file(home)
    before = (path.read_bytes(), path.stat().st_mtime_ns)
    data = run_json(capsys, "tune", "set", "alpha=1s", "beta=300K", "--dry-run", *SMALL)
    assert (path.read_bytes(), path.stat().st_mtime_ns) == before
    assert sorted(p.name for p in home.iterdir()) == ["config.yaml"]  # no temp file left
    assert data["dry_run"] is True and data["written"] is False
    alpha, beta = data["changes"]
    assert (alpha["key"], alpha["current"], alpha["proposed"]) == ("scheduler.alpha", "3s", "1s")
    assert alpha["current_source"] == f"user:{path}:6"
    assert (beta["current"], beta["proposed"], beta["proposed_resolved"]) == ("5s", "300K", 3e5)
    assert alpha["proposed_resolved"] == pytest.approx(alpha["current_resolved"] / 3, abs=1)
    sim = data["simulation"]
    # each arm really ran with its own thresholds
    assert sim["current"]["alpha_tokens"] == int(alpha["current_resolved"])
    assert sim["proposed"]["alpha_tokens"] == int(alpha["proposed_resolved"])
    assert sim["proposed"]["beta_tokens"] == 300_000
    assert sim["current"]["turns"] == sim["proposed"]["turns"] > 0  # the same workload
    jct = sim["delta"]["JCT"]
    assert jct["current"] == sim["current"]["jct_s"] and jct["proposed"] == sim["proposed"]["jct_s"]
    mean = sim["delta"]["mean trajectory time"]
    assert mean["proposed"] == sim["proposed"]["mean_trajectory_s"] <= jct["proposed"]
    assert data["scenario"]["mode"] == "offline" and data["scenario"]["agents"] == 8


def test_dry_run_human_table_and_no_file_created(
        home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tune", "set", "compute_quota=150ms", "--dry-run", *SMALL]) == 0
    out = capsys.readouterr().out
    assert "nothing written" in out and "300ms" in out and "150ms" in out
    assert "JCT" in out and "SNIC Max/Avg" in out
    assert not home.exists()


def test_online_dry_run_compares_latencies(capsys: pytest.CaptureFixture[str]) -> None:
    data = run_json(capsys, "tune", "set", "beta=200K", "--dry-run", "--model", "ds27b",
                    "--pd", "1P1D", "--max-len", "16K", "--aps", "0.2", "--horizon", "120")
    delta = data["simulation"]["delta"]
    for name in ("TTFT mean", "TPOT mean", "SLO met", "SNIC Max/Avg"):
        assert name in delta
    assert data["simulation"]["proposed"]["mode"] == "online"


def test_set_edits_only_its_keys_and_config_show_reflects_it(
        home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = user_file(home)
    data = run_json(capsys, "tune", "set", "alpha=2s", "scheduler.z_factor=1.2")
    assert data["written"] is True and data["path"] == str(path)
    text = path.read_text(encoding="utf-8")
    assert text == USER_TEXT.replace("alpha: 3s", "alpha: 2s").replace(
        "  read_side: dualpath\n", "  read_side: dualpath\n  z_factor: 1.2\n")
    shown = run_json(capsys, "config", "show")
    settings = shown["settings"]
    assert settings["scheduler.alpha"] == {"value": "2s", "given": "2s",
                                           "source": f"user:{path}:6"}
    assert settings["scheduler.z_factor"]["value"] == 1.2
    assert settings["scheduler.z_factor"]["source"] == f"user:{path}:8"
    assert settings["cluster.pd"]["source"] == f"user:{path}:4"  # unrelated keys kept
    assert shown["preset"] == "paper"


def test_set_creates_an_explicit_file_and_notes_env_override(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DUALPATH_SCHEDULER__BETA", "1M")
    target = tmp_path / "deploy" / "dp.yaml"
    data = run_json(capsys, "tune", "set", "-c", str(target), "beta=20s")
    assert target.read_text(encoding="utf-8") == "scheduler:\n  beta: 20s\n"
    assert data["notes"] == ["scheduler.beta stays 1M from env:DUALPATH_SCHEDULER__BETA, "
                             "which overrides the file written"]


@pytest.mark.parametrize(("arg", "message"), [
    ("alpha=-3s", "tune set: alpha=-3s: invalid alpha '-3s'"),
    ("alpah=3s", "unknown tunable key 'alpah' (did you mean 'alpha'?)"),
    ("read_side=random", "unknown tunable key 'read_side'"),
    ("beta=10", "scheduler.beta: 10 resolves to 10 tokens, below one block"),
    ("z_factor=0.5", "z_factor=0.5: 0.5 must be at least 1"),
    ("alpha", "'alpha': expected KEY=VALUE"),
])
def test_invalid_input_is_one_line_exit_2_and_writes_nothing(
        home: Path, capsys: pytest.CaptureFixture[str], arg: str, message: str) -> None:
    path = user_file(home)
    assert main(["tune", "set", arg]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert path.read_text(encoding="utf-8") == USER_TEXT


def test_edit_keeps_quotes_comments_and_other_sections() -> None:
    text = 'scheduler:\n  alpha: "3s"  # tuned\n  beta: 5s\nstorage:\n  block_size: 64'
    out = edit_config_text(text, {"scheduler.alpha": "8KiB",
                                  "scheduler.compute_quota": "200ms"}, "t.yaml")
    assert out == ('scheduler:\n  alpha: 8KiB  # tuned\n  beta: 5s\n  compute_quota: 200ms\n'
                   'storage:\n  block_size: 64')


def test_edit_refuses_flow_style_and_names_the_file() -> None:
    with pytest.raises(UsageError, match="t.yaml: cannot edit the flow-style"):
        edit_config_text("scheduler: {alpha: 3s}\n", {"scheduler.beta": "5s"}, "t.yaml")


def test_write_config_values_creates_the_file_and_its_directory(tmp_path: Path) -> None:
    target = tmp_path / "new" / "dir" / "config.yaml"
    write_config_values(target, {"scheduler.alpha": "2s", "scheduler.z_factor": 2})
    assert target.read_text(encoding="utf-8") == "scheduler:\n  alpha: 2s\n  z_factor: 2\n"
    assert sorted(os.listdir(target.parent)) == ["config.yaml"]  # no temp file left


def test_write_config_values_on_a_directory_is_a_one_line_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="cannot read") as err:
        write_config_values(tmp_path, {"scheduler.alpha": "2s"})
    assert "\n" not in str(err.value)


@pytest.mark.e2e
def test_config_edit_does_not_depend_on_the_cli() -> None:
    code = ("import sys, dualpath_cli.config.edit; "
            "print([m for m in sys.modules if m.startswith('dualpath_cli.cli')])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"  # config/ sits below cli/
