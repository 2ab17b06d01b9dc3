"""diagnose store-health (diagnose/workflows/store_health.py): failed reads, corrupt blocks and
refused writes per node, from the per-node counters ``/metrics`` serves. Pure functions over
hand-made windows of the 2P4D of test_diagnose_rules.py (nodes P0 P1 D2..D5)."""

from __future__ import annotations

import pytest
from test_diagnose_rules import window

from dualpath_cli.diagnose import rules
from dualpath_cli.diagnose.model import Severity
from dualpath_cli.diagnose.verdict import previous_grades
from dualpath_cli.telemetry.recording import Extras, extras_from_dict, extras_from_metrics_text

OK, WARNING, CRITICAL = Severity.OK, Severity.WARNING, Severity.CRITICAL


def _store(reads: dict[int, int] | None = None, failed: dict[int, int] | None = None,
           corrupt: dict[int, int] | None = None, refused: dict[str, int] | None = None,
           n: int = 10):
    """Extras of sample ``i``: each counter grows linearly to its given total by the last
    sample (every node reads 20 blocks a sample unless told)."""
    def make(i: int) -> Extras:
        k = i / (n - 1)
        base = {node: 20 * i for node in range(6)}
        return Extras(
            node_store_reads={**base, **{nd: int(v * k) for nd, v in (reads or {}).items()}},
            node_read_errors={nd: int(v * k) for nd, v in (failed or {}).items()},
            node_corrupt_blocks={nd: int(v * k) for nd, v in (corrupt or {}).items()},
            node_write_errors={key: int(v * k) for key, v in (refused or {}).items()})
    return make


def _findings(extras, n: int = 10, previous=None):
    ev = window(extras=extras, n=n)
    ev.previous = previous
    return list(rules.run_workflow("store-health", ev).findings)


def test_a_healthy_store_is_ok_with_its_counts() -> None:
    (f,) = _findings(_store())
    assert f.severity is OK and f.title.startswith("stores healthy: 1080 reads")


def test_failed_reads_name_the_node_with_n_of_m_and_a_graded_severity() -> None:
    # D2: 90 of 180 reads failed (50%): WARNING (turns are served, re-read or recomputed)
    (f,) = _findings(_store(reads={2: 90}, failed={2: 90}))
    assert f.severity is WARNING and f.subject == "node D2" and f.rule == "store-read-errors"
    assert f.title == "node D2: 90 of 180 reads failed (EIO)"
    assert f.evidence["failed_reads"] == 90 and f.evidence["reads"] == 180
    assert f.why and "180 reads" in f.why
    # every read failing: the node's store serves nothing any more, CRITICAL
    (c,) = _findings(_store(reads={3: 0}, failed={3: 200}))
    assert c.severity is CRITICAL and c.subject == "node D3"
    # one failure in 180 reads is under the 2% threshold: nothing named
    (ok,) = _findings(_store(reads={2: 179}, failed={2: 1}))
    assert ok.severity is OK


def test_a_few_reads_all_failing_warn_but_are_not_enough_for_critical() -> None:
    """A healthy store fails no read: one failure is evidence of a failing store; that
    nearly every read fails is claimed only over STORE_READ_CRIT_MIN_READS reads."""
    (f,) = _findings(_store(reads={4: 3}, failed={4: 3}))
    assert f.severity is WARNING and f.title == "node D4: 3 of 6 reads failed (EIO)"
    (c,) = _findings(_store(reads={4: 0}, failed={4: 9}))
    assert c.severity is WARNING and "capped at WARNING: CRITICAL needs 10 reads" in (c.why or "")
    (c10,) = _findings(_store(reads={4: 0}, failed={4: 10}))
    assert c10.severity is CRITICAL


def test_two_failing_nodes_are_two_findings_worst_first() -> None:
    fs = _findings(_store(reads={2: 150, 5: 0}, failed={2: 30, 5: 100}))
    assert [(f.subject, f.severity) for f in fs] == [("node D5", CRITICAL),
                                                     ("node D2", WARNING)]


def test_a_corrupt_block_names_the_node_and_the_count_and_offers_verify() -> None:
    (f,) = _findings(_store(corrupt={1: 3}))
    assert f.severity is WARNING and f.subject == "node P1" and f.rule == "store-corrupt"
    assert f.title == "node P1: 3 corrupt blocks found and quarantined"
    assert "corrupt" in f.title and f.action and f.action.startswith("dualpath storage verify")


def test_one_corrupt_block_warns_even_after_an_ok_verdict() -> None:
    """Counts are whole: the threshold and band are set so that one event moves the grade
    from OK, and a window with none brings it back."""
    ok = previous_grades(_findings(_store()))
    (f,) = _findings(_store(corrupt={2: 1}), previous=ok)
    assert f.severity is WARNING
    (back,) = _findings(_store(), previous=previous_grades([f]))
    assert back.severity is OK


def test_a_full_store_names_the_node_and_the_refused_writes() -> None:
    (f,) = _findings(_store(refused={"2/full": 12, "3/read_only": 0}))
    assert f.severity is WARNING and f.subject == "node D2" and f.rule == "store-writes"
    assert f.title == "store full on node D2: 12 writes refused"
    assert f.evidence["by_reason"] == {"full": 12} and "gc" in (f.action or "")
    (ro,) = _findings(_store(refused={"4/read_only": 5}))
    assert ro.title == "store read-only on node D4: 5 writes refused"


