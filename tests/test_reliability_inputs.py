"""The bad inputs of issue 17 ("found when tried as a new user would"), each refused in one
line that names the input, before any work starts; and what a write must not replace."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fuzzing import Sandbox, run_cli, stubbed

from dualpath_cli.atomicio import NotRegularFileError, atomic_write_text, write_target
from dualpath_cli.errors import ConfigError, TraceError, UnitError
from dualpath_cli.limits import LimitError, check, check_finite, limit_value
from dualpath_cli.units import parse_bandwidth, parse_bytes, parse_duration, parse_tokens


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    sandbox = Sandbox.create(tmp_path_factory.mktemp("inputs"))
    with stubbed():
        yield sandbox
    sandbox.close()


def _refused(box: Sandbox, argv: list[str], *words: str) -> str:
    outcome = run_cli(argv, box)
    assert outcome.ok, outcome.describe()
    assert outcome.exit_code != 0, outcome.describe()
    error = [line for line in outcome.output.splitlines() if line.startswith("error:")]
    assert len(error) == 1, outcome.describe()
    for word in words:
        assert word in error[0], error[0]
    return error[0]


CASES = [
    (["bench", "--agents", "1000000000"], "--agents", "DUALPATH_LIMIT_AGENTS"),
    (["bench", "--agents", "100000", "--turns", "1000"], "--agents x --turns"),
    (["bench", "--pd", "1000P1000D"], "engine processes", "DUALPATH_LIMIT_ENGINES"),
    (["bench", "--aps", "inf"], "--aps", "finite"),
    (["bench", "--store", "/dev/null"], "--store", "not a directory"),
    (["bench", "--store", "/proc"], "--store", "not a writable directory"),
    (["bench", "--snic-bw", "0"], "--snic-bw", "greater than zero"),
    (["bench", "--snic-bw", "1e308GB/s"], "--snic-bw", "too large"),
    (["storage", "bench", "--block-size", "1TiB"], "--block-size", "DUALPATH_LIMIT_BLOCK"),
    (["storage", "bench", "--seconds", "nan"], "--seconds", "finite"),
    (["storage", "bench", "--seconds", "inf"], "--seconds", "finite"),
    (["storage", "bench", "--seconds", "-0"], "--seconds", "out of range"),
    (["storage", "bench", "--root", "/dev/null"], "--root", "not a directory"),
    (["storage", "bench", "--queue-depth", "10000000"], "--queue-depth"),
    (["sim", "capacity", "--steps", "1000000000"], "--steps"),
    (["tune", "alpha", "--snic", "0", "--latency", "1ms"], "--snic", "greater than zero"),
    (["tune", "beta", "--window", "-0"], "-0", "non-negative"),
    (["config", "validate", "/dev/zero"], "/dev/zero", "DUALPATH_LIMIT_CONFIG_BYTES"),
    (["config", "show", "--set", "scheduler.alpha=١٢٣"], "scheduler.alpha"),
    (["config", "init", "-o", ""], "empty path"),
    (["trace", "stats", "/dev/zero"], "/dev/zero", "longer than"),
    # a URL with a newline was echoed into the token error, which then ran onto two lines
    (["tune", "auto", "--max-drop", "0.1", "--url", "[\u00ae\n\u00960", "--yes"], "--url",
     "not a URL"),
    (["status", "--url", "http://a b"], "not a URL"),
]


@pytest.mark.parametrize("argv_words", CASES, ids=lambda c: " ".join(c[0])[:60])
def test_bad_input_is_one_line(box: Sandbox, argv_words: tuple[Any, ...]) -> None:
    argv, *words = argv_words
    _refused(box, argv, *words)


def test_deep_nesting_and_long_numbers(box: Sandbox) -> None:
    _refused(box, ["config", "validate", str(box.root / "deep.yaml")], "nested")
    _refused(box, ["trace", "stats", str(box.root / "deep.json")], "nested too deeply")
    big = box.root / "bigint.yaml"
    big.write_text("scheduler:\n  alpha: " + "9" * 5000 + "\n")
    _refused(box, ["config", "validate", str(big)], "scheduler.alpha")
    trace = box.root / "bigint.jsonl"
    trace.write_text('{"format": "dualpath-trace", "version": ' + "9" * 5000 + "}\n")
    _refused(box, ["trace", "stats", str(trace)], "too long")


def test_trace_gen_keeps_an_existing_file(box: Sandbox) -> None:
    target = box.root / "kept.jsonl"
    target.write_text("mine\n")
    _refused(box, ["trace", "gen", "--agents", "2", "-o", str(target)], "--force")
    assert target.read_text() == "mine\n"
    outcome = run_cli(["trace", "gen", "--agents", "2", "--base-agents", "2", "-o",
                       str(target), "--force"], box)
    assert outcome.ok and outcome.exit_code == 0, outcome.describe()
    assert target.read_text().startswith('{"format"')


def test_storage_verify_creates_nothing(box: Sandbox) -> None:
    empty = box.root / "not-a-store"
    empty.mkdir()
    _refused(box, ["storage", "verify", str(empty)], "not a dualpath store")
    assert list(empty.iterdir()) == []
    _refused(box, ["storage", "inspect", "/proc"], "not a dualpath store")


def test_a_single_turn_bench_blames_no_set(box: Sandbox) -> None:
    """It used to fail with '--set: scheduler.reference_context: 0 ...' (no --set given):
    now it reaches the run (stubbed here)."""
    outcome = run_cli(["bench", "--turns", "1", "--agents", "2", "--snic-bw", "1GB/s"], box)
    assert outcome.ok, outcome.describe()
    assert "--set" not in outcome.output


# --- units and limits ------------------------------------------------------------------

@pytest.mark.parametrize("text", ["١٢٣", "１２", "-0", "-0.0KiB", "9" * 5000, "1e309", "nan"])
def test_units_refuse(text: str) -> None:
    for parse in (parse_bytes, parse_tokens, parse_duration, parse_bandwidth):
        with pytest.raises(UnitError):
            parse(text)


def test_units_refuse_overflow_after_scaling() -> None:
    with pytest.raises(UnitError, match="too large"):
        parse_bandwidth("1e308GB/s")
    with pytest.raises(UnitError):
        parse_bytes(10**5000)
    assert parse_bytes("8KiB") == 8192 and parse_duration(" 3s ") == 3.0


def test_limits_name_their_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(LimitError, match="DUALPATH_LIMIT_AGENTS=N"):
        check("agents", 10**6, "--agents")
    monkeypatch.setenv("DUALPATH_LIMIT_AGENTS", "2000000")
    check("agents", 10**6, "--agents")  # raised: accepted
    assert limit_value("agents") == 2_000_000
    with pytest.raises(LimitError):
        check("agents", 10**5000, "--agents")  # no OverflowError on a huge int
    monkeypatch.setenv("DUALPATH_LIMIT_AGENTS", "lots")
    with pytest.raises(LimitError, match="positive number"):
        limit_value("agents")


def test_negative_zero_is_not_positive() -> None:
    with pytest.raises(Exception, match="out of range"):
        check_finite(-0.0, "--window", positive=True)
    assert check_finite(0.5, "--window", positive=True) == 0.5


# --- what a write must not replace -------------------------------------------------------

def test_atomic_write_refuses_special_files(tmp_path: Path) -> None:
    sock_path = tmp_path / "sock"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(sock_path))
        with pytest.raises(NotRegularFileError, match="socket"):
            atomic_write_text(sock_path, "x")
        assert sock_path.is_socket()
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(NotRegularFileError, match="pipe"):
        atomic_write_text(tmp_path / "fifo", "x")
    with pytest.raises(NotRegularFileError, match="directory"):
        atomic_write_text(tmp_path, "x")
    with pytest.raises(NotRegularFileError):
        write_target("")
    with pytest.raises(NotRegularFileError, match="character device"):
        write_target("/dev/null")  # checked only: nothing is written
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo", "sock"]


def test_atomic_write_goes_through_a_symlink(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    target = tmp_path / "real" / "config.yaml"
    target.write_text("old\n")
    link = tmp_path / "link.yaml"
    link.symlink_to(target)
    atomic_write_text(link, "new\n")
    assert link.is_symlink() and target.read_text() == "new\n"
    dangling = tmp_path / "dangling.yaml"
    dangling.symlink_to(tmp_path / "real" / "later.yaml")
    atomic_write_text(dangling, "made\n")
    assert dangling.is_symlink() and (tmp_path / "real" / "later.yaml").read_text() == "made\n"


def test_tune_set_writes_through_a_symlinked_config(box: Sandbox) -> None:
    outcome = run_cli(["tune", "set", "--config", str(box.root / "link.yaml"),
                       "scheduler.alpha=16KiB"], box)
    assert outcome.ok and outcome.exit_code == 0, outcome.describe()
    assert (box.root / "link.yaml").is_symlink()
    assert "16KiB" in (box.root / "target.yaml").read_text()


def test_readers_refuse_cleanly(tmp_path: Path) -> None:
    from dualpath_cli.config.layers import read_yaml_file
    from dualpath_cli.workload.trace_io import read_trace

    with pytest.raises(ConfigError, match="directory"):
        read_yaml_file(tmp_path, "file")
    with pytest.raises(TraceError, match="directory"):
        read_trace(tmp_path)


def test_nul_bytes_in_paths_are_one_line(box: Sandbox) -> None:
    """Found by the long fuzz: os.stat/open raise ValueError (not OSError) on a NUL byte."""
    _refused(box, ["config", "init", "-o", "a\x00b", "--force"], "NUL byte")
    _refused(box, ["trace", "gen", "--agents", "2", "-o", "a\x00b"], "NUL byte")
    bad_tag = box.root / "tag.yaml"
    bad_tag.write_text("storage:\n  block_size: !!python/object:os.system x\n")
    _refused(box, ["config", "validate", str(bad_tag)], "storage.block_size")


def test_docs_list_every_limit_with_its_variable() -> None:
    """docs/reliability.md's limits table is exactly LIMITS, each with its variable."""
    from dualpath_cli.limits import LIMITS

    text = (Path(__file__).resolve().parent.parent / "docs" / "reliability.md").read_text()
    section = text.split("## Resource limits", 1)[1].split("\n## ", 1)[0]
    rows = {line.split("|")[1].strip(): line for line in section.splitlines()
            if line.startswith("| ") and not line.startswith("| limit ")}
    assert set(rows) == set(LIMITS)
    for name, lim in LIMITS.items():
        assert f"`{lim.env_var}`" in rows[name], name
