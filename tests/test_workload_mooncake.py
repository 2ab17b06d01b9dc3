"""Mooncake trace reader and the unbounded-cache prefix-hit ratio, checked by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dualpath_cli.errors import TraceError
from dualpath_cli.workload.mooncake import decode_mooncake, mooncake_stats, prefix_hits
from dualpath_cli.workload.trace_io import read_mooncake


def line(ts: float, inp: int, out: int, ids: list[int]) -> str:
    return json.dumps({"timestamp": ts, "input_length": inp, "output_length": out,
                       "hash_ids": ids})


HAND = [
    line(0, 1000, 10, [1, 2]),      # nothing seen yet: hit 0
    line(20, 1200, 20, [1, 2, 3]),  # 1, 2 and (from the t=5 request) 3 seen: all 1200
    line(10, 600, 30, [5, 2]),      # arrives 3rd; 5 unseen stops the walk although 2 is seen: 0
    line(30, 700, 40, [1, 4]),      # 1 seen, 4 not: 512
    line(30, 300, 50, [1]),         # partial block seen: min(512, 300) = 300
    line(5, 512, 1, [3]),           # arrives 2nd, 3 not seen yet: 0 (file order would say 512)
]


def test_hand_example() -> None:
    requests = decode_mooncake(HAND, "hand")
    assert prefix_hits(requests) == [0, 1200, 0, 512, 300, 0]
    stats = mooncake_stats(requests)
    assert stats.requests == 6
    assert stats.input_tokens == 4312
    assert stats.hit_tokens == 2012
    assert stats.prefix_hit_ratio == pytest.approx(2012 / 4312)
    assert stats.mean_input_length == pytest.approx(4312 / 6)
    assert stats.mean_output_length == pytest.approx(151 / 6)
    assert stats.unique_blocks == 5
    assert stats.duration_s == pytest.approx(0.03)


def test_repeated_identical_requests_hit_fully() -> None:
    same = [line(0, 1024, 1, [7, 8]), line(1, 1024, 1, [7, 8]), line(2, 1024, 1, [7, 8])]
    assert mooncake_stats(decode_mooncake(same, "s")).prefix_hit_ratio == pytest.approx(2 / 3)


def test_public_sample_lines_parse(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text(
        '{"timestamp": 0, "input_length": 6755, "output_length": 500, '
        '"hash_ids": [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]}\n'
        '{"timestamp": 3052, "input_length": 2287, "output_length": 316, '
        '"hash_ids": [0, 42, 43, 44, 45], "session_id": "ignored"}\n')
    requests = read_mooncake(path)
    assert [r.input_length for r in requests] == [6755, 2287]
    assert prefix_hits(requests) == [0, 512]


BAD = [
    ("{", "invalid JSON"),
    ("[]", "expected a JSON object"),
    ('{"input_length": 5, "output_length": 1, "hash_ids": [0]}', "missing field 'timestamp'"),
    ('{"timestamp": 0, "output_length": 1, "hash_ids": [0]}', "missing field 'input_length'"),
    ('{"timestamp": 0, "input_length": 5, "hash_ids": [0]}', "missing field 'output_length'"),
    ('{"timestamp": 0, "input_length": 5, "output_length": 1}', "missing field 'hash_ids'"),
    (line(-1, 5, 1, [0]), "'timestamp' must be a non-negative number"),
    ('{"timestamp": "0", "input_length": 5, "output_length": 1, "hash_ids": [0]}', "timestamp"),
    (line(0, 0, 1, []), "'input_length' must be a positive integer"),
    (line(0, 5, -1, [0]), "'output_length' must be a non-negative integer"),
    (line(0, 5, 1, [-1]), "'hash_ids' must be a list of non-negative integers"),
    ('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": 3}', "'hash_ids'"),
    (line(0, 600, 1, [1, 2, 3]), "3 hash_ids for input_length 600: at most 2 blocks"),
]


@pytest.mark.parametrize(("bad", "reason"), BAD)
def test_bad_lines_name_file_and_line(bad: str, reason: str) -> None:
    with pytest.raises(TraceError) as err:
        decode_mooncake([line(0, 5, 1, [0]), "", bad], "m.jsonl")
    assert str(err.value).startswith("m.jsonl:3: ")
    assert reason in str(err.value)


def test_empty() -> None:
    with pytest.raises(TraceError, match="empty Mooncake trace"):
        decode_mooncake(["\n"], "m")
