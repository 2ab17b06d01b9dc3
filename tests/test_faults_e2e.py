"""Fault injection proves the diagnose workflows end to end: a real ``dualpath launch
--inject`` (engine processes over ZeroMQ), ``dualpath diagnose WORKFLOW --url ... --json`` as a
subprocess, the same verdicts from a recording, and exit 0 once the faults are cleared."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from conftest import CLI, recording, run_cli, wait_for_turns, wait_until

from dualpath_cli.api.client import DualPathClient
from dualpath_cli.api.listen import free_port
from dualpath_cli.services import statefile

if TYPE_CHECKING:
    from conftest import Launched

FAULTS = ["hbm_frag:engine=1,stride=4", "snic_throttle:node=1,fraction=0.25"]


def _launch(launch_cluster: Callable[..., Launched], tmp_path: Path, faults: list[str],
            *extra: str) -> tuple[str, int]:
    """A launched 1P2D with ``faults`` injected: its URL and port (stopped after the test)."""
    args = ["--store", str(tmp_path / "store"), *extra]
    for spec in faults:
        args += ["--inject", spec]
    url, port, line = launch_cluster(*args)
    assert "faults injected: " + " ".join(faults) in line
    return url, port


@pytest.fixture()
def faulted(launch_cluster: Callable[..., Launched], tmp_path: Path) -> tuple[str, int]:
    return _launch(launch_cluster, tmp_path, FAULTS)


#: The long-tail and cache-hit faults. ``basic`` reads every hit on the PE's node, so read
#: latency on node 0 is what its prefills wait on; the hot blocks are read by node 1.
TAIL_FAULTS = ["read_latency:node=0,latency=100ms", "slow_compute:engine=2,factor=8",
               "hot_blocks:node=1,count=2,rate=30"]


@pytest.fixture()
def tail_faulted(launch_cluster: Callable[..., Launched], tmp_path: Path) -> tuple[str, int]:
    return _launch(launch_cluster, tmp_path, TAIL_FAULTS, "--policy", "basic")


def _diagnose(env: dict[str, str], workflow: str, *source: str) -> tuple[int, dict[str, Any]]:
    done = run_cli(env, "diagnose", workflow, *source, "--json")
    assert done.stdout.strip(), done.stderr
    return done.returncode, json.loads(done.stdout)


def _subjects(report: dict[str, Any], workflow: str) -> set[str]:
    return {f["subject"] for r in report["reports"] if r["workflow"] == workflow
            for f in r["findings"] if f["severity"] in ("WARNING", "CRITICAL") and f["subject"]}


def test_injected_faults_are_found_live_and_from_a_recording_then_cleared(
        env: dict[str, str], faulted: tuple[str, int], tmp_path: Path) -> None:
    url, port = faulted
    with DualPathClient.from_token_file(url, statefile.token_path(port)) as client:
        st = client.status()
        assert [f.spec() for f in st.faults] == FAULTS
        assert st.audit[0].action == "faults" and st.audit[0].token_id == "launch"

        live = ("--url", url, "--window", "3s")
        code, out = _diagnose(env, "hbm-frag", *live)
        assert code in (1, 2) and "engine 1" in _subjects(out, "hbm-frag"), out
        code, out = _diagnose(env, "snic-imbalance", *live)
        assert code in (1, 2) and "node D1" in _subjects(out, "snic-imbalance"), out

        rec = tmp_path / "faulted.jsonl"
        done = run_cli(env, "record", "--url", url, "--window", "2s", "--interval", "500ms",
                       "-o", str(rec))
        assert done.returncode == 0, done.stderr
        for workflow, subject in (("hbm-frag", "engine 1"), ("snic-imbalance", "node D1")):
            code, out = _diagnose(env, workflow, "--from", str(rec))
            assert code in (1, 2) and subject in _subjects(out, workflow), (workflow, out)

        # --fix compacts engine 1's HBM (with the launch's token), reports it, re-checks
        code, out = _diagnose(env, "hbm-frag", *live, "--fix")
        assert code == 0 and not _subjects(out, "hbm-frag"), out
        (fix,) = out["fixes"]
        assert fix["action"] == "compact" and fix["engine"] == 1 and fix["applied"]
        assert fix["old"]["hbm_fragmentation"] >= 0.5 and fix["new"]["hbm_fragmentation"] == 0
        assert "engine 1" in _subjects(out["before"], "hbm-frag")
        assert client.status().audit[-1].action == "compact"

        client.clear_faults()
        assert client.status().faults == ()
        for workflow in ("hbm-frag", "snic-imbalance"):
            code, out = _diagnose(env, workflow, *live)
            assert code == 0 and not _subjects(out, workflow), (workflow, out)


def _subjects_all(report: dict[str, Any]) -> set[str]:
    return {s for r in report["reports"] for s in _subjects(report, r["workflow"])}


def test_tail_faults_are_found_live_and_from_a_recording(
        env: dict[str, str], tail_faulted: tuple[str, int], tmp_path: Path) -> None:
    """A slow engine, hot blocks and slow store reads on a served workload: long-tail names
    engine 2 and the node reading the hot blocks, cache-hit names the prefill node waiting
    for its KV."""
    url, port = tail_faulted
    work = subprocess.Popen([*CLI, "bench", "--url", url, "--agents", "6", "--turns", "12",
                             "--json"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    rec = tmp_path / "tail.jsonl.gz"
    try:  # once turns flow, record and diagnose the same seconds of the workload
        with DualPathClient(url, None) as client:
            wait_for_turns(client, 8, work)
        with recording(env, url, "5s", rec):
            live_code, live_out = _diagnose(env, "all", "--url", url, "--window", "5s")
    finally:
        _, err = work.communicate(timeout=300)
    assert work.returncode == 0, err
    hot = {k for r in live_out["reports"] for f in r["findings"]
           for k in (f["evidence"].get("hot_blocks") or {})}
    for code, out in ((live_code, live_out), _diagnose(env, "all", "--from", str(rec))):
        subjects = _subjects_all(out)
        titles = [f"{f['severity']} {f['title']}" for r in out["reports"] for f in r["findings"]]
        assert code in (1, 2), titles
        assert "engine 2" in _subjects(out, "long-tail"), titles
        # the hot blocks: one finding on the node that reads them (rule hot-block)
        assert "node D1" in _subjects(out, "long-tail"), titles
        assert "node P0" in _subjects(out, "cache-hit"), titles
        others = {s for r in out["reports"] if r["workflow"] != "long-tail"
                  for s in _subjects(out, r["workflow"])}
        assert "engine 1" not in subjects and "node D1" not in others, titles
    assert len(hot) >= 1 and all(len(k) == 32 for k in hot)
    # the trace in the recording replays the real turns: every turn generated what it asked
    from dualpath_cli.services.recording import read_recording

    recorded = read_recording(rec)
    gens = {(d.agent, d.turn): d.gen for d in recorded.decisions
            if getattr(d, "kind", "turn") == "turn"}
    traced = [t[1] for r in recorded.trace_lines[1:] for t in r["turns"]]
    assert gens and None not in gens.values() and max(traced) > 1
    assert sorted(traced) == sorted(gens.values())

    with DualPathClient.from_token_file(url, statefile.token_path(port)) as client:
        client.clear_faults()
        # the view's KV wait and service time are per 1 s window: wait (bounded) until the
        # windows that still held the workload's last faulted prefills have passed
        wait_until(lambda: all(e.kv_wait_s is None and e.service_time_s is None
                               for e in client.view().engines), 60, "the windows to empty",
                   pace=lambda: client.decisions(-1))  # a round trip paces the loop
    code, out = _diagnose(env, "all", "--url", url, "--window", "2s")
    assert not (_subjects(out, "long-tail") | _subjects(out, "cache-hit")), out


def _d1_finding(report: dict[str, Any]) -> dict[str, Any]:
    (f,) = [f for r in report["reports"] for f in r["findings"]
            if f["subject"] == "node D1" and "storage NIC still slow" in f["title"]]
    return f


def _judged_shares(f: dict[str, Any]) -> None:
    """Both sides of the change held enough reads; the title says which way they went."""
    e = f["evidence"]
    assert e["compared"] and e["reads_before"]["reads"] >= 10 and e["reads_after"]["reads"] >= 10
    before, after = e["share_before"], e["share_after"]
    assert 0 <= before <= 1 and 0 <= after <= 1
    assert ("down from" in f["title"]) == (round(after * 100) < round(before * 100)), f
    assert ("not down" in f["title"]) != ("down from" in f["title"]), f


def test_recheck_after_a_live_alpha_change_compares_reads_before_and_after(
        env: dict[str, str], launch_cluster: Callable[..., Launched], tmp_path: Path) -> None:
    """Story 2's re-check on a launched 1P2D with D1's storage NIC at 25%, turns flowing:
    after `tune set alpha=1s --yes` (audited) `diagnose snic-imbalance` says D1 is still slow
    and how its share of reads moved since the change, naming the audit entry; a recording
    that covers the change says the same from its decisions and the audit entries it kept."""
    url, _ = _launch(launch_cluster, tmp_path, ["snic_throttle:node=1,fraction=0.25"])
    work = subprocess.Popen([*CLI, "bench", "--url", url, "--agents", "6", "--turns", "60",
                             "--json"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    rec = tmp_path / "change.jsonl"
    try:
        with DualPathClient(url, None) as client:
            def decided(more: int) -> None:
                """Wait (bounded) until ``more`` turns more were placed."""
                wait_for_turns(client, client.view().scheduler.decisions.total + more, work)

            decided(30)
            with recording(env, url, "10s", rec, interval="500ms"):
                # the recorder samples once its file exists (it writes it as it goes)
                wait_until(rec.exists, 60, "the recorder to start",
                           pace=lambda: client.decisions(-1))
                decided(20)
                done = run_cli(env, "tune", "set", "alpha=1s", "--yes", "--url", url, "--json")
                assert done.returncode == 0, done.stderr
                seq = json.loads(done.stdout)["audit"]["seq"]
                decided(20)
            code, live = _diagnose(env, "snic-imbalance", "--url", url, "--window", "2s")
    finally:
        work.terminate()
        work.communicate(timeout=60)
    f = _d1_finding(live)
    assert code in (1, 2) and f["severity"] in ("WARNING", "CRITICAL"), f
    assert f"-> 1s (audit #{seq})" in f["title"] and f["evidence"]["audit_seq"] == seq, f
    _judged_shares(f)
    code, recorded = _diagnose(env, "snic-imbalance", "--from", str(rec))
    f = _d1_finding(recorded)
    assert code in (1, 2) and f"-> 1s (audit #{seq})" in f["title"], f
    assert f["evidence"]["change"]["by"] == "audit" and f["evidence"]["audit_seq"] == seq
    _judged_shares(f)


@pytest.mark.e2e
def test_a_bad_inject_spec_is_one_line_before_anything_starts(env: dict[str, str]) -> None:
    done = run_cli(env, "launch", "--port", str(free_port()), "--inject", "warp:node=1")
    assert done.returncode == 2
    lines = [ln for ln in (done.stdout + done.stderr).splitlines() if ln.strip()]
    assert len(lines) == 1 and "unknown fault kind 'warp'" in lines[0], lines

