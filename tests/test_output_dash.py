"""``-o -`` is standard output in every command with an output option (one helper,
``cli/output_target.py``).

Issue 34 item 7: ``trace gen -o -`` wrote a file named ``-`` while ``config init -o -``
wrote stdout. With ``-`` the data owns stdout: the command's messages go to stderr, and
``--json`` (also stdout) is refused with it.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from test_diagnose_rules import slow_engine

from dualpath_cli.api.fake import FakeClient
from dualpath_cli.cli import source
from dualpath_cli.cli.app import main
from dualpath_cli.cli.output_target import output_path, writes_stdout

MOONCAKE = ('{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}\n'
            '{"timestamp": 5, "input_length": 700, "output_length": 5, "hash_ids": [1, 2]}\n')


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def _no_dash_file(tmp_path: Path) -> None:
    assert not (tmp_path / "-").exists()


def test_trace_gen_dash_writes_the_trace_to_stdout(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _run(["trace", "gen", "--agents", "3", "-o", "-"], capsys)
    assert rc == 0, err
    lines = out.splitlines()
    assert json.loads(lines[0])["format"] == "dualpath-trace" and len(lines) == 4
    assert "wrote the trace to stdout" in err and "agents" in err  # the table on stderr
    _no_dash_file(tmp_path)


def test_trace_convert_dash_writes_the_trace_to_stdout(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "log.jsonl"
    log.write_text(MOONCAKE)
    rc, out, err = _run(["trace", "convert", str(log), "-o", "-"], capsys)
    assert rc == 0, err
    assert json.loads(out.splitlines()[0])["format"] == "dualpath-trace"
    assert "requests ->" in err
    _no_dash_file(tmp_path)


def test_config_init_dash_writes_yaml_to_stdout(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _run(["config", "init", "-o", "-"], capsys)
    assert rc == 0 and "cluster:" in out and err == ""
    _no_dash_file(tmp_path)


def test_record_dash_writes_plain_lines_to_stdout(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    ev = slow_engine()
    fake = FakeClient(list(ev.views), ev.decisions)
    monkeypatch.setattr(source, "connect", lambda ref, timeout: fake)
    rc, out, err = _run(["record", "--window", "1s", "--interval", "250ms", "-o", "-"], capsys)
    assert rc == 0, err
    kinds = [json.loads(line)["kind"] for line in out.splitlines()]
    assert kinds[0] == "header" and kinds[-1] == "end" and kinds.count("sample") == 5
    assert "-> stdout" in err
    _no_dash_file(tmp_path)


@pytest.mark.parametrize("argv", [
    ["trace", "gen", "--agents", "3", "-o", "-", "--json"],
    ["trace", "convert", "log.jsonl", "-o", "-", "--json"],
    ["record", "--window", "1s", "-o", "-", "--json"],
])
def test_dash_with_json_is_refused(argv: list[str], tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "log.jsonl").write_text(MOONCAKE)
    rc, out, err = _run(argv, capsys)
    assert rc == 2 and out == "" and "both write stdout" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("argv", [
    ["trace", "gen", "--agents", "3", "-o", ""],
    ["trace", "convert", "log.jsonl", "-o", ""],
    ["config", "init", "-o", ""],
    ["record", "--window", "1s", "-o", ""],
])
def test_empty_output_is_refused(argv: list[str], tmp_path: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "log.jsonl").write_text(MOONCAKE)
    rc, _, err = _run(argv, capsys)
    assert rc == 2 and ("empty path" in err or "is a directory" in err)


def test_dot_slash_dash_is_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _run(["trace", "gen", "--agents", "3", "-o", "./-"], capsys)
    assert rc == 0, err
    assert (tmp_path / "-").is_file() and "format" not in out
    assert output_path("./-") == Path("./-") and writes_stdout("-") and not writes_stdout("./-")


def test_record_to_a_file_is_unchanged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    ev = slow_engine()
    monkeypatch.setattr(source, "connect", lambda ref, timeout: FakeClient(list(ev.views),
                                                                           ev.decisions))
    rc, out, _ = _run(["record", "--window", "1s", "--interval", "250ms", "-o", "r.jsonl.gz",
                       "--json"], capsys)
    assert rc == 0 and json.loads(out)["bytes"] > 0
    with gzip.open(tmp_path / "r.jsonl.gz", "rt") as handle:
        assert json.loads(handle.readline())["kind"] == "header"
