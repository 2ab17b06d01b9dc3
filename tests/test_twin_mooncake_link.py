"""Mooncake request logs linked into agent trajectories (workload/mooncake_link.py) and
`dualpath trace convert`; `sim` takes the log directly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dualpath_cli.cli.app import main
from dualpath_cli.workload.mooncake import MooncakeRequest
from dualpath_cli.workload.mooncake_link import link_requests, read_agent_trace
from dualpath_cli.workload.trace_io import read_trace


def req(t: float, length: int, out: int, ids: list[int]) -> MooncakeRequest:
    return MooncakeRequest(t, length, out, tuple(ids))


#: Two conversations sharing a system prompt (block 1), one forked from the other's first turn,
#: and a stranger; out of order in the list (linking goes by timestamp).
LOG = [
    req(0, 1100, 50, [1, 2, 3]),         # A1: full blocks 1,2 (key 2); block 3 partial
    req(10, 1700, 40, [1, 2, 4, 5]),     # A2 extends A1 (starts with 1,2): key 4
    req(5, 1100, 20, [1, 9, 10]),        # B1: only the system prompt in common: new
    req(20, 2200, 10, [1, 2, 4, 6, 7]),  # A3 extends A2 (key 4)
    req(30, 1200, 5, [1, 2, 8]),         # A1' forks from A1's prefix, but A1 moved on: new
    req(40, 300, 0, [20]),               # a stranger (< one block: no key)
]


def test_linking_rule_and_counts() -> None:
    trace, counts = link_requests(LOG)
    turns = [[(t.append, t.gen) for t in tr.turns] for tr in trace.trajectories]
    assert turns == [
        [(1100, 50), (1700 - 1150, 40), (2200 - 1740, 10)],  # A
        [(1100, 20)],                                         # B
        [(1200, 5)],                                          # the fork
        [(300, 1)],                                           # output 0 generates 1
    ]
    assert counts.requests == 6 and counts.trajectories == 4 and counts.linked == 2
    assert counts.single_turn == 3 and counts.max_turns == 3 and counts.zero_outputs == 1
    assert trace.header.max_len == counts.max_len == 2210
    assert "full-block prefix" in trace.header.generator["rule"]


def test_a_request_that_does_not_grow_starts_a_new_conversation() -> None:
    trace, counts = link_requests([req(0, 1100, 5, [1, 2, 3]), req(1, 1024, 5, [1, 2])])
    assert counts.trajectories == 2 and counts.linked == 0


def write_log(path: Path) -> Path:
    path.write_text("".join(json.dumps({"timestamp": r.timestamp_ms,
                                        "input_length": r.input_length,
                                        "output_length": r.output_length,
                                        "hash_ids": list(r.hash_ids)}) + "\n" for r in LOG))
    return path


def test_trace_convert_writes_a_dualpath_trace_and_reports_counts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = write_log(tmp_path / "mc.jsonl")
    out = tmp_path / "agents.jsonl"
    assert main(["trace", "convert", str(log), "-o", str(out), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["requests"], data["trajectories"], data["linked"]) == (6, 4, 2)
    assert [t.num_turns for t in read_trace(out).trajectories] == [3, 1, 1, 1]
    assert read_agent_trace(log)[0].trajectories == read_trace(out).trajectories
    assert main(["trace", "convert", str(out), "-o", str(tmp_path / "x.jsonl")]) == 2
    assert "not a Mooncake request log" in capsys.readouterr().err


def test_sim_runs_a_mooncake_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = write_log(tmp_path / "mc.jsonl")
    assert main(["sim", "run", "--trace", str(log), "--model", "ds27b", "--pd", "1P1D",
                 "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["turns"] == 6 and data["agents"] == 4
