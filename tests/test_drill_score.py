"""The drill's scorecard (services/drill_score.py) and its row catalogue: pure, quick tier."""

from __future__ import annotations

from pathlib import Path

import pytest

from dualpath_cli.errors import UsageError
from dualpath_cli.services.drill import pick_rows
from dualpath_cli.services.drill_rows import DEATH_S, DEGRADE_S, ROWS, corrupt_one_block
from dualpath_cli.services.drill_score import (
    Expect,
    MetricSample,
    RowResult,
    exit_code,
    matching_findings,
    metric_values,
    parse_metrics,
    scorecard,
    worst_grade,
)


def _passing(**kw: object) -> RowResult:
    base: dict[str, object] = dict(fault="snic_throttle", want="CRITICAL", deadline_s=10.0,
                                   status_s=0.5, diagnose_s=4.0, metrics_s=1.0,
                                   grade="CRITICAL", subject="node D1", subject_right=True,
                                   cleared=True, turns=12, tokens_identical=True)
    base.update(kw)
    return RowResult(**base)  # type: ignore[arg-type]


def test_a_row_passes_only_when_every_promise_held() -> None:
    ok = _passing()
    assert ok.passed and ok.detected_s == 4.0 and exit_code([ok]) == 0
    failing = [
        _passing(diagnose_s=None),  # diagnose never named it
        _passing(diagnose_s=10.5),  # too late
        _passing(grade="WARNING"),  # the wrong grade
        _passing(subject_right=False),
        _passing(fix="alpha -> 1s", fix_helped=False),
        _passing(cleared=False),
        _passing(turns_lost=1),
        _passing(tokens_identical=False),
        _passing(turns=0),  # no load: nothing proven
        _passing(skipped="cannot be made here"),
        _passing(error="boom"),
    ]
    for r in failing:
        assert not r.passed, r
        assert exit_code([ok, r]) == 2
    assert exit_code([]) == 2  # nothing ran: no pass
    assert _passing(fix="alpha -> 1s", fix_helped=True).passed


def test_to_dict_has_passed_and_detected_s() -> None:
    d = _passing(status_s=0.12345).to_dict()
    assert d["passed"] is True and d["detected_s"] == 4.0 and d["status_s"] == 0.123
    assert _passing(metrics_s=None).to_dict()["detected_s"] is None


def test_parse_metrics_and_sum_by_labels() -> None:
    text = ('# HELP x\n'
            'dualpath_engine_up{engine="1",node="1",role="decode"} 0\n'
            'dualpath_engine_up{engine="2",node="2",role="decode"} 1\n'
            'dualpath_kv_miss_blocks_total{reason="read_failed"} 3.0\n'
            'dualpath_kv_miss_blocks_total{reason="absent"} 5.0\n'
            'other_metric 9\n')
    samples = parse_metrics(text)
    assert len(samples) == 4
    assert metric_values(samples, "dualpath_kv_miss_blocks_total") == 8.0
    assert metric_values(samples, "dualpath_kv_miss_blocks_total", reason="read_failed") == 3.0
    assert metric_values(samples, "dualpath_engine_up", engine="2") == 1.0
    assert metric_values(samples, "nothing") == 0.0


