"""Recordings that did not end cleanly, and the exit-code contract of check-style commands.

A recording is written as it comes (services/recording_stream.py): an interrupted writer
finishes its file, a killed one leaves a file that reads up to its last flush (the dropped
tail said once on stderr). Check-style commands (status, diagnose, storage verify) that
cannot look exit 3 (UNKNOWN) with one line, and ``--json`` prints one object even then
(cli/checks.py). The real signals are in tests/test_record_signals.py.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_diagnose_rules import nic_throttled

from dualpath_cli.cli.app import main
from dualpath_cli.cli.source import ClusterRef
from dualpath_cli.cli.top_cmd import make_source
from dualpath_cli.services.recording import read_recording, write_recording
from dualpath_cli.services.recording_stream import LineWriter, Tail, complete_lines
from dualpath_cli.telemetry.recording import FORMAT, VERSION, Sample, json_line, sample_line

SUFFIXES = [".jsonl", ".jsonl.gz", ".jsonl.zst"]


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_a_cut_file_reads_up_to_its_last_flush(suffix: str, tmp_path: Path) -> None:
    path = tmp_path / f"x{suffix}"
    out = LineWriter(path)
    for i in range(3):
        out.write(json.dumps({"i": i}) + "\n")
    out.flush()
    out.write(json.dumps({"i": 3}) + "\n")
    out.flush()
    flushed = path.stat().st_size
    out.write(json.dumps({"i": 4}) + "\n")
    out.close()
    os.truncate(path, path.stat().st_size - 3)  # the writer died inside its last write
    tail = Tail()
    lines = [json.loads(x) for x in complete_lines(path, tail)]
    assert [x["i"] for x in lines] == [0, 1, 2, 3]
    assert tail.cut and tail.dropped == path.stat().st_size - flushed
    whole = tmp_path / f"whole{suffix}"
    with LineWriter(whole) as w:
        w.write("{}\n")
        w.flush()
        w.write("{}\n")
    tail = Tail()
    assert len(list(complete_lines(whole, tail))) == 2 and not tail.cut


def _killed(path: Path, samples: list[Sample], keep: int) -> None:
    """A recording whose writer was killed inside its write of sample ``keep + 1``: ``keep``
    samples flushed, then the next one's line (gzip member, zstd frame) cut short."""
    with LineWriter(path) as w:
        w.write(json_line({"kind": "header", "format": FORMAT, "version": VERSION,
                           "source": "test", "interval_s": 1.0}))
        for s in samples[:keep]:
            w.write(sample_line(s))
        w.flush()
        w.write(sample_line(samples[keep]))
    os.truncate(path, path.stat().st_size - 3)


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_diagnose_and_top_read_a_killed_recording_and_say_what_was_dropped(
        suffix: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ev = nic_throttled()
    path = tmp_path / f"killed{suffix}"
    _killed(path, list(ev.samples), 6)
    said: list[str] = []
    rec = read_recording(path, on_cut=said.append)
    assert len(rec.samples) == 6 and not rec.complete
    assert len(said) == 1 and "dropped the last" in said[0]
    assert rec.header["dropped_bytes"] > 0
    rc, out, err = run(["diagnose", "perf-drop", "--from", str(path), "--json"], capsys)
    assert rc == 2 and json.loads(out)["samples"] == 6
    assert err.count("cut short") == 1 and "bytes" in err
    source = make_source(ClusterRef(), path)  # what `dualpath top --from` replays
    assert source is not None
    assert capsys.readouterr().err.count("cut short") == 1


def test_an_interrupted_writer_finishes_its_file(tmp_path: Path) -> None:
    ev = nic_throttled()

    def interrupted() -> Iterator[Sample]:
        yield from ev.samples[:4]
        raise KeyboardInterrupt

    counts: dict[str, int] = {}
    path = tmp_path / "x.jsonl.zst"
    with pytest.raises(KeyboardInterrupt):
        write_recording(path, {"source": "test"}, interrupted(), list(ev.decisions),
                        counts=counts)
    assert counts["samples"] == 4
    rec = read_recording(path)
    assert rec.complete and len(rec.samples) == 4 and rec.header["dropped_bytes"] == 0


def test_a_recording_is_readable_while_it_is_written(tmp_path: Path) -> None:
    ev = nic_throttled()
    path = tmp_path / "live.jsonl.gz"
    seen: list[int] = []

    def watched() -> Iterator[Sample]:
        for s in ev.samples[:5]:
            yield s
            seen.append(len(read_recording(path).samples))

    write_recording(path, {"source": "test"}, watched(), [], flush_every_s=0.0)
    assert seen == [1, 2, 3, 4, 5]  # each flushed as it came


# --- exit codes: a check that cannot look is UNKNOWN, --json prints one object -----------------
def test_storage_verify_of_a_missing_path_is_unknown_with_one_object(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(["storage", "verify", str(tmp_path / "not-there"), "--json"], capsys)
    assert rc == 3
    doc = json.loads(out)
    assert doc["severity"] == "UNKNOWN" and doc["exit_code"] == 3
    assert "not a directory" in doc["error"] and doc["corrupt"] == []
    assert len(err.strip().splitlines()) == 1
    rc, out, _ = run(["storage", "verify", str(tmp_path), "--json"], capsys)
    assert rc == 3 and "not a dualpath store" in json.loads(out)["error"]
    rc, out, _ = run(["storage", "verify", "--json"], capsys)  # no ROOT: a usage error
    assert rc == 3 and "Missing argument" in json.loads(out)["error"]


@pytest.mark.parametrize("argv,needle", [
    (["status", "--json", "--bogus"], "No such option"),
    (["diagnose", "--json"], "Missing argument"),
    (["diagnose", "nope", "--from", "/nonexistent.jsonl", "--json"], "workflow"),
    (["status", "--url", "http://127.0.0.1:1", "--json"], "cannot reach"),
])
def test_check_style_commands_that_cannot_look_are_unknown(
        argv: list[str], needle: str, capsys: pytest.CaptureFixture[str],
        clean_config: Path) -> None:
    rc, out, err = run(argv, capsys)
    assert rc == 3, err
    doc = json.loads(out)  # one object
    assert doc["severity"] == "UNKNOWN" and doc["exit_code"] == 3 and needle in doc["error"]
    assert len(err.strip().splitlines()) <= 1
