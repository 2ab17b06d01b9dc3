"""``dualpath diagnose`` and ``dualpath record`` through the real CLI entry point.

Fault windows come from tests/test_diagnose_rules.py; they reach the command as recordings
(``--from``) or through a FakeClient behind ``source.connect`` (live). Exit codes are
the contract: 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN (bad arguments and no cluster too).
"""

from __future__ import annotations

import dataclasses
import gzip
import json
from pathlib import Path

import pytest
from test_diagnose_rules import (
    ALPHA,
    T0,
    _after_tune_set,
    _recorded_change,
    healthy,
    hot_block,
    make_view,
    nic_throttled,
    slow_engine,
)

from dualpath_cli.api.fake import FakeClient
from dualpath_cli.cli import source
from dualpath_cli.cli.app import main
from dualpath_cli.diagnose.model import Evidence
from dualpath_cli.services.recording import read_recording, trace_from_decisions, write_recording
from dualpath_cli.workload.trace_format import decode_lines


def record(ev: Evidence, path: Path) -> Path:
    write_recording(path, {"source": "test"}, ev.samples, ev.decisions)
    return path


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("make,workflow,code,subject", [
    (healthy, "all", 0, None),
    (nic_throttled, "snic-imbalance", 2, "node D3"),
    (nic_throttled, "perf-drop", 2, "node D3"),
    (hot_block, "long-tail", 1, "block 7f3a9c0d11"),
    (slow_engine, "long-tail", 1, "engine 5"),
    (nic_throttled, "all", 2, "node D3"),
])
def test_verdicts_from_a_recording(make, workflow: str, code: int, subject: str | None,
                                   tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = record(make(), tmp_path / "w.jsonl.gz")
    rc, out, _ = run(["diagnose", workflow, "--from", str(path), "--json"], capsys)
    assert rc == code
    doc = json.loads(out)
    assert doc["exit_code"] == code and doc["samples"] == 10
    subjects = {f["subject"] for r in doc["reports"] for f in r["findings"]
                if f["severity"] != "OK"}
    if subject is None:
        assert subjects == set()
    else:
        assert subject in subjects


def test_human_rendering_has_severity_evidence_cause_and_command(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = record(nic_throttled(), tmp_path / "w.jsonl")
    rc, out, _ = run(["diagnose", "snic-imbalance", "--from", str(path)], capsys)
    assert rc == 2
    lines = out.splitlines()
    assert lines[0].startswith("CRITICAL snic-imbalance  decode storage NICs Max/Avg 1.95")
    assert any(line.startswith("CRITICAL snic-imbalance  node D3 storage NIC at 25% of "
                               "expected") for line in lines)
    assert "likely: a degraded or throttled storage link on D3" in out
    assert "do:     check the storage NIC of D3" in out
    assert "why:    snic-link 25% of expected over 10 samples: CRITICAL" in out
    assert out.rstrip().splitlines()[-1].startswith("CRITICAL (exit 2): 1 workflow over 9 s")


def test_findings_wrap_under_themselves_on_an_80_column_terminal() -> None:
    """On a terminal each finding reads as a block at 80 columns (continuations under the
    text they continue); on a pipe each part stays one line, whole for ``grep``."""
    import io

    from rich.console import Console

    from dualpath_cli.cli.diagnose_cmd import render_reports
    from dualpath_cli.diagnose.rules import run_workflow

    reports = [run_workflow("snic-imbalance", nic_throttled())]
    term = io.StringIO()
    render_reports(Console(file=term, width=80, force_terminal=True, color_system=None),
                   reports, "w.jsonl")
    lines = term.getvalue().splitlines()
    assert max(len(line) for line in lines) <= 80, lines
    do = next(i for i, line in enumerate(lines) if "do:     check the storage NIC" in line)
    indent = lines[do].index("check")
    assert lines[do + 1][:indent].strip() == "" and lines[do + 1][indent] != " "
    pipe = io.StringIO()
    render_reports(Console(file=pipe, width=80), reports, "w.jsonl")
    assert any(len(line) > 80 for line in pipe.getvalue().splitlines())
    assert len(pipe.getvalue().splitlines()) < len(lines)


def test_live_window_through_the_client(monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    ev = nic_throttled()
    fake = FakeClient(list(ev.views), ev.decisions)
    monkeypatch.setattr(source, "connect", lambda ref, timeout: fake)
    rc, out, _ = run(["diagnose", "snic-imbalance", "--window", "1s", "--interval", "250ms",
                      "--json"], capsys)
    assert rc == 2
    doc = json.loads(out)
    assert doc["samples"] == 5 and fake.calls.count("view") == 5
    assert any(f["subject"] == "node D3" for f in doc["reports"][0]["findings"])


def test_live_recheck_after_tune_set_compares_reads_before_and_after_the_audited_change(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Story 2: `tune set alpha=` (audit #17, just before the window), then the re-check:
    the reads before the change come from the cluster's decision log before the window."""
    from dualpath_cli.telemetry.view import AuditEntry

    ev = _after_tune_set(1)
    fake = FakeClient(list(ev.views)[:5], [*ev.earlier, *ev.decisions])
    fake.audit.append(AuditEntry(17, T0 - 3.0, "tok-1", "scheduler", {"alpha_tokens": ALPHA},
                                 {"alpha_tokens": ALPHA // 2}))
    monkeypatch.setattr(source, "connect", lambda ref, timeout: fake)
    rc, out, _ = run(["diagnose", "snic-imbalance", "--window", "1s", "--interval", "250ms",
                      "--json"], capsys)
    doc = json.loads(out)
    (f,) = [f for f in doc["reports"][0]["findings"]
            if f["subject"] == "node D3" and "storage NIC" in f["title"]]
    assert f["title"] == ("node D3 storage NIC still slow; reads to D3 down from 40% to 4% "
                          "since alpha 100K -> 50K (audit #17)")
    # reads now avoid D3, yet its link is still at 25%: the grade is the link's (snic-link)
    assert rc == 2 and f["severity"] == "CRITICAL" and f["rule"] == "snic-link"
    assert "tune set" not in f["action"]  # no further step: reads already avoid it
    e = f["evidence"]
    assert (e["share_before"], e["share_after"], e["audit_seq"]) == (0.4, 0.04, 17)
    assert doc["decisions"] == 25  # the window's own; the earlier ones only judge the change
    # no change in the audit log: one status call, no extra fetch of older decisions
    fake2 = FakeClient(list(ev.views)[:5], [*ev.earlier, *ev.decisions])
    monkeypatch.setattr(source, "connect", lambda ref, timeout: fake2)
    rc, out, _ = run(["diagnose", "snic-imbalance", "--window", "1s", "--interval", "250ms"],
                     capsys)
    assert "still slow" not in out and "storage NIC still at 25% of expected" in out
    assert fake2.calls.count("decisions") == 5


def test_recheck_from_a_recording_that_covers_the_change(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = record(_recorded_change(), tmp_path / "w.jsonl.gz")
    rc, out, _ = run(["diagnose", "snic-imbalance", "--from", str(path)], capsys)
    assert rc == 2  # the link is still at 25% (rule snic-link), whatever the reads did
    assert ("CRITICAL snic-imbalance  node D3 storage NIC still slow; reads to D3 down from 50% "
            "to 0% since alpha 100K -> 50K (set by api, seen in the samples +5 s into the "
            "window)") in out


def test_a_recording_keeps_the_audit_log_and_its_recheck_names_the_audit_entry(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """`dualpath record` keeps the audit entries in reach of its window (not one made long
    before it, nor one after it) and alpha's seconds per token from the status; diagnose
    --from then names the change as the live path does, in the config's units."""
    from dualpath_cli.telemetry.view import AuditEntry

    ev = _recorded_change()  # alpha halved between samples 4 and 5 (T0+4, T0+5)
    fake = FakeClient([s.view for s in ev.samples], ev.decisions)
    change = AuditEntry(17, T0 + 4.55, "tok-1", "scheduler", {"alpha_tokens": ALPHA},
                        {"alpha_tokens": ALPHA // 2})
    fake.audit.extend([AuditEntry(16, T0 - 600, "launch", "faults", {}, {}), change,
                       AuditEntry(18, T0 + 30, "tok-1", "compact", {}, {})])
    served = fake.status

    def status() -> object:  # the API's thresholds carry alpha in seconds (1s: ALPHA // 2)
        st = served()
        return dataclasses.replace(st, thresholds=dataclasses.replace(st.thresholds,
                                                                      alpha_s=1.0))
    monkeypatch.setattr(fake, "status", status)
    monkeypatch.setattr(source, "connect", lambda ref, timeout: fake)
    path = tmp_path / "change.jsonl.gz"
    rc, out, _ = run(["record", "--window", "2250ms", "--interval", "250ms", "-o", str(path),
                      "--json"], capsys)
    assert rc == 0 and json.loads(out)["audit"] == 1
    rec = read_recording(path)
    assert len(rec.samples) == 10 and rec.audit == (change,)
    assert rec.alpha_s_per_token == pytest.approx(2.0 / ALPHA)
    rc, out, _ = run(["diagnose", "snic-imbalance", "--from", str(path)], capsys)
    assert rc == 2
    assert ("CRITICAL snic-imbalance  node D3 storage NIC still slow; reads to D3 down from 50% "
            "to 0% since alpha 2s -> 1s (audit #17)") in out
    rc, out, _ = run(["diagnose", "snic-imbalance", "--from", str(path), "--json"], capsys)
    (f,) = [f for f in json.loads(out)["reports"][0]["findings"]
            if f["subject"] == "node D3" and "still slow" in f["title"]]
    assert f["evidence"]["audit_seq"] == 17 and f["evidence"]["change"]["by"] == "audit"
    assert (f["evidence"]["share_before"], f["evidence"]["share_after"]) == (0.5, 0.0)


@pytest.mark.parametrize("argv,message", [
    (["diagnose", "disk-full"], "unknown workflow 'disk-full'"),
    (["diagnose", "all", "--bogus"], "No such option: --bogus"),
    (["diagnose"], "Missing argument"),
    (["diagnose", "all", "--window", "soon"], "invalid"),
    (["diagnose", "all", "--interval", "100ms"], "too short"),
    (["diagnose", "all", "--from", "/nonexistent/rec.jsonl"], "no such recording"),
    (["diagnose", "hbm-frag", "--fix", "--from", "/nonexistent/rec.jsonl"],
     "--fix acts on a live cluster, not a recording"),
    (["diagnose", "scaling", "--fix"], "--fix applies to hbm-frag and long-tail"),
    (["diagnose", "all", "--url", "http://127.0.0.1:9"], "cannot reach the dualpath API"),
])
def test_no_verdict_is_exit_3_with_one_line(argv: list[str], message: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(argv, capsys)
    assert rc == 3, err
    assert message in " ".join(err.split()) and len(err.strip().splitlines()) == 1, err
    assert out == ""


def test_not_a_recording_is_exit_3(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "trace.jsonl"
    bad.write_text('{"format": "dualpath-trace", "version": 1, "max_len": 10}\n')
    rc, _, err = run(["diagnose", "all", "--from", str(bad)], capsys)
    assert rc == 3 and "a dualpath trace, not a recording" in err, err
    assert len(err.strip().splitlines()) == 1, err
    other = tmp_path / "notes.jsonl"
    other.write_text('{"hello": 1}\n')
    rc, _, err = run(["diagnose", "all", "--from", str(other)], capsys)
    assert rc == 3 and "not a dualpath recording" in err, err


def test_record_writes_samples_decisions_and_a_trace(monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    ev = slow_engine()
    fake = FakeClient(list(ev.views), ev.decisions)
    monkeypatch.setattr(source, "connect", lambda ref, timeout: fake)
    out_path = tmp_path / "incident.jsonl.gz"
    rc, out, _ = run(["record", "--window", "1s", "--interval", "250ms", "-o", str(out_path),
                      "--json"], capsys)
    assert rc == 0
    summary = json.loads(out)
    assert summary["samples"] == 5 and summary["decisions"] == len(ev.decisions)
    with gzip.open(out_path, "rt") as f:
        kinds = [json.loads(line)["kind"] for line in f]
    assert kinds[0] == "header" and kinds[-1] == "end" and "trace" in kinds
    rec = read_recording(out_path)
    assert rec.complete and len(rec.samples) == 5 and rec.samples[0].view == ev.views[0]
    trace = decode_lines((json.dumps(t) for t in rec.trace_lines), "rec")
    assert {t.agent_id for t in trace.trajectories} == {d.agent for d in ev.decisions}
    # the same verdict from the recording as from the live window
    rc, out, _ = run(["diagnose", "long-tail", "--from", str(out_path), "--json"], capsys)
    assert rc == 1 and "engine 5" in out
    assert not list(tmp_path.glob(".part-*"))


def test_record_refuses_zst_without_zstandard(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    try:
        import zstandard  # noqa: F401
    except ImportError:
        rc, _, err = run(["record", "--window", "1s", "-o", str(tmp_path / "x.jsonl.zst")],
                         capsys)
        assert rc == 2 and "needs the 'zstandard' module" in err
        assert not list(tmp_path.iterdir())
    else:  # pragma: no cover - where zstandard is installed the round trip must work
        fake = FakeClient(make_view(0))
        monkeypatch.setattr(source, "connect", lambda ref, timeout: fake)
        path = tmp_path / "x.jsonl.zst"
        assert run(["record", "--window", "1s", "-o", str(path)], capsys)[0] == 0
        assert len(read_recording(path).samples) == 2


def test_served_turns_as_a_trace_reproduce_every_prompt_length() -> None:
    from test_diagnose_rules import decision

    ds = [decision(1, turn=0, length=40, cached=0), decision(2, turn=1, length=55, cached=40),
          decision(3, turn=2, length=70, cached=56), decision(4, turn=2, length=70, cached=56)]
    ds = [dataclasses.replace(d, agent=7) for d in ds]
    trace = trace_from_decisions(ds)
    (traj,) = [t for t in trace.trajectories]
    prompts = []
    ctx = 0
    for turn in traj.turns:
        prompts.append(ctx + turn.append)
        ctx += turn.append + turn.gen
    assert prompts == [40, 55, 70]  # the requeued attempt counts once
    assert trace.header.max_len >= traj.total


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz", ".jsonl.zst"])
def test_every_recording_compression_gives_the_same_verdict(
        suffix: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = record(nic_throttled(), tmp_path / f"w{suffix}")
    rc, out, _ = run(["diagnose", "perf-drop", "--from", str(path), "--json"], capsys)
    assert rc == 2
    doc = json.loads(out)
    assert doc["samples"] == 10
    assert "node D3" in {f["subject"] for r in doc["reports"] for f in r["findings"]}


def test_fix_compacts_the_named_engine_and_judges_again(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """hbm-frag --fix: engine 4 compacted through the client (token checked), then a short
    window again; the exit code is the re-check's."""
    from test_diagnose_rules import hbm_fragmented

    ev = hbm_fragmented()
    fake = FakeClient(list(ev.views) * 3, ev.decisions)
    monkeypatch.setattr(source, "connect", lambda ref, timeout: fake)
    monkeypatch.setattr(source, "resolve", lambda ref=None: source.Target(
        "http://fake", "fake-token"))
    rc, out, err = run(["diagnose", "hbm-frag", "--fix", "--window", "1s", "--interval",
                        "250ms", "--json"], capsys)
    assert rc == 0, err
    doc = json.loads(out)
    (fix,) = doc["fixes"]
    assert fix["action"] == "compact" and fix["engine"] == 4 and fix["applied"]
    assert fix["old"]["hbm_fragmentation"] == pytest.approx(0.97)
    assert fix["new"]["hbm_fragmentation"] == 0.0
    assert doc["before"]["severity"] == "CRITICAL" and doc["severity"] == "OK"
    assert fake.calls.count("compact_hbm") == 1 and fake.audit[-1].action == "compact"


def test_fix_without_a_token_changes_nothing(monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    from test_diagnose_rules import hbm_fragmented

    ev = hbm_fragmented()
    fake = FakeClient(list(ev.views), ev.decisions)
    monkeypatch.setattr(source, "connect", lambda ref, timeout: fake)
    monkeypatch.setattr(source, "resolve", lambda ref=None: source.Target(
        "http://fake", None, None, "DUALPATH_TOKEN is not set"))
    rc, out, err = run(["diagnose", "hbm-frag", "--fix", "--window", "1s", "--interval",
                        "250ms"], capsys)
    assert rc == 3 and "needs its bearer token" in err and out == ""
    assert "compact_hbm" not in fake.calls


@pytest.mark.parametrize("argv,message", [
    (["diagnose", "all", "--url", "http://127.0.0.1:9"], "cannot reach the dualpath API"),
    (["diagnose", "bogus"], "unknown workflow"),
    (["diagnose", "all", "--window", "soon"], "invalid"),
    (["diagnose", "all", "--nope"], "No such option"),
])
def test_no_verdict_with_json_is_still_one_object_on_stdout(
        argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Story 4's cron line appends --json to a log: an UNKNOWN left nothing there."""
    rc, out, err = run([*argv, "--json"], capsys)
    assert rc == 3, err
    doc = json.loads(out)  # exactly one JSON document
    assert doc["severity"] == "UNKNOWN" and doc["exit_code"] == 3 and doc["reports"] == []
    assert message in doc["error"] and len(err.strip().splitlines()) == 1, err
