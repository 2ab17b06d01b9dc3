"""The diagnose rules as pure functions over hand-made views, one per fault.

The cluster is 2P4D with one engine per node (engine id = node id: P0 P1 D2 D3 D4 D5). The
healthy window is quiet on every workflow; each fault view (a storage NIC throttled to 25%
on D3, engine 4's HBM fragmented, a hot block, engine 5 slow) must give WARNING or CRITICAL
and name the right node, engine or block. The builders are imported by the CLI, monitor and
golden tests.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest

from dualpath_cli.diagnose import rules, thresholds
from dualpath_cli.diagnose.grading import histogram_quantile
from dualpath_cli.diagnose.model import Evidence, Finding, Severity
from dualpath_cli.diagnose.workflows.cache_hit import cache_hit, kv_waits
from dualpath_cli.diagnose.workflows.long_tail import long_tail
from dualpath_cli.diagnose.workflows.scaling import scaling, scheduler_cost
from dualpath_cli.diagnose.workflows.snic_imbalance import snic_imbalance
from dualpath_cli.telemetry.recording import Extras, Sample
from dualpath_cli.telemetry.view import (
    ClusterView,
    Decision,
    DecisionCounts,
    EngineView,
    LayerHits,
    NodeView,
    SchedulerView,
    Thresholds,
)

ALPHA = 100_000
BETA = 200_000
T0 = 1_796_000_000.0
ROLES = ("prefill", "prefill", "decode", "decode", "decode", "decode")
SNIC_BW = 50e9


def make_view(i: int = 0, *, util: dict[int, float] | None = None,
              bw: dict[int, float] | None = None, read_q: dict[int, int] | None = None,
              frag: dict[int, float] | None = None, seq: dict[int, int] | None = None,
              tokens: dict[int, int] | None = None, slack: dict[int, float] | None = None,
              gpu: dict[int, float] | None = None, fifo: int = 0, decided: int = 0,
              layer_blocks: int = 0, at: float | None = None,
              service: dict[int, float] | None = None,
              kv_wait: dict[int, float] | None = None) -> ClusterView:
    """Sample ``i`` (1 s apart) of a healthy 2P4D cluster, with the given overrides."""
    util, bw, read_q = util or {}, bw or {}, read_q or {}
    frag, seq, tokens, slack, gpu = frag or {}, seq or {}, tokens or {}, slack or {}, gpu or {}
    engines = []
    for eid, role in enumerate(ROLES):
        layers: tuple[LayerHits, ...] = ()
        if role == "prefill":
            n = layer_blocks + 10 * i
            layers = tuple(LayerHits(layer, dram=n // 4, store=n // 2, peer=n - n // 4 - n // 2,
                                     slack_s=slack.get(layer, 0.005 if layer else -0.001))
                           for layer in range(4))
        engines.append(EngineView(
            eid, role, eid, eid, "ready", seq=seq.get(eid, 2), tokens=tokens.get(eid, 2_000),
            read_queue_tokens=read_q.get(eid, 1_000), read_queue_bytes=1 << 20,
            hbm_used_bytes=1 << 30, hbm_free_bytes=3 << 30,
            hbm_fragmentation=frag.get(eid, 0.05), hbm_largest_free_blocks=10_000,
            nic_bytes={"snic_read": 1 << 30}, layers=layers, gpu_utilization=gpu.get(eid, 0.6),
            heartbeat_age_s=0.01, service_time_s=(service or {}).get(eid, 0.02),
            kv_wait_s=(kv_wait or {}).get(eid, 0.004) if role == "prefill" else None))
    nodes = tuple(NodeView(
        n, ROLES[n], (n,), snic_utilization=util.get(n, 0.5), cnic_utilization=0.3,
        snic_bandwidth_bytes_per_s=bw.get(n, SNIC_BW), read_queue_tokens=read_q.get(n, 1_000),
        read_queue_bytes=1 << 20, read_queue_blocks=4, dram_buffer_bytes=1 << 28,
        storage_read_bytes=(1 << 30) + i * (1 << 28)) for n in range(len(ROLES)))
    th = Thresholds(ALPHA, BETA, 1.05, 0.3, "dualpath",
                    {"alpha": "config", "beta": "config"})
    sched = SchedulerView("dualpath", fifo, {2: 0, 3: 0, 4: 0, 5: 0}, 0, 8, th,
                          DecisionCounts(total=decided), last_decision_seq=decided or None)
    return ClusterView(T0 + i if at is None else at, "ready", "2P4D", "tiny", 100.0 + i,
                       tuple(engines), nodes, sched)


def decision(seq: int, *, pe: int = 0, de: int = 2, side: str = "pe", turn: int = 1,
             length: int = 1_000, cached: int = 900, pe_class: str = "C2",
             pe_read_q: int = 1_000, pe_tok: int = 2_000) -> Decision:
    """One logged decision at second ``seq`` of the window, with its inputs."""
    return Decision(seq, T0 + seq * 0.5, seq, 0, seq % 7, turn, length, cached, pe, de, de,
                    side, 0, 0, pe_read_q, 0, pe_class, "normal", 1.0, inputs={
                        "alpha": ALPHA, "beta": BETA,
                        "pe_engines": [{"id": pe, "tok": pe_tok, "read_q": pe_read_q,
                                        "hbm_free": 400_000}],
                        "de_engine": {"id": de, "tok": 2_000, "read_q": 0,
                                      "hbm_free": 400_000}})


def ttft_extras(i: int, tail: bool = False) -> Extras:
    """A TTFT histogram that grows by 10 turns a second (a long tail when ``tail``)."""
    bounds = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, math.inf)
    n = 10 * (i + 1)
    fast = n if not tail else n - n // 10
    counts = [fast // 2, fast, fast, fast, fast, fast, n, n]
    return Extras(ttft_buckets=tuple(zip(bounds, counts, strict=True)), ttft_count=n,
                  ttft_sum=0.1 * n)


def window(make: Callable[[int], ClusterView] = make_view, n: int = 10,
           extras: Callable[[int], Extras] = ttft_extras,
           decisions: list[Decision] | None = None) -> Evidence:
    """``n`` samples one second apart and the window's decisions."""
    ds = decisions if decisions is not None else [decision(s, de=2 + s % 4)
                                                  for s in range(1, 2 * n)]
    return Evidence([Sample(T0 + i, make(i), extras(i)) for i in range(n)], ds)