def test_matching_findings_want_workflow_subject_and_a_grade() -> None:
    reports = [{"workflow": "snic-imbalance", "findings": [
        {"workflow": "snic-imbalance", "severity": "WARNING", "subject": "node D1"},
        {"workflow": "snic-imbalance", "severity": "CRITICAL", "subject": "node D2"},
        {"workflow": "snic-imbalance", "severity": "OK", "subject": "node D1"}]},
        {"workflow": "long-tail", "findings": [
            {"workflow": "long-tail", "severity": "CRITICAL", "subject": "node D1"},
            {"workflow": "long-tail", "severity": "WARNING", "subject": "block 7f3a00"}]}]
    exp = Expect("snic-imbalance", ("node D1",), "CRITICAL", 10.0)
    found = matching_findings(reports, exp)
    assert [f["severity"] for f in found] == ["WARNING"]  # not D2's, not the OK one
    anyw = Expect(None, ("node D1",), "CRITICAL", 10.0)
    assert [f["workflow"] for f in matching_findings(reports, anyw)] == ["long-tail",
                                                                       "snic-imbalance"]
    blocks = Expect("long-tail", ("block ",), "WARNING", 10.0)
    assert [f["subject"] for f in matching_findings(reports, blocks)] == ["block 7f3a00"]
    assert worst_grade(found) == "WARNING" and worst_grade([]) == "OK"
    # a corrupt block must be found corrupt: a finding that it is hot is not about that
    corrupt = Expect(None, ("block 7f3a00",), "WARNING", 10.0, words=("corrupt",))
    assert matching_findings(reports, corrupt) == []
    reports[1]["findings"].append({"workflow": "cache-hit", "severity": "WARNING",
                                   "subject": "block 7f3a00",
                                   "title": "block 7f3a00 corrupt (checksum), quarantined"})
    assert [f["workflow"] for f in matching_findings(reports, corrupt)] == ["cache-hit"]


def test_scorecard_cells() -> None:
    rows = [_passing(fix="alpha -> 1s", fix_helped=True),
            RowResult("node_leave", skipped="no joined node"),
            _passing(fault="kill_decode", grade="", subject="none", subject_right=False,
                     diagnose_s=None, tokens_identical=False)]
    cells = scorecard(rows)
    assert cells[0]["grade (want)"] == "CRITICAL (CRITICAL)" and cells[0]["passed"] == "yes"
    assert cells[1]["detected"] == "skipped" and cells[1]["passed"] == "skip"
    assert cells[2]["detected"] == "-" and cells[2]["tokens"] == "DIFFER"
    assert cells[2]["subject"] == "none (wrong)" and cells[2]["passed"] == "NO"


def test_catalogue_deadlines_follow_the_issue_and_only_picks() -> None:
    names = [r.name for r in ROWS]
    assert len(set(names)) == len(names)
    for r in ROWS:
        if r.how in ("kill", "leave"):
            # a death stops an engine: CRITICAL; a leave on purpose while another node of
            # its role serves is less capacity: WARNING (membership's documented rule)
            assert r.deadline_s == DEATH_S == 2.0
            assert r.grade == ("CRITICAL" if r.how == "kill" else "WARNING")
        else:
            assert r.deadline_s == DEGRADE_S == 10.0
    # every injectable fault kind has its row
    from dualpath_cli.faultspec import FAULT_KINDS

    assert set(FAULT_KINDS) <= set(names)
    assert [r.name for r in pick_rows(["kill_decode", "snic_throttle"])] == [
        "snic_throttle", "kill_decode"]
    assert len(pick_rows([])) == len(ROWS)
    with pytest.raises(UsageError, match="unknown row nope"):
        pick_rows(["nope"])


def test_corrupt_one_block_flips_a_payload_byte(tmp_path: Path) -> None:
    d = tmp_path / "blocks" / "ab"
    d.mkdir(parents=True)
    block = d / "abcdef.kv"
    block.write_bytes(bytes(8192))
    path, key = corrupt_one_block(tmp_path)
    assert path == block and key == "abcdef"
    data = block.read_bytes()
    assert len(data) == 8192 and data[4096 + 7] == 1 and data.count(0) == 8191
    corrupt_one_block(tmp_path)  # a second drill before anything read it: still corrupt
    assert block.read_bytes()[4096 + 7] == 2
    with pytest.raises(FileNotFoundError):
        corrupt_one_block(tmp_path / "empty")


