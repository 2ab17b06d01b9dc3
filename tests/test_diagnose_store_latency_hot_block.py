"""Rules store-latency (a slow store behind any node, decode nodes too) and hot-block (the
busiest copy's share, one finding per reading node, with a band), on hand-made windows of
the 2P4D view test_diagnose_rules.py builds; and the /metrics lines they are read from."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from test_diagnose_rules import T0, dataclass_replace, named, ttft_extras, window

from dualpath_cli.diagnose import rules
from dualpath_cli.diagnose.model import Evidence, Finding, Severity
from dualpath_cli.diagnose.thresholds import STORE_LATENCY_LOOKBACK_S
from dualpath_cli.diagnose.verdict import previous_grades
from dualpath_cli.diagnose.workflows.long_tail import long_tail
from dualpath_cli.diagnose.workflows.snic_imbalance import snic_imbalance
from dualpath_cli.telemetry.recording import Extras, extras_from_dict, extras_from_metrics_text


def _latency(per_read: dict[int, float], reads_per_s: int = 5) -> Callable[[int], Extras]:
    """Each node's store reads growing by ``reads_per_s`` a second at its latency (the
    nodes not named: 10 ms)."""
    def extras(i: int) -> Extras:
        n = reads_per_s * i
        lat = {node: (per_read.get(node, 0.01) * n, n) for node in range(6)}
        return dataclass_replace(ttft_extras(i), store_read_latency=lat)
    return extras


def _store_latency(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.rule == "store-latency"]


def test_a_slow_store_behind_a_decode_node_names_it_with_a_graded_severity() -> None:
    ev = window(extras=_latency({3: 0.45}))  # D3's reads take 450 ms; the others 10 ms
    report = rules.run_workflow("snic-imbalance", ev)
    (f,) = _store_latency(list(report.findings))
    assert f.subject == "node D3" and f.severity is Severity.WARNING
    assert f.evidence["mean_read_latency_s"] == pytest.approx(0.45)
    assert f.evidence["reads"] == 45 and f.evidence["peers_read_latency_s"]["P0"] == 0.01
    assert "450 ms on average" in f.title and "store-latency" in (f.why or "")
    assert "tune set alpha" not in (f.action or "")  # steering cannot mend a slow store
    worse = _store_latency(snic_imbalance(window(extras=_latency({3: 1.5}))))
    assert [g.severity for g in worse] == [Severity.CRITICAL]
    assert not _store_latency(snic_imbalance(window(extras=_latency({}))))


def test_too_few_reads_on_a_slow_node_is_not_enough_evidence_not_a_guess() -> None:
    """The scheduler steers reads away from a slow node: a window with fewer than the
    minimum reads there grades nothing."""
    ev = window(extras=_latency({3: 0.45}, reads_per_s=1))  # 9 reads in the window
    (f,) = [f for f in snic_imbalance(ev) if f.rule == "store-latency"]
    assert f.severity is Severity.OK and "not enough evidence: 9 reads" in f.title
    assert f.evidence["about"] == "node D3"


def test_store_latency_keeps_its_grade_inside_the_band() -> None:
    ev = window(extras=_latency({3: 0.09}))  # 90 ms: under WARNING's 100 ms, within 20 ms
    assert not _store_latency(snic_imbalance(ev))
    prev = previous_grades(_store_latency(snic_imbalance(window(extras=_latency({3: 0.3})))))
    held = Evidence(ev.samples, ev.decisions, previous=prev)
    (f,) = _store_latency(snic_imbalance(held))
    assert f.severity is Severity.WARNING and "kept from the previous verdict" in (f.why or "")
    gone = window(extras=_latency({3: 0.07}))  # back past the band: OK
    assert not _store_latency(snic_imbalance(Evidence(gone.samples, gone.decisions,
                                                      previous=prev)))


def test_store_latency_band_is_a_share_of_the_threshold_crossed() -> None:
    """A queued read's latency wobbles in proportion to it: a steady slow store measured
    at 0.9 s then 1.1 s keeps its grade (band 20%: 200 ms at CRITICAL's 1 s), while 20 ms
    still moves it at WARNING's 100 ms (above)."""
    def graded(mean: float, prev: dict[str, Severity] | None) -> Severity:
        ev = window(extras=_latency({3: mean}))
        (f,) = _store_latency(snic_imbalance(Evidence(ev.samples, ev.decisions,
                                                      previous=prev)))
        return f.severity

    warned = previous_grades(_store_latency(snic_imbalance(window(extras=_latency({3: 0.9})))))
    assert graded(1.1, warned) is Severity.WARNING  # under 1.2 s: kept
    assert graded(1.25, warned) is Severity.CRITICAL
    crit = previous_grades(_store_latency(snic_imbalance(window(extras=_latency({3: 1.1})))))
    assert graded(0.85, crit) is Severity.CRITICAL  # over 0.8 s: kept
    assert graded(0.75, crit) is Severity.WARNING
    ev = window(extras=_latency({3: 1.1}))
    (f,) = _store_latency(snic_imbalance(ev))
    assert "band 20% of the threshold" in (f.why or "")


def _hot(lead: int, *, per_s: int = 30, copies: int = 1, others: int = 60,
         readers: bool = True, blocks: int = 2) -> Callable[[int], Extras]:
    """Two blocks (or ``blocks``) node 3 reads ``per_s`` a second each (block ``lead`` a
    little more), spread evenly over ``copies`` roots, among ``others`` other store reads a
    second."""
    keys = ["aa" * 16, "bb" * 16][:blocks]

    def extras(i: int) -> Extras:
        reads = {k: (per_s + (2 if j == lead else 0)) * i for j, k in enumerate(keys)}
        copy_reads = ({k: {f"/r{c}": v // copies for c in range(copies)}
                       for k, v in reads.items()} if copies > 1 else {})
        return dataclass_replace(
            ttft_extras(i), block_reads=reads,
            store_block_reads=sum(reads.values()) + others * i, block_copy_reads=copy_reads,
            block_readers={k: {3: v} for k, v in reads.items()} if readers else {})
    return extras


def _hot_blocks(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.rule == "hot-block"]


def test_hot_blocks_are_one_finding_on_the_node_that_reads_them_whichever_leads() -> None:
    subjects = set()
    for lead in (0, 1):
        (f,) = _hot_blocks(long_tail(window(extras=_hot(lead))))
        assert f.severity is Severity.WARNING and f.rule == "hot-block"
        assert set(f.evidence["hot_blocks"]) == {"aa" * 16, "bb" * 16}
        assert "node D3 reads 2 hot blocks" in f.title
        subjects.add(f.subject)
    assert subjects == {"node D3"}
    # a cluster that does not say who read them: the hottest block is the subject
    (f,) = _hot_blocks(long_tail(window(extras=_hot(0, readers=False))))
    assert f.subject == "block " + "aa" * 16


def test_hot_block_grade_by_the_busiest_copys_share_and_copies_lower_it() -> None:
    (one,) = _hot_blocks(long_tail(window(extras=_hot(0, per_s=100, others=20, blocks=1))))
    assert one.severity is Severity.CRITICAL and one.evidence["hot_share"] >= 0.5
    (two,) = _hot_blocks(long_tail(window(extras=_hot(0, per_s=100, others=20, blocks=1,
                                                      copies=2))))
    assert two.severity is Severity.WARNING  # the fault's reads go on; each copy takes half
    assert two.evidence["hot_share"] == pytest.approx(one.evidence["hot_share"] / 2, rel=0.05)
    spread = long_tail(window(extras=_hot(0, per_s=30, others=60, copies=4)))
    assert not _hot_blocks(spread)
    assert any("spread over 4 copies" in f.title for f in spread)


def test_hot_blocks_already_on_every_root_ask_for_a_root_not_a_copy() -> None:
    """Copies on each root seen serving copies and the busiest still hot: --fix would copy
    nothing, so the finding asks for another root; with one root not yet holding the block
    it still offers --fix."""
    (full,) = _hot_blocks(long_tail(window(extras=_hot(0, per_s=100, others=20, blocks=1,
                                                       copies=2))))
    assert full.evidence["on_every_root"] and full.evidence["roots_serving_copies"] == 2
    assert (full.action or "").startswith("add a replica root") and "--fix has nothing" in (
        full.action or "")
    (single,) = _hot_blocks(long_tail(window(extras=_hot(0, per_s=100, others=20, blocks=1))))
    assert not single.evidence["on_every_root"]
    assert (single.action or "").startswith("dualpath diagnose long-tail --fix")
    base = _hot(0, per_s=100, others=20, blocks=2, copies=2)

    def one_root_short(i: int) -> Extras:  # block bb read from /r0 only
        x = base(i)
        return dataclass_replace(x, block_copy_reads={"aa" * 16: x.block_copy_reads["aa" * 16]})
    (part,) = _hot_blocks(long_tail(window(extras=one_root_short)))
    assert not part.evidence["on_every_root"]
    assert (part.action or "").startswith("dualpath diagnose long-tail --fix")


def test_hot_block_keeps_its_grade_inside_the_band() -> None:
    """30+2 reads a second of ~360: 8.9% on the busiest copy, under the 10% but within the
    band of a previous WARNING."""
    ev = window(extras=_hot(0, per_s=30, others=300))
    assert not _hot_blocks(long_tail(ev))
    prev = previous_grades(_hot_blocks(long_tail(window(extras=_hot(0)))))
    (f,) = _hot_blocks(long_tail(Evidence(ev.samples, ev.decisions, previous=prev)))
    assert f.severity is Severity.WARNING and "kept from the previous" in (f.why or "")
    (few,) = [f for f in long_tail(window(n=2, extras=_hot(0, per_s=5, others=0)))
              if "hot block" in f.title]
    assert few.severity is Severity.OK and "no hot block" in few.title  # 7 reads < 20


def test_latency_and_block_readers_come_from_the_metrics_page_and_survive_json() -> None:
    text = "\n".join([
        'dualpath_storage_read_latency_seconds_sum{node="1",tier="store"} 4.5',
        'dualpath_storage_read_latency_seconds_count{node="1",tier="store"} 20',
        'dualpath_storage_read_latency_seconds_sum{node="1",tier="dram"} 9',
        'dualpath_storage_read_latency_seconds_count{node="1",tier="dram"} 900',
        'dualpath_storage_block_reads_total{node="1",block="aa"} 30',
        'dualpath_storage_block_reads_total{node="2",block="aa"} 4',
    ])
    x = extras_from_metrics_text(text)
    assert x.store_read_latency == {1: (4.5, 20)}
    assert x.block_reads == {"aa": 34} and x.block_readers == {"aa": {1: 30, 2: 4}}
    import json

    back = extras_from_dict(json.loads(json.dumps(x.to_dict())))
    assert back.store_read_latency == x.store_read_latency
    assert back.block_readers == x.block_readers
    assert extras_from_dict({}).store_read_latency == {}  # an older recording
    assert named(snic_imbalance(window()), "node D3") == []


def _steered(before: int, per_read: float = 0.45) -> Callable[[int], Extras]:
    """D3's store reads at ``per_read``, ``before`` of them before the window and one a
    second in it (the scheduler steers reads away from it); the other nodes' 5 a second."""
    def extras(i: int) -> Extras:
        lat = {node: (0.01 * 5 * (i + 40), 5 * (i + 40)) for node in range(6)}
        lat[3] = (per_read * (before + i), before + i)
        return dataclass_replace(ttft_extras(i), store_read_latency=lat)
    return extras


def test_too_few_reads_in_the_window_grades_the_nodes_last_reads_from_earlier_counts() -> None:
    """A slow store the scheduler steers reads away from is still slow: with 9 reads in the
    window, the rule counts the node's last reads back to the newest earlier count that
    leaves the minimum (kept by an earlier diagnose run), and says so."""
    ev = window(extras=_steered(before=20))
    ev.read_history = {3: [(T0 - 90, 0.45 * 2, 2), (T0 - 20, 0.45 * 15, 15),
                           (T0 - 5, 0.45 * 21, 21)]}
    (f,) = _store_latency(snic_imbalance(ev))
    assert f.subject == "node D3" and f.severity is Severity.WARNING
    # 29 reads at the end: back to T0-20 (14 reads: 5 before the window, 9 in it); the
    # newer count at T0-5 leaves only 8
    assert f.evidence["reads"] == 14 and f.evidence["reads_in_window"] == 9
    assert f.evidence["lookback_s"] == pytest.approx(29.0)
    assert f.evidence["mean_read_latency_s"] == pytest.approx(0.45)
    assert "its last 14 reads, over 29 s; 9 in this 9 s window" in f.title
    assert "the window had 9 reads (< 10): graded on the node's last 14 reads" in (f.why or "")


def test_earlier_counts_out_of_reach_or_from_before_a_restart_are_not_evidence() -> None:
    old = window(extras=_steered(before=20))
    old.read_history = {3: [(T0 + 9 - STORE_LATENCY_LOOKBACK_S - 1, 0.0, 0)]}
    (f,) = [f for f in snic_imbalance(old) if f.rule == "store-latency"]
    assert f.severity is Severity.OK and "not enough evidence: 9 reads" in f.title
    restarted = window(extras=_steered(before=0))  # counts from zero again
    restarted.read_history = {3: [(T0 - 30, 0.45 * 500, 500)]}
    (f,) = [f for f in snic_imbalance(restarted) if f.rule == "store-latency"]
    assert f.severity is Severity.OK and "not enough evidence" in f.title


def test_a_window_with_enough_reads_is_graded_on_them_alone() -> None:
    """The lookback is for a window short of evidence only: a store that got fast again
    with plenty of reads in the window is judged by them, not by the slow reads before."""
    ev = window(extras=_latency({3: 0.01}))
    ev.read_history = {3: [(T0 - 60, 0.0, 0)]}
    assert not _store_latency(snic_imbalance(ev))


def test_read_history_snapshots_and_merge_keep_one_count_each_in_reach() -> None:
    from dualpath_cli.diagnose.read_history import merged, snapshots

    ev = window(extras=_steered(before=20))
    snaps = snapshots(ev.samples)
    assert len(snaps[3]) == 10 and snaps[3][0][2] == 20 and snaps[3][-1][2] == 29
    end = ev.samples[-1].at
    kept = merged({3: [(end - 400, 0.0, 1), (end - 100, 1.0, 5)], 7: [(end - 50, 0.0, 99)]},
                  snaps, end, 300.0)
    assert kept[3][0] == (end - 100, 1.0, 5) and len(kept[3]) == 11  # the 400 s one went
    assert kept[7] == [(end - 50, 0.0, 99)]
    again = merged(kept, {3: [(end + 1, 0.45 * 29, 29)]}, end + 1, 300.0)
    assert again[3][-1] == (end + 1, 0.45 * 29, 29) and len(again[3]) == 11  # one per count


def _serviced(service: float, latency: float, batches_per_s: int = 5,
              reads_per_batch: int = 4) -> Callable[[int], Extras]:
    """D3's store serves ``batches_per_s`` read batches a second at ``service`` each while
    its blocks' read latency (queue wait included) is ``latency``; the other nodes 10 ms."""
    def extras(i: int) -> Extras:
        b, r = batches_per_s * i, batches_per_s * reads_per_batch * i
        svc = {node: (0.01 * b, b) for node in range(6)}
        lat = {node: (0.02 * r, r) for node in range(6)}
        svc[3], lat[3] = (service * b, b), (latency * r, r)
        return dataclass_replace(ttft_extras(i), store_read_service=svc,
                                 store_read_latency=lat)
    return extras


def test_store_latency_grades_the_stores_service_time_steady_under_a_growing_queue() -> None:
    """A steady slow store (200 ms per batch) under a growing queue: the blocks' read
    latency climbs from 0.4 s to 2.5 s window by window (more blocks wait behind each slow
    batch), the store's own time does not, and neither does the grade (issue 33)."""
    prev: dict[str, Severity] | None = None
    grades = []
    for latency in (0.4, 0.8, 1.6, 2.5, 2.5):
        ev = window(extras=_serviced(0.2, latency))
        (f,) = _store_latency(snic_imbalance(Evidence(ev.samples, ev.decisions,
                                                      previous=prev)))
        grades.append(f.severity)
        prev = previous_grades([f])
        assert f.subject == "node D3" and f.evidence["graded"] == "service_time"
        assert f.evidence["mean_service_s"] == pytest.approx(0.2)
        assert f.evidence["read_batches"] == 45
        assert f.evidence["mean_read_latency_s"] == pytest.approx(latency)  # queue: shown
        assert f.evidence["reads_in_window"] == 180
        assert "200 ms per read batch" in f.title
        assert f"a block read takes {latency * 1e3:.0f} ms" in f.title
        assert "store service time per read batch" in (f.why or "")
        assert "dualpath_storage_read_service_seconds" in (f.action or "")
    assert grades == [Severity.WARNING] * 5
    # the thresholds apply to service time as they did to latency: 1.5 s a batch is CRITICAL
    (f,) = _store_latency(snic_imbalance(window(extras=_serviced(1.5, 3.0))))
    assert f.severity is Severity.CRITICAL
    # a fast store with a long queue (reads pile up for another reason) is not a slow store
    assert not _store_latency(snic_imbalance(window(extras=_serviced(0.01, 2.5))))


def test_without_service_time_the_rule_falls_back_to_read_latency_and_says_so() -> None:
    (f,) = _store_latency(snic_imbalance(window(extras=_latency({3: 0.45}))))
    assert f.evidence["graded"] == "read_latency" and "service time not reported" in f.why
    assert "queue wait included" in f.title


def test_too_few_batches_in_the_window_look_back_on_the_service_history() -> None:
    """The lookback works on service time as on latency: D3's store served 9 batches in
    the window; its last 14 back to a count an earlier run kept are graded."""
    def extras(i: int) -> Extras:
        svc = {node: (0.01 * 5 * (i + 40), 5 * (i + 40)) for node in range(6)}
        svc[3] = (0.3 * (20 + i), 20 + i)
        return dataclass_replace(ttft_extras(i), store_read_service=svc)
    ev = window(extras=extras)
    (f,) = [f for f in snic_imbalance(ev) if f.rule == "store-latency"]
    assert f.severity is Severity.OK and "read batches: not enough evidence: 9 reads" in f.title
    ev.read_history = {3: [(T0 - 20, 0.0, 0)]}  # the latency's history is not service's
    (f,) = [f for f in snic_imbalance(ev) if f.rule == "store-latency"]
    assert f.severity is Severity.OK
    ev.service_history = {3: [(T0 - 20, 0.3 * 15, 15)]}
    (f,) = _store_latency(snic_imbalance(ev))
    assert f.severity is Severity.WARNING and f.evidence["read_batches"] == 14
    assert f.evidence["read_batches_in_window"] == 9
    assert f.evidence["mean_service_s"] == pytest.approx(0.3)
    assert "its last 14 read batches, over 29 s; 9 in this 9 s window" in f.title


def test_service_time_comes_from_the_metrics_page_and_survives_json() -> None:
    import json

    text = "\n".join([
        'dualpath_storage_read_service_seconds_sum{node="1"} 2.5',
        'dualpath_storage_read_service_seconds_count{node="1"} 10',
        'dualpath_storage_read_service_seconds_bucket{node="1",le="+Inf"} 10',
    ])
    x = extras_from_metrics_text(text)
    assert x.store_read_service == {1: (2.5, 10)}
    assert extras_from_dict(json.loads(json.dumps(x.to_dict()))).store_read_service == {
        1: (2.5, 10)}
    assert extras_from_dict({}).store_read_service == {}  # an older recording