def healthy() -> Evidence:
    return window()


def nic_throttled() -> Evidence:
    """D3's storage NIC shaped to 25%: saturated, its read queue far over alpha."""
    def make(i: int) -> ClusterView:
        return make_view(i, util={2: 0.35, 3: 1.0, 4: 0.35, 5: 0.35},
                         bw={3: 0.25 * SNIC_BW}, read_q={3: 350_000})
    ds = [decision(s, de=2 + s % 4, side="de") for s in range(1, 20)]
    return window(make, decisions=ds)


def hbm_fragmented() -> Evidence:
    """Engine 4's KV pool fragmented to 0.97: its largest free run is smaller than a turn."""
    return window(lambda i: make_view(i, frag={4: 0.97}),
                  decisions=[decision(s, de=4, length=30_000, cached=0)
                             for s in range(1, 20)])


def hot_block() -> Evidence:
    """Block 7f3a.. read 500 times in the window, every other block about 8 times."""
    def extras(i: int) -> Extras:
        reads = {f"{k:04x}": 8 * i for k in range(40)}
        reads["7f3a9c0d11"] = 55 * i
        return dataclass_replace(ttft_extras(i), block_reads=reads)
    return window(extras=extras)


def slow_engine() -> Evidence:
    """Engine 5 holds 12 unfinished requests while its decode peers hold 2."""
    return window(lambda i: make_view(i, seq={5: 12}, gpu={5: 0.98}))


def dataclass_replace(obj: Any, **kw: Any) -> Any:
    import dataclasses

    return dataclasses.replace(obj, **kw)


def named(findings: list[Finding] | tuple[Finding, ...], subject: str) -> list[Finding]:
    return [f for f in findings if f.subject == subject and f.severity >= Severity.WARNING]


# --- tests ----------------------------------------------------------------------------------
@pytest.mark.parametrize("workflow", sorted(rules.WORKFLOWS))
def test_a_healthy_window_is_ok_on_every_workflow(workflow: str) -> None:
    report = rules.run_workflow(workflow, healthy())
    assert report.severity is Severity.OK, [f.title for f in report.findings]
    assert report.findings, "every workflow says what it checked"