def test_corrupt_one_block_skips_blocks_with_a_copy(tmp_path: Path) -> None:
    """A block copied to the replica root beside the store may be read from the copy: the
    drill corrupts the first block without one."""
    store = tmp_path / "store"
    for key in ("aa11", "bb22"):
        d = store / "blocks" / key[:2]
        d.mkdir(parents=True)
        (d / f"{key}.kv").write_bytes(bytes(8192))
    (tmp_path / "replica" / "aa").mkdir(parents=True)
    (tmp_path / "replica" / "aa" / "aa11.kv").write_bytes(bytes(8192))
    path, key = corrupt_one_block(store)
    assert key == "bb22" and path.read_bytes()[4096 + 7] == 1
    assert (store / "blocks" / "aa" / "aa11.kv").read_bytes() == bytes(8192)
    # every block copied: the first one is corrupted in the store and in its copy
    (tmp_path / "replica" / "bb").mkdir()
    (tmp_path / "replica" / "bb" / "bb22.kv").write_bytes(bytes(8192))
    path, key = corrupt_one_block(store)
    assert key == "aa11"
    assert path.read_bytes()[4096 + 7] == 1
    assert (tmp_path / "replica" / "aa" / "aa11.kv").read_bytes()[4096 + 7] == 1


class _Looks:
    """A watch whose looks yield prepared reports (what ``_better`` reads)."""

    def __init__(self, reports: list[list[dict[str, object]]]) -> None:
        self._reports = reports
        self.samples: list[int] = []

    def look(self) -> None:
        self.samples.append(len(self.samples))

    def reports(self) -> list[dict[str, object]]:
        return [{"findings": self._reports[min(len(self.samples), len(self._reports)) - 1]}]


def test_a_fix_judged_by_its_evidence_helps_when_the_value_falls_not_the_grade() -> None:
    """hot_blocks: copies halve the busiest copy's share while the grade stays WARNING; the
    first look after the fix counts since start and judges nothing."""
    from dualpath_cli.services.drill import _better
    from dualpath_cli.services.drill_rows import FIX_DROP, Made

    (row,) = [r for r in ROWS if r.name == "hot_blocks"]
    assert row.fix_drops == "hot_share" and row.grade == "WARNING"
    made = Made("hot", Expect("long-tail", ("node D1",), "WARNING", 10.0))

    def finding(share: float) -> dict[str, object]:
        return {"workflow": "long-tail", "severity": "WARNING", "subject": "node D1",
                "evidence": {"hot_share": share}}

    was = finding(0.26)
    same = _Looks([[finding(0.13)], [finding(0.25)]])
    assert not _better(same, made, "WARNING", "hot_share", was)  # type: ignore[arg-type]
    assert not _better(same, made, "WARNING", "hot_share", was)  # type: ignore[arg-type]
    halved = _Looks([[finding(0.26)], [finding(0.26 * FIX_DROP - 0.01)]])
    notes: list[str] = []
    assert not _better(halved, made, "WARNING", "hot_share", was, notes)  # type: ignore[arg-type]
    assert _better(halved, made, "WARNING", "hot_share", was, notes)  # type: ignore[arg-type]
    assert notes == ["fix: hot_share 0.26 -> 0.185 (grade WARNING)"]
    # a row judged by its grade: the grade must drop
    graded = _Looks([[finding(0.1)]])
    assert not _better(graded, made, "WARNING")  # type: ignore[arg-type]


class _NoReplicaRoots:
    """A client whose store has no replica roots (as the server refuses a copy)."""

    def replicate_blocks(self, blocks: list[str], copies: int | None) -> None:
        from dualpath_cli.errors import DualPathError
        from dualpath_cli.services.replicate import NO_REPLICA_ROOTS

        raise DualPathError(f"HTTP 422: {NO_REPLICA_ROOTS}, so a copy has nowhere to go")


