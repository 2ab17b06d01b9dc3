"""The decision ring: bounded, numbered, counted apart; and the NIC rate window."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dualpath_cli.runtime.decisions import DecisionLog
from dualpath_cli.runtime.readmodel import Rate
from dualpath_cli.telemetry.registry import MetricsRegistry


def _fields(rid: int, side: str = "pe", pe_class: str = "C2",
            de_class: str = "normal") -> dict[str, Any]:
    return {"at": 1.0, "rid": rid, "attempt": 0, "agent": 0, "turn": rid, "length": 32,
            "cached": 16, "pe": 0, "de": 1, "de_group": 1, "side": side, "pe_tokens": 16,
            "de_tokens": 0, "pe_read_q": 0, "de_read_q": 0, "pe_class": pe_class,
            "de_class": de_class, "z": 10.0, "inputs": {"alpha": 5}}


def test_ring_keeps_the_last_n_and_counts_everything(tmp_path: Path) -> None:
    registry = MetricsRegistry()
    log = DecisionLog(3, registry, tmp_path / "decisions.jsonl")
    assert log.since(-1) == [] and log.last_seq is None
    for rid in range(7):
        seq = log.record(**_fields(rid, side="de" if rid % 2 else "pe",
                                   de_class="high_token" if rid == 6 else "normal"))
        assert seq == rid + 1
    log.close()
    assert len(log) == 3 and log.last_seq == 7
    assert [d.seq for d in log.since(-1)] == [5, 6, 7]
    assert [d.seq for d in log.since(0)] == [5, 6, 7]  # a reader that fell behind: a gap
    assert [d.seq for d in log.since(5)] == [6, 7]
    assert log.since(7) == [] and log.since(100) == []
    counts = log.counts()
    assert counts.total == 7
    assert counts.side == {"pe": 4, "de": 3, "split": 0}
    assert counts.pe_class == {"C1": 0, "C2": 7, "C3": 0}
    assert counts.de_class == {"normal": 6, "high_token": 1}
    rows = registry.snapshot()["dualpath_scheduler_decisions_total"]
    assert sum(r["value"] for r in rows) == 7
    lines = (tmp_path / "decisions.jsonl").read_text().splitlines()
    assert [json.loads(line)["seq"] for line in lines] == list(range(1, 8))
    assert json.loads(lines[0])["inputs"] == {"alpha": 5}


def test_ring_size_must_be_positive() -> None:
    with pytest.raises(ValueError, match="must be >= 1"):
        DecisionLog(0, MetricsRegistry())


def test_rate_waits_for_a_full_window() -> None:
    r = Rate(window_s=0.5)
    r.update(10.0, 0)
    r.update(10.2, 1000)
    assert r.rate is None  # not a full window yet
    r.update(10.5, 2000)
    assert r.rate == pytest.approx(4000.0)
    r.update(10.6, 100)  # the counter restarted (an engine came back): start over
    r.update(11.0, 100)
    assert r.rate == pytest.approx(4000.0)
    r.update(11.1, 600)
    assert r.rate == pytest.approx(1000.0)


def test_deferred_inputs_are_built_once_when_first_read() -> None:
    log = DecisionLog(4, MetricsRegistry())
    calls: list[int] = []

    def inputs() -> dict[str, Any]:
        calls.append(1)
        return {"alpha": 7}

    fields = _fields(1)
    fields["inputs"] = inputs
    seq = log.record(**fields)
    assert calls == []  # recording does not build them
    assert [d.inputs for d in log.since(-1)] == [{"alpha": 7}]
    assert [d.inputs for d in log.of_request(1)] == [{"alpha": 7}]
    assert calls == [1] and seq == 1


def test_deferred_inputs_are_written_at_once_to_the_file(tmp_path: Path) -> None:
    log = DecisionLog(4, MetricsRegistry(), tmp_path / "d.jsonl")
    fields = _fields(3)
    fields["inputs"] = lambda: {"beta": 2}
    log.record(**fields)
    log.close()
    row = json.loads((tmp_path / "d.jsonl").read_text())
    assert row["inputs"] == {"beta": 2} and row["rid"] == 3