def test_nic_throttled_to_a_quarter_on_one_node_is_critical_and_names_it() -> None:
    report = rules.run_workflow("perf-drop", nic_throttled())
    assert report.workflow == "snic-imbalance"
    assert report.severity is Severity.CRITICAL
    hits = named(report.findings, "node D3")
    assert hits and all("D3" in f.title for f in hits)
    bw = next(f for f in hits if "of expected" in f.title)
    assert bw.severity is Severity.CRITICAL and "25%" in bw.title
    assert bw.action and bw.action.startswith("check the storage NIC of D3")
    queue = next(f for f in hits if "read queue" in f.title)
    assert queue.evidence["reads_sent"] > 0 and "alpha" in queue.title
    assert not [f for f in report.findings
                if f.subject and f.subject != "node D3" and f.severity]


def test_a_throttled_nic_that_reads_already_avoid_keeps_its_grade_without_another_step(
        ) -> None:
    """The walk: after `tune set alpha=` the CRITICAL asked to halve alpha again, forever.
    Now the grade is the link's (rule snic-link), whatever share of reads reached it; the
    action stops asking for a step once reads avoid it."""
    def make(i: int) -> ClusterView:
        return make_view(i, bw={3: 0.1 * SNIC_BW})
    steered = window(make, decisions=[decision(s, de=2 + s % 2 * 2, side="de")
                                      for s in range(1, 20)])  # DEs 2 and 4 only
    report = rules.run_workflow("snic-imbalance", steered)
    (f,) = named(report.findings, "node D3")
    assert f.severity is Severity.CRITICAL and f.rule == "snic-link"
    assert f.why and "10% of expected over 10 samples: CRITICAL" in f.why
    assert "still at 10% of expected" in f.title and "reads to D3 0% (0/19)" in f.title
    assert f.action and "tune set" not in f.action and f.evidence["reads_sent"] == 0
    # the same link while reads still go there stays CRITICAL and says how many
    hot = window(make, decisions=[decision(s, de=2 + s % 4, side="de") for s in range(1, 20)])
    (g,) = [f for f in named(rules.run_workflow("snic-imbalance", hot).findings, "node D3")
            if "of expected" in f.title]
    assert g.severity is Severity.CRITICAL and "of reads (5/19) still sent to D3" in g.title
    assert g.action and "tune set alpha=" in g.action


def reads(first_seq: int, start: float, n: int, to_d3: int, *, alpha: int = ALPHA,
          step: float = 0.4) -> list[Decision]:
    """``n`` DE reads ``step`` s apart from ``start``, the first ``to_d3`` of them to D3 (the
    rest to D2, D4, D5), logged under ``alpha``."""
    out = []
    for k in range(n):
        d = decision(first_seq + k, de=3 if k < to_d3 else (2, 4, 5)[k % 3], side="de")
        out.append(dataclass_replace(d, at=start + k * step,
                                     inputs={**d.inputs, "alpha": alpha}))
    return out


def _d3_slow(i: int) -> ClusterView:
    return make_view(i, bw={3: 0.25 * SNIC_BW})