def test_hot_blocks_fix_on_a_store_without_replica_roots_is_not_applicable_when_said() -> None:
    """Joined nodes launched without --replica-root: the copies the finding offers cannot be
    made, and the finding says so (launch --replica-root DIR): no fix applied, not a failed
    one. A finding that does not name the precondition misled the operator: refused."""
    from dualpath_cli.services.drill import _fix_for
    from dualpath_cli.services.drill_rows import Made

    told = {"action": "dualpath diagnose long-tail --fix   (copies ...; a store without "
                      "them: launch --replica-root DIR)", "evidence": {"hot_blocks": {"ab": 30}}}
    made = Made("hot", Expect("long-tail", ("node D1",), "WARNING", 10.0))
    label, _ = _fix_for(_NoReplicaRoots(), told, made)
    assert "not applicable" in label and "fix_not_applicable" in made.detail
    assert "fix_refused" not in made.detail
    silent = {"action": "dualpath diagnose long-tail --fix", "evidence": {"hot_blocks": {"ab": 30}}}
    made = Made("hot", Expect("long-tail", ("node D1",), "WARNING", 10.0))
    label, _ = _fix_for(_NoReplicaRoots(), silent, made)
    assert label == "replicate (refused)" and "fix_refused" in made.detail


def test_a_leave_the_embedded_default_cannot_make_runs_on_the_joined_cluster() -> None:
    """On the embedded default (every node in one launcher) the leave row is routed to the
    drill's own joined cluster; with none to launch (a cluster given by --port) it stays
    skipped with its reason, and a joined cluster that fails to launch fails the row with
    that error (never a pass, never a silent skip)."""
    from types import SimpleNamespace

    from dualpath_cli.services.drill import _Side
    from dualpath_cli.services.drill_cluster import LaunchFailed
    from dualpath_cli.services.drill_rows import Target

    members = SimpleNamespace(nodes=[SimpleNamespace(role="decode", state="serving")] * 2,
                              name_of=lambda n: None)
    embedded = Target(SimpleNamespace(membership=members),  # type: ignore[arg-type]
                      SimpleNamespace(engines=()), True, None)  # type: ignore[arg-type]
    leave, kill = (next(r for r in ROWS if r.name == n) for n in ("node_leave", "kill_decode"))
    assert "no joined decode node" in leave.skip_reason(embedded)

    def fails() -> object:
        raise LaunchFailed("the drill's joined node D1 exited (1): boom")

    assert not _Side(None).wanted(leave, embedded)
    side = _Side(fails)  # type: ignore[arg-type]
    assert side.wanted(leave, embedded) and not side.wanted(kill, embedded)
    res = side.run(leave)
    assert res.error == "on the drill's joined cluster: the drill's joined node D1 exited " \
        "(1): boom" and not res.passed and not res.skipped
    assert res.notes == [_Side.NOTE]


def test_the_corrupt_block_is_one_the_load_reads_from_the_store(tmp_path: Path) -> None:
    """Engines keep a prefix in HBM once read, so the store is read only for some blocks: the
    drill corrupts the block the load read most since its row started (every copy of it),
    not merely the first file (which no turn may read again: no surface could see it)."""
    from dualpath_cli.services.drill import blocks_read

    def reads(**by_node: dict[str, float]) -> list[MetricSample]:
        return [MetricSample("dualpath_storage_block_reads_total",
                             {"node": node, "block": k}, v)
                for node, blocks in by_node.items() for k, v in blocks.items()]

    before = reads(n1={"aa11": 9.0, "bb22": 1.0})
    after = reads(n1={"aa11": 9.0, "bb22": 2.0}, n2={"cc33": 1.0, "bb22": 1.0})
    assert blocks_read(before, after) == ("bb22", "cc33")  # aa11 was not read again
    assert blocks_read(after, after) == ()
    store = tmp_path / "store"
    for key in ("aa11", "bb22", "cc33"):
        d = store / "blocks" / key[:2]
        d.mkdir(parents=True)
        (d / f"{key}.kv").write_bytes(bytes(8192))
    (tmp_path / "replica" / "bb").mkdir(parents=True)
    (tmp_path / "replica" / "bb" / "bb22.kv").write_bytes(bytes(8192))
    path, key = corrupt_one_block(store, ("dd44", "bb22", "cc33"))  # dd44: not stored
    assert key == "bb22" and path.read_bytes()[4096 + 7] == 1
    assert (tmp_path / "replica" / "bb" / "bb22.kv").read_bytes()[4096 + 7] == 1
    assert (store / "blocks" / "aa" / "aa11.kv").read_bytes() == bytes(8192)


