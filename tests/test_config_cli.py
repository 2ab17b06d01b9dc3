"""`dualpath config show|validate|init`: output, exit codes and the init round trip."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dualpath_cli.cli.app import main
from dualpath_cli.config import PRESETS, load_file, load_preset
from dualpath_cli.core.thresholds import tokens_readable


@pytest.fixture(autouse=True)
def isolated(clean_config: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No real user/system file and no stray DUALPATH_* variables (conftest.clean_config)."""
    monkeypatch.setenv("COLUMNS", "200")
    return clean_config


def test_show_json_has_values_sources_and_both_threshold_forms(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DUALPATH_SCHEDULER__Z_FACTOR", "1.2")
    code = main(["config", "show", "--preset", "paper", "--set", "storage.block_size=128",
                 "--json"])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    settings = data["settings"]
    assert data["preset"] == "paper"
    assert settings["preset"]["source"] == "flag:--preset"
    assert settings["storage.block_size"] == {"value": 128, "given": 128, "source": "flag:--set"}
    assert settings["scheduler.z_factor"]["source"] == "env:DUALPATH_SCHEDULER__Z_FACTOR"
    assert settings["hardware.snic_bandwidth"] == {"value": 50e9, "given": "400Gbps",
                                                   "source": "preset:paper"}
    assert settings["hardware.gpu_peak_flops"]["source"] == "profile:hopper"
    alpha = data["resolved"]["alpha"]
    assert (alpha["given"], alpha["form"], alpha["unit"]) == ("3s", "seconds", "tokens")
    assert alpha["value"] == tokens_readable(50e9, 48068, 3)
    assert data["resolved"]["compute_quota"]["value"] == pytest.approx(0.3)
    assert data["derived"]["nodes"] == 6 and data["derived"]["gpus"] == 48


def test_show_human_prints_every_key_with_source(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "show", "--preset", "small"]) == 0
    out = capsys.readouterr().out
    for key in load_preset("small").settings:
        assert key in out
    assert "preset:small" in out and "profile:hopper" in out
    assert "15TFLOP" in out and "37.9ms" in out  # quota as given and resolved
    assert "alpha: 4KB (bytes) -> 0 tokens" in out


def test_show_reads_a_config_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("cluster:\n  pd: 4P8D\n")
    assert main(["config", "show", "--config", str(path), "--json"]) == 0
    settings = json.loads(capsys.readouterr().out)["settings"]
    assert settings["cluster.pd"] == {"value": "4P8D", "given": "4P8D",
                                      "source": f"file:{path}:2"}


def test_show_bad_flag_exits_2_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "show", "--set", "cluster.pd=2X4D"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --set: cluster.pd: invalid P/D spec '2X4D'")
    assert len(err.splitlines()) == 1


def test_validate_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text("preset: paper\nscheduler:\n  alpha: 8KiB\n")
    bad.write_text("scheduler:\n  beta: 16K\n  alpah: 3s\n")
    assert main(["config", "validate", str(good)]) == 0
    assert "valid" in capsys.readouterr().err
    assert main(["config", "validate", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: {bad}:3: scheduler.alpah: unknown key; did you mean 'alpha'?"
    assert main(["config", "validate", str(tmp_path / "absent.yaml")]) == 2


def test_validate_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text("scheduler:\n  beta: 16K\n")
    bad.write_text("scheduler: [\n")
    assert main(["config", "validate", str(good), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["valid"] is True and data["resolved"]["beta"]["value"] == 16000
    assert main(["config", "validate", str(bad), "--json"]) == 2
    data = json.loads(capsys.readouterr().out)
    assert data["valid"] is False and "malformed YAML" in data["error"]


@pytest.mark.parametrize("name", list(PRESETS))
def test_init_round_trips_every_preset(name: str, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / f"{name}.yaml"
    assert main(["config", "init", "--preset", name, "-o", str(path)]) == 0
    assert f"wrote {path}" in capsys.readouterr().err
    text = path.read_text()
    assert text.startswith("# dualpath configuration")
    written, expected = load_file(path), load_preset(name)
    assert written.config == expected.config
    assert written.resolved == expected.resolved
    assert not list(tmp_path.glob(".*.tmp"))  # the temp file was renamed, not left behind


def test_init_refuses_to_overwrite_without_force(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("keep me\n")
    assert main(["config", "init", "-o", str(path)]) == 2
    assert "already exists; use --force" in capsys.readouterr().err
    assert path.read_text() == "keep me\n"
    assert main(["config", "init", "-o", str(path), "--force", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"path": str(path), "preset": "embedded"}
    assert load_file(path).config == load_preset("embedded").config


def test_init_defaults_to_the_user_file_which_show_then_reads(
        isolated: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "init", "--preset", "medium"]) == 0
    assert (isolated / "config.yaml").is_file()
    capsys.readouterr()
    assert main(["config", "show", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["preset"] == "medium"
    assert data["settings"]["cluster.pd"]["source"].startswith(f"user:{isolated}/config.yaml:")


def test_init_to_stdout_and_unknown_preset(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "init", "--preset", "paper", "-o", "-"]) == 0
    assert "alpha: 3s" in capsys.readouterr().out
    assert main(["config", "init", "--preset", "papr", "-o", "-"]) == 2
    assert "did you mean 'paper'?" in capsys.readouterr().err