def _after_tune_set(to_d3_after: int, *, change_at: float = T0 - 3.0) -> Evidence:
    """The re-check after `tune set alpha=1s` (audit #17, 3 s before the window): 10 of the
    25 reads before the change went to the slow D3, ``to_d3_after`` of 25 in the window."""
    from dualpath_cli.telemetry.view import AuditEntry

    audit = [AuditEntry(16, T0 - 600, "launch", "faults", {}, {}),
             AuditEntry(17, change_at, "tok-1", "scheduler", {"alpha_tokens": ALPHA},
                        {"alpha_tokens": ALPHA // 2})]
    earlier = reads(1, change_at - 11.0, 25, 10)
    ds = reads(26, T0 + 0.1, 25, to_d3_after, alpha=ALPHA // 2, step=0.35)
    return Evidence([Sample(T0 + i, _d3_slow(i), ttft_extras(i)) for i in range(10)], ds,
                    audit=audit, earlier=earlier, alpha_s_per_token=2.0 / ALPHA)


def test_after_a_live_alpha_change_the_recheck_says_how_reads_to_the_slow_node_moved() -> None:
    """Story 2's re-check: reads to the slow node before the change against after it."""
    report = rules.run_workflow("snic-imbalance", _after_tune_set(1))
    (f,) = [f for f in named(report.findings, "node D3") if "storage NIC" in f.title]
    assert f.title == ("node D3 storage NIC still slow; reads to D3 down from 40% to 4% since "
                       "alpha 2s -> 1s (audit #17)")
    # the share fell within its share of the storage bandwidth: no further step; the grade
    # is still the link's (25% of expected: CRITICAL)
    assert f.severity is Severity.CRITICAL and f.action and "tune set" not in f.action
    assert f.cause and "25% of expected" in f.cause
    e = f.evidence
    assert (e["share_before"], e["share_after"], e["audit_seq"]) == (0.4, 0.04, 17)
    assert e["reads_before"] == {"sent": 10, "reads": 25}
    assert e["reads_after"] == {"sent": 1, "reads": 25}
    assert e["change"]["by"] == "audit" and e["change"]["old"] == ALPHA
    # reads that did not fall: said so, and still CRITICAL with the step to take
    report = rules.run_workflow("snic-imbalance", _after_tune_set(10))
    (g,) = [f for f in named(report.findings, "node D3") if "storage NIC" in f.title]
    assert g.title == ("node D3 storage NIC still slow; reads to D3 not down (40% before, 40% "
                       "after) since alpha 2s -> 1s (audit #17)")
    assert g.severity is Severity.CRITICAL and g.action and "tune set alpha=" in g.action
    # the step in the unit status shows alpha in (the samples' 2s, halved), not in tokens
    assert g.action.endswith("dualpath tune set alpha=1s")
    assert g.evidence["share_after"] == 0.4


def test_a_change_out_of_reach_or_without_enough_reads_leaves_the_finding_as_today() -> None:
    long_ago = _after_tune_set(1, change_at=T0 - 200)
    (f,) = [f for f in named(rules.run_workflow("snic-imbalance", long_ago).findings,
                             "node D3") if "storage NIC" in f.title]
    assert "still slow" not in f.title and "change" not in f.evidence
    assert f.title.startswith("node D3 storage NIC still at 25% of expected")
    # in reach, but no reads logged before it (a recording that starts after it)
    ev = _after_tune_set(1)
    ev = Evidence(ev.samples, ev.decisions, audit=ev.audit)
    (g,) = [f for f in named(rules.run_workflow("snic-imbalance", ev).findings, "node D3")
            if "storage NIC" in f.title]
    assert "still slow" not in g.title and g.evidence["compared"] is False
    assert g.evidence["reads_before"] == {"sent": 0, "reads": 0} and g.evidence["audit_seq"] == 17


def _recorded_change() -> Evidence:
    """A recording: no audit log; alpha halves between samples 4 and 5 (by the API)."""
    def make(i: int) -> ClusterView:
        v = _d3_slow(i)
        if i < 5:
            return v
        th = dataclass_replace(v.scheduler.thresholds, alpha_tokens=ALPHA // 2,
                               source={"alpha": "api", "beta": "config"})
        return dataclass_replace(v, scheduler=dataclass_replace(v.scheduler, thresholds=th))
    ds = (reads(1, T0 + 0.5, 12, 6, step=0.35)
          + reads(13, T0 + 4.6, 12, 0, alpha=ALPHA // 2, step=0.35))
    return Evidence([Sample(T0 + i, make(i), ttft_extras(i)) for i in range(10)], ds)


def test_a_change_inside_a_recording_is_read_off_its_samples_and_decisions() -> None:
    ev = _recorded_change()
    (c,) = ev.changes
    assert (c.what, c.old, c.new, c.by, c.source) == ("alpha", ALPHA, ALPHA // 2, "samples",
                                                      "api")
    assert c.at == T0 + 4.6  # the first decision logged under the new alpha
    (f,) = [f for f in named(rules.run_workflow("snic-imbalance", ev).findings, "node D3")
            if "storage NIC" in f.title]
    assert f.title == ("node D3 storage NIC still slow; reads to D3 down from 50% to 0% since "
                       "alpha 100K -> 50K (set by api, seen in the samples +5 s into the "
                       "window)")
    assert f.evidence["audit_seq"] is None and f.evidence["share_before"] == 0.5


def test_a_controller_step_is_a_change_and_not_seen_twice_in_the_samples() -> None:
    ev = _recorded_change()
    step = Decision(99, T0 + 4.5, -1, 0, -1, -1, 0, 0, -1, -1, -1, "alpha", 0, 0, 0, 0,
                    inputs={"controller": "alpha", "old": float(ALPHA),
                            "new": float(ALPHA // 2)}, kind="control")
    ev = Evidence(ev.samples, (*ev.decisions, step))
    (c,) = ev.changes
    assert (c.by, c.seq, c.at) == ("controller", 99, T0 + 4.5)
    (f,) = [f for f in named(rules.run_workflow("snic-imbalance", ev).findings, "node D3")
            if "storage NIC" in f.title]
    assert f.title.endswith("since alpha 100K -> 50K (controller step, decision #99)")


def test_hbm_fragmented_engine_is_critical_and_named() -> None:
    report = rules.run_workflow("hbm-frag", hbm_fragmented())
    assert report.severity is Severity.CRITICAL
    (f,) = named(report.findings, "engine 4")
    assert "0.97" in f.title and "does not fit" in f.title
    assert f.evidence["largest_free_tokens"] < f.evidence["next_need_tokens"] == 30_000
    assert f.action and "hbm-frag --fix" in f.action
    # the long tail lists the same engine as a cause
    assert named(rules.run_workflow("long-tail", hbm_fragmented()).findings, "engine 4")


def test_a_moderately_fragmented_engine_is_a_warning() -> None:
    ev = window(lambda i: make_view(i, frag={2: 0.6}), decisions=[])
    report = rules.run_workflow("hbm-frag", ev)
    assert report.severity is Severity.WARNING
    assert named(report.findings, "engine 2")


def test_hot_block_is_named_with_its_reads() -> None:
    report = rules.run_workflow("long-tail", hot_block())
    assert report.severity is Severity.WARNING
    (f,) = named(report.findings, "block 7f3a9c0d11")
    assert "read 495 times" in f.title and "storage inspect" in (f.action or "")
    assert f.evidence["hot_blocks"] == {"7f3a9c0d11": 495}


def test_hot_block_is_judged_by_its_share_of_the_store_reads() -> None:
    """The runtime exports each engine's top blocks only: a block is hot by its share of
    every store read in the window (4 hot blocks among 8 exported would hide against the
    exported mean)."""
    def extras(i: int, hot: int) -> Extras:
        reads = {f"{k:032x}": (hot if k < 4 else 3) * i for k in range(8)}
        return dataclass_replace(ttft_extras(i), block_reads=reads,
                                 store_block_reads=(4 * hot + 60) * i)
    faulted = window(extras=lambda i: extras(i, 30))
    report = rules.run_workflow("long-tail", faulted)
    (f,) = [f for f in report.findings if f.subject and f.subject.startswith("block ")]
    assert f.severity is Severity.WARNING and len(f.evidence["hot_blocks"]) == 4
    assert "% of the store's 1620 block reads on its busiest copy" in f.title
    assert f.rule == "hot-block" and f.evidence["hot_share"] == pytest.approx(270 / 1620,
                                                                              abs=1e-4)
    quiet = window(extras=lambda i: extras(i, 3))  # 8 blocks among 72 reads a second
    assert not [f for f in long_tail(quiet) if f.subject and "block" in f.subject]


def test_engine_with_a_slow_service_time_is_named() -> None:
    ev = window(lambda i: make_view(i, service={4: 0.09}))  # 4.5x its decode peers' 20 ms
    (f,) = named(long_tail(ev), "engine 4")
    assert f.severity is Severity.WARNING and f.evidence["ratio_to_peers"] == pytest.approx(4.5)
    assert not named(long_tail(healthy()), "engine 4")


def test_prefills_waiting_for_their_kv_name_the_node() -> None:
    """Read latency on the PE's store reads: the prefill waits for its whole hit before it
    computes; the per-layer slack (measured after the load) stays positive."""
    ev = window(lambda i: make_view(i, kv_wait={0: 0.15, 1: 0.004}))
    report = rules.run_workflow("cache-hit", ev)
    assert report.severity is Severity.CRITICAL
    (f,) = named(report.findings, "node P0")
    assert f.evidence["mean_kv_wait_s"] == pytest.approx(0.15)
    assert kv_waits(healthy()) == {0: pytest.approx(0.004), 1: pytest.approx(0.004)}
    assert rules.run_workflow("cache-hit", healthy()).severity is Severity.OK


def test_hot_blocks_without_per_block_counts_are_not_available_not_ok_by_guess() -> None:
    f = next(f for f in long_tail(healthy()) if "hot blocks" in f.title)
    assert f.severity is Severity.OK and "not available" in f.title


def test_slow_engine_is_named() -> None:
    report = rules.run_workflow("long-tail", slow_engine())
    assert report.severity is Severity.WARNING
    (f,) = named(report.findings, "engine 5")
    assert "decode peers" in f.title and f.evidence["gpu_utilization"] == pytest.approx(0.98)


def test_slow_engine_in_a_pair_is_judged_against_the_other() -> None:
    ev = window(lambda i: make_view(i, seq={0: 9, 1: 1}))  # the two prefill engines
    assert named(long_tail(ev), "engine 0")
    assert not named(long_tail(ev), "engine 1")


def test_engine_persistently_over_beta() -> None:
    ev = window(lambda i: make_view(i, tokens={3: BETA + 1}))
    assert named(long_tail(ev), "engine 3")


def test_ttft_tail_ratio_uses_the_window() -> None:
    ev = window(extras=lambda i: ttft_extras(i, tail=True))
    f = next(f for f in long_tail(ev) if f.title.startswith("TTFT"))
    assert f.severity >= Severity.WARNING and f.evidence["scope"] == "window"
    assert f.evidence["p99_s"] > 4 * f.evidence["p50_s"]


def test_histogram_quantile_matches_prometheus() -> None:
    buckets = [(0.1, 50.0), (0.5, 90.0), (1.0, 100.0), (math.inf, 100.0)]
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.1)
    assert histogram_quantile(0.7, buckets) == pytest.approx(0.3)
    assert histogram_quantile(0.99, buckets) == pytest.approx(0.95)
    assert histogram_quantile(0.5, [(1.0, 0.0)]) is None
    assert histogram_quantile(0.99, [(1.0, 5.0), (math.inf, 10.0)]) == 1.0


def test_late_layers_are_bubbles_and_layer_zero_is_not_judged() -> None:
    ev = window(lambda i: make_view(i, slack={0: -0.02, 2: -0.01, 3: -0.008}))
    report = rules.run_workflow("cache-hit", ev, by_layer=True)
    f = next(f for f in report.findings if "layers load" in f.title)
    assert f.severity is Severity.CRITICAL  # 2 of layers 1..3
    assert f.evidence["late_layers"] == [2, 3]
    rows = f.evidence["layers"]
    assert [r["layer"] for r in rows] == [0, 1, 2, 3]
    assert rows[1]["store_share"] == pytest.approx(0.5)  # tiers over the window's delta
    only_zero = rules.run_workflow("cache-hit", window(lambda i: make_view(i, slack={0: -0.5})))
    assert only_zero.severity is Severity.OK


def test_low_prefix_hits_of_follow_up_turns_warn() -> None:
    ds = [decision(s, cached=100) for s in range(1, 20)]
    f = next(f for f in cache_hit(window(decisions=ds)) if "cached" in f.title)
    assert f.severity is Severity.WARNING and f.evidence["prefix_hit_ratio"] == 0.1


def test_prefetch_accuracy_judged_only_where_blocks_were_prefetched() -> None:
    def extras(i: int) -> Extras:
        return Extras(prefetch_accuracy={0: 0.2, 1: 0.0}, prefetched_blocks={0: 100, 1: 0})
    f = next(f for f in cache_hit(window(extras=extras)) if "prefetch" in f.title)
    assert f.severity is Severity.WARNING and f.evidence["prefetch_accuracy"] == {0: 0.2}


def test_scaling_fifo_growth_with_idle_engines_and_pd_imbalance() -> None:
    ev = window(lambda i: make_view(i, fifo=5 * i, decided=3 * i,
                                    gpu=dict.fromkeys(range(6), 0.3)))
    f = next(f for f in scaling(ev) if "FIFO grew" in f.title)
    assert f.severity is Severity.WARNING and "hierarchical" in (f.action or "")
    busy = window(lambda i: make_view(i, gpu={0: 0.95, 1: 0.95, 2: 0.1, 3: 0.1, 4: 0.1,
                                              5: 0.1}))
    f = next(f for f in scaling(busy) if "prefill-bound" in f.title)
    assert f.action is not None and "dualpath plan pd-ratio --pd 3P3D" in f.action
    assert "dualpath launch --pd 3P3D" in f.action and f.subject == "role prefill"


def test_misclassified_decisions_are_reported_per_engine() -> None:
    # recorded C2 while the inputs say the PE's read queue was over alpha (C3)
    ds = [decision(s, pe=1, pe_class="C2", pe_read_q=ALPHA * 2) for s in range(1, 20)]
    findings = snic_imbalance(window(decisions=ds))
    (f,) = named(findings, "engine 1")
    assert f.evidence["contradicted"] == 19


def test_nic_errors_in_the_window_warn() -> None:
    ev = window(extras=lambda i: Extras(nic_errors=3 * i, nic_drops=0))
    f = next(f for f in snic_imbalance(ev) if "errors" in f.title)
    assert f.severity is Severity.WARNING and f.evidence == {"errors": 27}


def test_no_samples_is_unknown_and_all_takes_the_worst() -> None:
    assert rules.run_workflow("scaling", Evidence([])).severity is Severity.UNKNOWN
    reports = rules.run_all(nic_throttled())
    assert max(r.severity for r in reports) is Severity.CRITICAL
    assert [r.workflow for r in reports] == list(rules.WORKFLOWS)


def test_every_threshold_is_documented_with_its_value() -> None:
    import re
    from pathlib import Path

    doc = (Path(__file__).parents[1] / "docs" / "troubleshooting.md").read_text()
    source = Path(thresholds.__file__).read_text()
    names = re.findall(r"^([A-Z][A-Z_]+) = [0-9.]+$", source, re.M)
    assert len(names) >= 25
    for name in names:
        assert f"`{name}" in doc or f"{name}`" in doc or f"`{name.rsplit('_', 1)[0]}_" in doc, name


def _cost_view(i: int, *, cores: float, call_s: float, calls_per_s: int = 50,
               decided_per_s: int = 40, queued: int = 0, kinds: tuple[str, ...] = ("pe_fetch",)
               ) -> ClusterView:
    """Sample ``i`` with the scheduler thread ``cores`` busy, ``calls_per_s`` pe_fetch calls
    a second each ``call_s`` long, ``decided_per_s`` decisions a second, ``queued`` waiting."""
    from dataclasses import replace

    from dualpath_cli.telemetry.metrics import DECISION_BUCKETS
    from dualpath_cli.telemetry.view import LatencyHistogram

    n = calls_per_s * i
    hist = LatencyHistogram(n, n * call_s, tuple((le, n if call_s <= le else 0)
                                                 for le in DECISION_BUCKETS))
    v = make_view(i, decided=decided_per_s * i, fifo=queued)
    return replace(v, scheduler=replace(v.scheduler, cpu_s=10.0 + cores * i,
                                        decision_latency={k: hist for k in kinds}))


def test_scheduler_cost_healthy_is_ok_with_its_numbers() -> None:
    (f,) = scheduler_cost(window(lambda i: _cost_view(i, cores=0.05, call_s=2e-4)))
    assert f.severity is Severity.OK
    e = f.evidence
    assert e["scheduler_cpu_cores"] == pytest.approx(0.05)
    assert e["cpu_s_per_decision"] == pytest.approx(0.05 / 40)
    assert e["requests_per_s"] == pytest.approx(40.0) and e["decision_calls"] == {
        "pe_fetch": 450}
    # p99 inside the 250 us bucket, far below the 25 ms between two requests
    assert 1e-4 < e["decision_p99_s"]["pe_fetch"] <= 2.5e-4
    assert e["decision_p99_over_arrival_gap"] < thresholds.DECISION_P99_WARN
    assert "0.05 cores busy" in f.title
    assert not [g for g in scaling(window(lambda i: _cost_view(i, cores=0.05,
                                                                       call_s=2e-4)))
                if g.severity]


def test_a_saturated_scheduler_thread_recommends_hierarchical_scheduling() -> None:
    # 0.8 of a core: WARNING; 0.95: CRITICAL; each names the numbers and the remedy
    from functools import partial

    for cores, severity in ((0.8, Severity.WARNING), (0.95, Severity.CRITICAL)):
        ev = window(partial(_cost_view, cores=cores, call_s=2e-4))
        (f,) = scheduler_cost(ev)
        assert f.severity is severity and f.subject == "scheduler"
        assert f.evidence["scheduler_cpu_cores"] == pytest.approx(cores)
        assert f"{cores:.2f} cores busy" in f.title and "40.0 requests/s" in f.title
        assert "scheduler.hierarchical" in (f.action or "")
        assert "dualpath sim run --pd 2P4D --set scheduler.hierarchical=true" in (f.action
                                                                                 or "")
        assert "launch with --set scheduler.hierarchical=true" in (f.action or "")
        # the workflow carries it, and its exit code is the finding's
        assert rules.run_workflow("scaling", ev).severity is severity


def test_a_saturated_hierarchy_is_told_to_add_sub_schedulers() -> None:
    # the root's routing is timed (root_route) only when the hierarchy is on: the remedy is
    # more subs, not the hierarchy it already runs
    from functools import partial

    ev = window(partial(_cost_view, cores=0.95, call_s=2e-4, kinds=("pe_fetch", "root_route")))
    (f,) = scheduler_cost(ev)
    assert f.severity is Severity.CRITICAL
    assert "hierarchical scheduling is on" in (f.action or "")
    assert "--set scheduler.sub_schedulers=N" in (f.action or "")
    assert "launch with --set scheduler.hierarchical=true" not in (f.action or "")


def test_decision_p99_is_judged_against_the_request_rate() -> None:
    # five 20 ms calls a second (0.1 s of a second, inside the thread's 0.3 s of CPU): at 40
    # requests/s (25 ms apart) p99 is ~0.8 of the gap -> WARNING; with a queue growing 20 a
    # second the arrival rate is 60/s (16.7 ms apart) -> CRITICAL
    def cost(i: int, **kw: Any) -> ClusterView:
        return _cost_view(i, cores=0.3, call_s=0.02, calls_per_s=5, **kw)

    (f,) = scheduler_cost(window(cost))
    assert f.severity is Severity.WARNING and f.subject == "scheduler"
    assert 0.5 <= f.evidence["decision_p99_over_arrival_gap"] < 1.0
    assert f.evidence["decision_p99_s"]["pe_fetch"] == pytest.approx(0.02, rel=0.3)
    assert "(pe_fetch)" in f.title and "25 ms between requests" in f.title
    assert "dualpath sim run --pd 2P4D --set scheduler.hierarchical=true" in (f.action or "")
    (g,) = scheduler_cost(window(lambda i: cost(i, queued=20 * i)))
    assert g.severity is Severity.CRITICAL and g.evidence["requests_per_s"] == 60.0
    # the same calls at 1 request/s are fine: the p99 is a small share of a second
    (h,) = scheduler_cost(window(lambda i: cost(i, decided_per_s=1)))
    assert h.severity is Severity.OK
    # too few calls to judge a p99: said so, not guessed
    (k,) = scheduler_cost(window(lambda i: _cost_view(i, cores=0.3, call_s=0.5,
                                                            calls_per_s=1)))
    assert k.severity is Severity.OK and "not judged" in k.title


def test_slow_calls_on_a_starved_thread_ask_for_a_core_not_a_hierarchy() -> None:
    # fifty 20 ms calls a second take 1 s of wall a second, the thread ran 0.3 s: the calls
    # waited for a CPU (a loaded host, the GIL), which sub-schedulers would not fix
    (f,) = scheduler_cost(window(lambda i: _cost_view(i, cores=0.3, call_s=0.02)))
    assert f.severity is Severity.WARNING and f.subject == "scheduler"
    assert f.evidence["decision_wall_s"] == pytest.approx(9.0)
    assert "waited for a CPU" in f.title and "starved" in (f.cause or "")
    assert "free a core" in (f.action or "") and "hierarchical" not in (f.action or "")


def test_scheduler_cost_not_reported_says_so_and_survives_a_recording(tmp_path: Any) -> None:
    (f,) = scheduler_cost(healthy())
    assert f.severity is Severity.OK and "not available" in f.title
    from dualpath_cli.services.recording import read_recording, write_recording

    ev = window(lambda i: _cost_view(i, cores=0.8, call_s=2e-4))
    path = tmp_path / "cost.jsonl.gz"
    write_recording(path, {}, ev.samples, ev.decisions)
    back = read_recording(path)
    assert back.samples[-1].view.scheduler == ev.samples[-1].view.scheduler
    (g,) = scheduler_cost(Evidence(back.samples, back.decisions))
    assert g.severity is Severity.WARNING and g.evidence == scheduler_cost(ev)[0].evidence
