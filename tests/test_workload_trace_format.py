"""The versioned JSONL trace format: round trip, atomic writes, one-line errors per bad line."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from dualpath_cli.errors import TraceError
from dualpath_cli.workload import trace_io
from dualpath_cli.workload.build import synthetic_trace
from dualpath_cli.workload.trace_format import Trace, TraceHeader, decode_lines, encode_lines
from dualpath_cli.workload.trace_io import detect_format, read_trace, write_trace
from dualpath_cli.workload.trajectory import Trajectory, Turn

HEADER = '{"format": "dualpath-trace", "version": 1, "max_len": 1000, "generator": {}}'
GOOD = '{"agent_id": 0, "token_seed": 5, "turns": [[100, 10], [20, 2]]}'


def test_round_trip_through_a_file(tmp_path: Path) -> None:
    trace = synthetic_trace(32_000, 40, 3)
    path = tmp_path / "t.jsonl"
    write_trace(path, trace)
    back = read_trace(path)
    assert back == trace
    assert back.header.generator["seed"] == 3
    assert detect_format(path) == "dualpath"
    assert [p.name for p in tmp_path.iterdir()] == ["t.jsonl"]  # no temp file left


def test_round_trip_keeps_augmentation_fields() -> None:
    trace = Trace(TraceHeader(50, {"name": "x"}),
                  (Trajectory(3, (Turn(7, 1), Turn(4, 2)), token_seed=9, prefix_seed=11,
                              source=2),))
    lines = list(encode_lines(trace))
    assert json.loads(lines[0]) == {"format": "dualpath-trace", "version": 1, "max_len": 50,
                                    "generator": {"name": "x"}}
    assert json.loads(lines[1]) == {"agent_id": 3, "token_seed": 9, "prefix_seed": 11,
                                    "source": 2, "turns": [[7, 1], [4, 2]]}
    assert decode_lines(lines, "mem") == trace


def test_blank_lines_are_skipped_and_line_numbers_count_them() -> None:
    trace = decode_lines(["", HEADER, "  ", GOOD, ""], "f")
    assert trace.trajectories[0].turns == (Turn(100, 10), Turn(20, 2))
    with pytest.raises(TraceError, match=r"^f:4: invalid JSON"):
        decode_lines([HEADER, GOOD, "", "{oops"], "f")


BAD_HEADERS = [
    ("[1, 2]", "expected a JSON object, got list"),
    ('{"agent_id": 0}', "not a dualpath trace"),
    ('{"format": "dualpath-trace", "version": 2, "max_len": 10}', "unsupported trace version 2"),
    ('{"format": "dualpath-trace", "version": "1", "max_len": 10}', "'version' must be an int"),
    ('{"format": "dualpath-trace", "version": 1}', "'max_len' must be a positive integer"),
    ('{"format": "dualpath-trace", "version": 1, "max_len": -5}', "'max_len' must be a pos"),
    ('{"format": "dualpath-trace", "version": 1, "max_len": 5, "x": 1}', "unknown header field"),
    ('{"format": "dualpath-trace", "version": 1, "max_len": 5, "generator": 3}',
     "'generator' must be an object"),
]


@pytest.mark.parametrize(("line", "reason"), BAD_HEADERS)
def test_bad_header(line: str, reason: str) -> None:
    with pytest.raises(TraceError) as err:
        decode_lines([line, GOOD], "trace.jsonl")
    assert str(err.value).startswith("trace.jsonl:1: ")
    assert reason in str(err.value)


BAD_LINES = [
    ('{"agent_id": 1, "token_seed": 5, "turns": [[1, 1]]', "invalid JSON"),
    ("42", "expected a JSON object, got int"),
    ('{"token_seed": 5, "turns": [[1, 1]]}', "missing field 'agent_id'"),
    ('{"agent_id": 1, "turns": [[1, 1]]}', "missing field 'token_seed'"),
    ('{"agent_id": 1, "token_seed": 5}', "missing field 'turns'"),
    ('{"agent_id": 1, "token_seed": 5, "turns": [[1, 1]], "extra": 0}', "unknown field 'extra'"),
    ('{"agent_id": -1, "token_seed": 5, "turns": [[1, 1]]}', "'agent_id' must be an integer"),
    ('{"agent_id": true, "token_seed": 5, "turns": [[1, 1]]}', "'agent_id' must be an integer"),
    ('{"agent_id": 1, "token_seed": 1.5, "turns": [[1, 1]]}', "'token_seed' must be an int"),
    ('{"agent_id": 1, "token_seed": 5, "prefix_seed": "a", "turns": [[1, 1]]}', "'prefix_seed'"),
    ('{"agent_id": 1, "token_seed": 5, "source": -2, "turns": [[1, 1]]}', "'source' must be"),
    ('{"agent_id": 1, "token_seed": 5, "turns": []}', "non-empty list"),
    ('{"agent_id": 1, "token_seed": 5, "turns": {"a": 1}}', "non-empty list"),
    ('{"agent_id": 1, "token_seed": 5, "turns": [[1, 1], [2]]}', "turn 2: expected [append, gen]"),
    ('{"agent_id": 1, "token_seed": 5, "turns": [[-3, 1]]}', "turn 1: append must be a positive"),
    ('{"agent_id": 1, "token_seed": 5, "turns": [[3, 0]]}', "turn 1: gen must be a positive"),
    ('{"agent_id": 1, "token_seed": 5, "turns": [[3, "2"]]}', "turn 1: gen must be a positive"),
    ('{"agent_id": 1, "token_seed": 5, "turns": [[900, 50], [40, 20]]}',
     "agent 1: total 1010 tokens exceeds max_len 1000"),
    ('{"agent_id": 0, "token_seed": 6, "turns": [[1, 1]]}',
     "duplicate agent_id 0 (first on line 2)"),
]


@pytest.mark.parametrize(("line", "reason"), BAD_LINES)
def test_bad_trajectory_line_names_file_line_and_reason(line: str, reason: str) -> None:
    with pytest.raises(TraceError) as err:
        decode_lines([HEADER, GOOD, line], "trace.jsonl")
    message = str(err.value)
    assert message.startswith("trace.jsonl:3: "), message
    assert reason in message
    assert "\n" not in message


def test_empty_input() -> None:
    with pytest.raises(TraceError, match="^t: empty trace"):
        decode_lines(["", "  "], "t")


def test_bad_line_in_a_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(f"{HEADER}\n{GOOD}\nnot json\n")
    with pytest.raises(TraceError, match=rf"^{path}:3: invalid JSON"):
        read_trace(path)


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot read"):
        read_trace(tmp_path / "missing.jsonl")
    with pytest.raises(TraceError, match="cannot read"):
        read_trace(tmp_path)
    binary = tmp_path / "bin.jsonl"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(TraceError, match="not a UTF-8 text file"):
        read_trace(binary)


def test_write_to_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot write"):
        write_trace(tmp_path / "no" / "t.jsonl", synthetic_trace(32_000, 2, 1))


def test_failed_write_leaves_old_file_and_no_temp(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text("old\n")

    def broken(trace: Trace) -> Iterator[str]:
        yield HEADER
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(trace_io, "encode_lines", broken)
    with pytest.raises(RuntimeError):
        write_trace(path, synthetic_trace(32_000, 2, 1))
    assert path.read_text() == "old\n"
    assert os.listdir(tmp_path) == ["t.jsonl"]


def test_detect_format(tmp_path: Path) -> None:
    moon = tmp_path / "m.jsonl"
    moon.write_text('\n{"timestamp": 0, "input_length": 10, "output_length": 1, '
                    '"hash_ids": [0]}\n')
    assert detect_format(moon) == "mooncake"
    other = tmp_path / "o.jsonl"
    other.write_text('{"hello": 1}\n')
    with pytest.raises(TraceError, match=r"o.jsonl:1: unknown trace format"):
        detect_format(other)
    empty = tmp_path / "e.jsonl"
    empty.write_text("\n")
    with pytest.raises(TraceError, match="empty file"):
        detect_format(empty)