def test_counts_from_before_the_window_do_not_count() -> None:
    """The counters are since start: only their growth inside the window is judged (a fault
    cleared before it leaves the store healthy)."""
    def make(i: int) -> Extras:
        return Extras(node_store_reads={2: 100 + 20 * i}, node_read_errors={2: 50},
                      node_corrupt_blocks={2: 4}, node_write_errors={"2/full": 9})
    (f,) = _findings(make)
    assert f.severity is OK and f.title.startswith("stores healthy")


def test_a_window_without_the_counters_says_so() -> None:
    (f,) = _findings(lambda i: Extras())
    assert f.severity is OK and "not reported" in f.title


def test_the_counters_are_read_from_metrics_and_kept_in_recordings() -> None:
    text = "\n".join([
        'dualpath_storage_read_blocks_total{node="2",role="decode"} 10',
        'dualpath_storage_read_blocks_total{node="2",role="prefill"} 5',
        'dualpath_storage_read_errors_total{node="2",reason="read_failed"} 4',
        'dualpath_storage_read_errors_total{node="2",reason="timed_out"} 1',
        'dualpath_storage_corrupt_blocks_total{node="1",reason="checksum"} 2',
        'dualpath_storage_write_errors_total{node="2",role="decode",reason="full"} 7'])
    ex = extras_from_metrics_text(text)
    assert ex.node_store_reads == {2: 15} and ex.store_block_reads == 15
    assert ex.node_read_errors == {2: 5} and ex.node_corrupt_blocks == {1: 2}
    assert ex.node_write_errors == {"2/full": 7}
    assert extras_from_dict(ex.to_dict()) == ex


# --- the status record's store lines (telemetry/storage_health.py) -----------------------
def test_status_lists_the_nodes_with_store_trouble_from_the_engines_frames() -> None:
    from dualpath_cli.telemetry.frames import frame
    from dualpath_cli.telemetry.registry import MetricsRegistry
    from dualpath_cli.telemetry.storage_health import (
        NodeStorage,
        storage_from_dicts,
        storage_of_frames,
    )

    def engine(node: str, failed: int, corrupt: int, full: int) -> dict[str, object]:
        r = MetricsRegistry()
        r.counter("dualpath_storage_read_blocks_total", node=node, role="decode").inc(50)
        r.counter("dualpath_storage_read_errors_total", node=node, reason="read_failed").inc(
            failed)
        r.counter("dualpath_storage_write_errors_total", node=node, role="decode",
                  reason="full").inc(full)
        if corrupt:
            r.counter("dualpath_storage_corrupt_blocks_total", node=node,
                      reason="checksum").inc(corrupt)
        return frame(r)

    frames = {0: engine("0", 0, 0, 0), 1: engine("1", 6, 1, 0), 2: engine("2", 0, 0, 12)}
    got = storage_of_frames(frames, {0: "P0", 1: "D1", 2: "D2"})
    assert got == (NodeStorage(1, "D1", read_errors=6, corrupt_blocks=1),
                   NodeStorage(2, "D2", writes_refused=12, full=12))
    assert storage_of_frames(frames, {}) == storage_of_frames(frames, {}) != ()  # cached
    assert got[0].line() == ("store on node D1: 6 reads failed, 1 corrupt block quarantined "
                             "since start (dualpath diagnose store-health)")
    assert "12 writes refused (full)" in got[1].line()
    assert storage_from_dicts([n.to_dict() for n in got]) == got
    assert storage_from_dicts(None) == () and storage_from_dicts([{"x": 1}]) == ()


def test_refused_writes_are_counted_by_reason_and_logged_without_a_flood(
        caplog: pytest.LogCaptureFixture) -> None:
    import errno
    import logging

    from dualpath_cli.runtime.write_refusals import LOG_EVERY_S, WriteRefusals
    from dualpath_cli.storage.errors import CapacityError, WriteRefused, write_refusal_of
    from dualpath_cli.telemetry.registry import MetricsRegistry

    assert write_refusal_of(WriteRefused("/s/k", errno.ENOSPC, "No space")) == "full"
    assert write_refusal_of(WriteRefused("/s/k", errno.EROFS, "Read-only")) == "read_only"
    assert write_refusal_of(OSError(errno.EIO, "I/O")) == "failed"
    assert write_refusal_of(CapacityError("too big")) == "full"
    now = [0.0]
    r = MetricsRegistry()
    w = WriteRefusals(r, "1", "decode", 3, clock=lambda: now[0])
    full = WriteRefused("/s/k", errno.ENOSPC, "No space left on device")
    with caplog.at_level(logging.WARNING, "dualpath_cli.runtime.write_refusals"):
        for i in range(100):
            w.count(f"{i:032x}", full)
        now[0] = LOG_EVERY_S + 1
        w.count("f" * 32, full)
    lines = [rec.getMessage() for rec in caplog.records]
    assert len(lines) == 2 and "99 more refused since the last line" in lines[1]
    assert w.counters["full"].value == 101 and w.counters["failed"].value == 0
