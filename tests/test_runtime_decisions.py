"""The decision ring: bounded, numbered, counted apart; and the NIC rate window."""

from __future__ import annotations

import dataclasses
import functools
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


def _rich_inputs(rid: int) -> dict[str, Any]:
    """Inputs shaped like a PE fetch's: nested dicts (int keys among them), lists, floats,
    None, a shared sources mapping."""
    return {"pe_queue_head": [rid, rid + 1], "pe_engines": [
        {"id": e, "role": "prefill", "node": 0, "group": 0, "seq": rid, "tok": 7 * e,
         "read_q": 0, "hbm_free": 262144} for e in range(4)],
        "de_route": {"queue_head": [rid], "group_loads": {1: 0, 2: rid}, "group": 1},
        "z": 130.20000000000002, "ratio": 1 / 3, "lookup": {"evicted_age_s": None,
                                                            "misses": {}, "lead": "fd48"}}


def test_ring_keeps_the_last_n_within_its_byte_budget() -> None:
    from dualpath_cli.runtime.packed_ring import BATCH

    log = DecisionLog(1000, MetricsRegistry(), budget=1 << 30)
    for rid in range(5 * 1000 + 7):
        fields = _fields(rid)
        fields["inputs"] = functools.partial(_rich_inputs, rid)
        log.record(**fields)
    kept = log.since(-1)
    assert [d.seq for d in kept] == list(range(4008, 5008))  # the last 1,000, every one
    assert len(log) == 1000 and log.last_seq == 5007
    assert log.nbytes <= 1000 * 200  # packed: well under the ~3 KB a decision as objects
    assert log.counts().total == 5007
    # a byte budget smaller than 1,000 decisions need: fewer kept, the newest, within it
    small = DecisionLog(1000, MetricsRegistry(), budget=4 * log.nbytes // 10)
    for rid in range(3000):
        fields = _fields(rid)
        fields["inputs"] = functools.partial(_rich_inputs, rid)
        small.record(**fields)
    assert 0 < small.nbytes <= 4 * log.nbytes // 10 and BATCH <= len(small) < 1000
    seqs = [d.seq for d in small.since(-1)]
    assert seqs == list(range(3001 - len(seqs), 3001))
    assert [d.rid for d in small.of_request(2999)] == [2999]
    assert small.of_request(0) == []  # dropped with its batch


def test_a_packed_decision_reads_back_as_the_same_json(tmp_path: Path) -> None:
    from dualpath_cli.runtime.packed_ring import BATCH

    log = DecisionLog(10_000, MetricsRegistry(), tmp_path / "d.jsonl")
    for rid in range(3 * BATCH + 5):
        fields = _fields(rid, side="split" if rid % 3 else "de")
        fields.update(gen=rid % 5 or None, z=None if rid % 7 else 0.1 + 0.2,
                      inputs=functools.partial(_rich_inputs, rid))
        log.record(**fields)
    log.record_control(at=2.5, name="alpha", inputs={"signal": 0.91, "old": 5, "new": None})
    log.close()
    written = (tmp_path / "d.jsonl").read_text().splitlines()  # built when recorded
    read = [json.dumps(dataclasses.asdict(d)) for d in log.since(-1)]
    assert read == written
    assert json.dumps(dataclasses.asdict(log.of_request(7)[0])) == written[7]
    assert [d.seq for d in log.since(BATCH + 3)] == list(range(BATCH + 4, 3 * BATCH + 7))


def test_ledger_outcomes_page_and_are_found_once_packed() -> None:
    from dualpath_cli.core.layout import BlockShape, Namespace
    from dualpath_cli.runtime.ledger import RequestLedger

    ns = Namespace("tiny", "layer_major", BlockShape(2, 4, 8))
    ledger = RequestLedger(MetricsRegistry(), ns, outcomes=300)
    for rid in range(1000):
        ledger.finished(rid, 0, [1, 2], [3] * 8, {"submitted": rid / 3, "attempts": 1})
    assert ledger.outcome(699) is None  # forgotten: older than the last 300
    assert ledger.outcome(700) == {"submitted": 700 / 3, "attempts": 1, "dispatched": None,
                                   "pe": None, "tokens_out": 2}
    assert [rid for rid, _ in ledger.finished_after(None, 3)] == [997, 998, 999]
    assert [rid for rid, _ in ledger.finished_after(800, 2)] == [801, 802]
    assert [rid for rid, _ in ledger.finished_after(5, 2)] == [700, 701]  # forgotten: oldest
    assert ledger.finished_after(999, 5) == []
