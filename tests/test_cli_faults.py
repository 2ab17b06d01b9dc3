"""`dualpath faults list|inject|clear` against a FakeClient behind ``source.connect``: the
rendering, the ids, the audit, the one-line errors (no processes: the quick tier)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from test_diagnose_rules import make_view

from dualpath_cli.api.fake import FakeClient
from dualpath_cli.cli.app import main
from dualpath_cli.cli.faults_cmd import fault_line
from dualpath_cli.faultspec import Fault

pytestmark = pytest.mark.usefixtures("fake_env")  # conftest: the fake cluster's URL, token


def run(capsys: pytest.CaptureFixture[str], *args: str, code: int = 0) -> Any:
    got = main(list(args))
    out = capsys.readouterr()
    assert got == code, out.err
    return json.loads(out.out) if "--json" in args and code == 0 else out


def test_inject_lists_and_clears_by_id_and_all(fake: FakeClient,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    out = run(capsys, "faults", "inject", "snic_throttle:node=1,fraction=0.25",
              "slow_compute:engine=0,factor=3")
    assert "audit #1: 2 fault(s) in force" in out.out
    assert "fault #1 snic_throttle node 1 fraction 0.25 (since " in out.out
    assert "fault #2 slow_compute engine 0 factor 3" in out.out
    listed = run(capsys, "faults", "list", "--json")["faults"]
    assert [(f["id"], f["kind"]) for f in listed] == [(1, "snic_throttle"), (2, "slow_compute")]
    assert all(f["since"] > 0 for f in listed)
    data = run(capsys, "faults", "clear", "1", "--json")
    assert data["audit"] == 2 and [f["id"] for f in data["faults"]] == [2]
    assert [f["id"] for f in data["before"]] == [1, 2]
    run(capsys, "faults", "clear", "--all")
    assert "no faults in force" in run(capsys, "faults", "list").out
    assert [a.action for a in fake.audit] == ["faults"] * 3


def test_replacing_a_fault_gives_it_a_new_id(fake: FakeClient,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    run(capsys, "faults", "inject", "snic_throttle:node=1,fraction=0.25")
    run(capsys, "faults", "inject", "snic_throttle:node=1,fraction=0.5")
    listed = run(capsys, "faults", "list", "--json")["faults"]
    assert [(f["id"], f["fraction"]) for f in listed] == [(2, 0.5)]


def test_errors_are_one_line(fake: FakeClient, capsys: pytest.CaptureFixture[str]) -> None:
    err = run(capsys, "faults", "inject", "snic_throttle:node=1", code=2).err
    assert "missing fraction" in err and len(err.strip().splitlines()) == 1
    assert "set_faults" not in fake.calls  # refused before the cluster is asked
    err = run(capsys, "faults", "clear", code=2).err
    assert "give one fault ID or --all" in err
    err = run(capsys, "faults", "clear", "7", code=2).err
    assert "no fault #7 in force" in err and "404" in err


def test_inject_needs_the_token(fake: FakeClient, capsys: pytest.CaptureFixture[str],
                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fake, "client_token", None)
    err = run(capsys, "faults", "inject", "fabric_drop:engine=1", code=1).err
    assert "401" in err and not fake.faults


def test_fault_line_names_id_target_and_since() -> None:
    f = Fault("read_latency", node=2, latency_s=0.05, id=3, since=3600 * 3 + 602.0)
    assert fault_line(f) == "fault #3 read_latency node 2 latency 50ms (since 03:10:02 UTC)"
    assert Fault.from_dict(f.to_dict()) == f


def _monitor_text(faults: tuple[Fault, ...], util: dict[int, float] | None = None) -> str:
    import io

    from rich.console import Console

    from dualpath_cli.cli.monitor_cmd import MONITOR_METRICS, History, render_table
    from dualpath_cli.telemetry.recording import Sample

    view = make_view(0, util=util)
    buf = io.StringIO()
    Console(file=buf, width=160, color_system=None).print(render_table(
        Sample(view.at, view), [MONITOR_METRICS["snic_util"]], "node", None, History(), False,
        faults))
    return buf.getvalue()


def test_monitor_by_node_marks_the_degraded_node_beside_its_capacity() -> None:
    text = _monitor_text((Fault("snic_throttle", node=3, fraction=0.25, id=4, since=1.0),))
    line = next(x for x in text.splitlines() if "node D3" in x)
    assert "node D3 !" in line and "GB/s" in line  # the mark beside the name, the rate
    assert "node D3 ! degraded: fault #4 snic_throttle" in text  # what it stands for
    assert "!" not in next(x for x in text.splitlines() if "node D2" in x)
    assert "degraded" not in _monitor_text(())  # nothing covers a part: no marks


def test_monitor_by_node_marks_a_node_an_open_finding_covers() -> None:
    text = _monitor_text((), util={3: 1.0})  # D3's NIC saturated, the others at 50%
    assert re.search(r"node D3 !!? degraded: .*snic-imbalance", text), text
    assert "!" not in next(x for x in text.splitlines() if "node D2" in x)


def test_monitor_json_and_replay_name_the_faults_in_force() -> None:
    from dualpath_cli.cli.monitor_cmd import MONITOR_METRICS, sample_json
    from dualpath_cli.diagnose.degraded import faults_at
    from dualpath_cli.telemetry.recording import Sample
    from dualpath_cli.telemetry.view import AuditEntry

    f = Fault("slow_compute", engine=3, factor=2.0, id=1, since=10.0)
    audit = [AuditEntry(1, 10.0, "tok", "faults", {"faults": []}, {"faults": [f.to_dict()]}),
             AuditEntry(2, 20.0, "tok", "faults", {"faults": [f.to_dict()]}, {"faults": []})]
    assert faults_at(audit, 5.0) == () and faults_at(audit, 15.0) == (f,)
    assert faults_at(audit, 25.0) == () and faults_at(None, 15.0) == ()
    view = make_view(0)
    obj = sample_json(Sample(view.at, view), [MONITOR_METRICS["snic_util"]], "node", None,
                      False, {}, faults_at(audit, 15.0))
    rows = {r["key"]: r for r in obj["metrics"]["snic_util"]["rows"]}
    engine3_node = next(e.node for e in view.engines if e.engine_id == 3)
    hit = [k for k, r in rows.items() if r["degraded"]]
    assert len(hit) == 1 and rows[hit[0]]["node"] == engine3_node
    assert rows[hit[0]]["faults"] == [1] and rows[hit[0]]["capacity_bytes_per_s"] > 0