def test_read_latency_goes_on_the_store_the_load_reads() -> None:
    """A slow store is seen only through its reads (store-latency needs 10 of the node): the
    row faults the node whose store the load read most before the fault, as read_errors does;
    the other storage rows keep the first decode node."""
    from types import SimpleNamespace

    from dualpath_cli.services.drill import nodes_read
    from dualpath_cli.services.drill_rows import Target

    def counts(**by_node: float) -> list[MetricSample]:
        return [MetricSample("dualpath_storage_read_latency_seconds_count",
                             {"node": n.removeprefix("n"), "tier": "store"}, v)
                for n, v in by_node.items()] + [MetricSample(
                    "dualpath_storage_read_latency_seconds_count",
                    {"node": "1", "tier": "dram"}, 500.0)]

    assert nodes_read(counts(n0=100, n1=5, n2=5), counts(n0=250, n1=20, n2=30)) == (0, 2, 1)
    names = {0: "P0", 1: "D1", 2: "D2"}
    engines = [SimpleNamespace(engine_id=i, node=i, role="prefill" if i == 0 else "decode",
                               state="ready") for i in range(3)]
    status = SimpleNamespace(membership=SimpleNamespace(name_of=names.get))
    t = Target(status, SimpleNamespace(engines=engines), True, None,  # type: ignore[arg-type]
               read_nodes=(0, 2, 1))
    rows = {r.name: r for r in ROWS}
    sent: list[str] = []

    def inject(specs: object) -> int:
        sent.extend(specs)  # type: ignore[call-overload]
        return 7

    made = rows["read_latency"].make(t, inject)
    assert sent == ["read_latency:node=0,latency=200ms"] and made.node == 0
    assert made.expect.subjects == ("node P0",)
    rows["read_errors"].make(t, inject)
    assert sent[-1] == "read_errors:node=0,rate=0.5"
    rows["store_full"].make(t, inject)
    assert sent[-1] == "store_full:node=1"  # a write fault: the first decode node, as before
    # no reads counted: the first decode node
    bare = Target(status, SimpleNamespace(engines=engines), True, None)  # type: ignore[arg-type]
    assert bare.reading_node() == 1


class _Replicates:
    """A client whose copy adds the given roots per block (none: already on every root)."""

    def __init__(self, added: dict[str, list[str]]) -> None:
        self.added = added

    def replicate_blocks(self, blocks: list[str], copies: int | None) -> object:
        from dualpath_cli.telemetry.view import AuditEntry

        return AuditEntry(1, 0.0, "tok", "replicate", {}, {"added": self.added})


def test_a_copy_that_adds_nothing_is_a_fix_that_failed_not_one_that_helped() -> None:
    """The finding offered --fix for blocks already on every root: the drill says the advice
    changed nothing (the row fails) instead of waiting for a drop that cannot come."""
    from dualpath_cli.services.drill import _fix_for
    from dualpath_cli.services.drill_rows import Made

    offered = {"action": "dualpath diagnose long-tail --fix",
               "evidence": {"hot_blocks": {"ab": 30}}}
    made = Made("hot", Expect("long-tail", ("node D1",), "WARNING", 10.0))
    label, _ = _fix_for(_Replicates({"ab": []}), offered, made)
    assert label == "replicate (nothing to copy)" and "fix_failed" in made.detail
    made = Made("hot", Expect("long-tail", ("node D1",), "WARNING", 10.0))
    label, _ = _fix_for(_Replicates({"ab": ["/r1"]}), offered, made)
    assert label == "replicate 1 blocks" and not made.detail
    # a finding that says the copies exist offers no fix to apply
    told = {"action": "add a replica root: the 1 hot blocks already have a copy on each of "
                      "the 2 roots serving copies", "evidence": {"hot_blocks": {"ab": 30}}}
    made = Made("hot", Expect("long-tail", ("node D1",), "WARNING", 10.0))
    assert _fix_for(_Replicates({}), told, made)[0] == ""
