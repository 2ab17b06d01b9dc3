"""`dualpath trace gen` and `dualpath trace stats`: output, JSON keys and exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dualpath_cli.cli.app import main
from dualpath_cli.workload.table2 import TABLE2

COLUMNS = ("turns", "append", "gen", "total", "context")

# the installed typer (0.29) vendors click as typer._click; app.main catches only the real click's
# exceptions, so a Click parse error escapes as a traceback (reported to the app.py owner).


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_gen_then_stats_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "t64.jsonl"
    code, out, _ = run(capsys, "trace", "gen", "--max-len", "64K", "--agents", "500",
                       "--seed", "1", "-o", str(path), "--json")
    assert code == 0
    made = json.loads(out)
    assert made["path"] == str(path) and made["max_len"] == 64_000
    assert made["stats"]["agents"] == 500
    code, out, _ = run(capsys, "trace", "stats", str(path), "--json")
    assert code == 0
    stats = json.loads(out)
    assert stats["format"] == "dualpath" and stats["agents"] == 500
    row = TABLE2[2]
    for key in COLUMNS:
        assert stats[key] == pytest.approx(getattr(row, key), rel=0.05)
        assert stats[key] == pytest.approx(made["stats"][key])
    assert stats["max_total"] <= 64_000
    assert stats["turn_size_corr"] < 0


def test_gen_human_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "t.jsonl"
    code, out, err = run(capsys, "trace", "gen", "--max-len", "32K", "--agents", "40",
                         "-o", str(path))
    assert code == 0 and path.exists()
    assert "Table 2" in out and "turns" in out and "context" in out
    assert "wrote" in err
    code, out, _ = run(capsys, "trace", "stats", str(path))
    assert code == 0 and "agents" in out and "28,639" in out


def test_gen_augments_past_base(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "t.jsonl"
    code, out, _ = run(capsys, "trace", "gen", "--max-len", "48K", "--agents", "30",
                       "--base-agents", "10", "-o", str(path), "--json")
    assert code == 0
    assert json.loads(out)["augmented"] is True


def test_stats_mooncake(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 1024, "output_length": 10, '
                    '"hash_ids": [1, 2]}\n{"timestamp": 5, "input_length": 1024, '
                    '"output_length": 30, "hash_ids": [1, 3]}\n')
    for extra in ([], ["--format", "mooncake"]):
        code, out, _ = run(capsys, "trace", "stats", str(path), "--json", *extra)
        assert code == 0
        stats = json.loads(out)
        assert stats["format"] == "mooncake"
        assert stats["requests"] == 2
        assert stats["mean_input_length"] == 1024 and stats["mean_output_length"] == 20
        assert stats["prefix_hit_ratio"] == pytest.approx(512 / 2048)
    code, out, _ = run(capsys, "trace", "stats", str(path))
    assert code == 0 and "25.00%" in out


@pytest.mark.parametrize("argv", [
    ["trace", "gen", "--max-len", "64Q", "-o", "x.jsonl"],
    ["trace", "gen", "--max-len", "100", "-o", "x.jsonl"],
    ["trace", "gen", "--agents", "0", "-o", "x.jsonl"],
    ["trace", "gen", "--seed", "-3", "-o", "x.jsonl"],
    ["trace", "gen", "--agents", "5", "-o", "/nonexistent-dir/x.jsonl"],
    ["trace", "gen", "--agents", "many", "-o", "x.jsonl"],
    ["trace", "gen"],
])
def test_gen_bad_input_exits_2(argv: list[str], tmp_path: Path,
                               capsys: pytest.CaptureFixture[str],
                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert out == ""
    assert "Traceback" not in err
    assert not (tmp_path / "x.jsonl").exists()


def test_stats_bad_line_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"format": "dualpath-trace", "version": 1, "max_len": 100}\n'
                    '{"agent_id": 0, "token_seed": 1, "turns": [[90, 20]]}\n')
    code, out, err = run(capsys, "trace", "stats", str(path))
    assert code == 2 and out == ""
    assert f"{path}:2: agent 0: total 110 tokens exceeds max_len 100" in " ".join(err.split())
    assert len(err.strip().splitlines()) <= 2  # one line (rich may wrap a long path)


@pytest.mark.parametrize(("content", "extra", "reason"), [
    (None, [], "cannot read"),
    ('{"format": "dualpath-trace", "version": 1, "max_len": 100}\n', [], "no trajectories"),
    ('{"what": 1}\n', [], "unknown trace format"),
    ('{"format": "dualpath-trace", "version": 1, "max_len": 100}\n', ["--format", "mooncake"],
     "missing field 'timestamp'"),
    ('{"timestamp": 0}\n', ["--format", "csv"], "invalid --format 'csv'"),
])
def test_stats_errors_exit_2(content: str | None, extra: list[str], reason: str,
                             tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "f.jsonl"
    if content is not None:
        path.write_text(content)
    code, out, err = run(capsys, "trace", "stats", str(path), *extra)
    assert code == 2 and out == ""
    assert reason in " ".join(err.split())
