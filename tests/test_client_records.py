"""The typed records at the client seam give back the server's JSON byte for byte.

The API's answers are built as dicts (the public contract); the client reads them into
records (telemetry/stories.py, telemetry/warmup.py, telemetry/status.py, faultspec.Fault)
and the recorder and ``--json`` write them back with ``to_dict``: nothing may change.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from dualpath_cli.diagnose.explain import explain_request, inflight_row, partial_outcome
from dualpath_cli.faultspec import Fault, parse_fault
from dualpath_cli.services.warm import TemplatePlan, WarmPlan, live_progress
from dualpath_cli.telemetry.status import status_from_dict
from dualpath_cli.telemetry.stories import InflightTurn, RequestListing, RequestStory
from dualpath_cli.telemetry.view import Decision
from dualpath_cli.telemetry.warmup import WarmUp

OUTCOME = {"submitted": 10.0, "dispatched": 10.1, "first_at": 10.4, "done_at": 10.9,
           "tokens_out": 6, "rx_from_pe": 0, "pe": {
               "arrived": 10.1, "kv_ready": 10.2, "compute": 10.2, "kv_bubble_s": 0.0,
               "slack_s": [0.01, 0.02], "pe_store_blocks": 3, "pe_snic_bytes": 300},
           "de": {"de_store_blocks": 0, "de_snic_bytes": 0}}
RAW = {"rid": 7, "agent": 1, "turn": 2, "attempt": 0, "phase": "decode", "submitted": 10.0,
       "first_at": 10.4, "dispatched": 10.1, "pe": 0, "de": 1, "de_group": 1, "cached": 64,
       "pe_tokens": 64, "prompt_tokens": 100, "gen": 8,
       "lookup": {"blocks": 8, "hit_blocks": 4, "misses": {"evicted": 2}},
       "pe_facts": OUTCOME["pe"]}


def _decision() -> Decision:
    return Decision(seq=3, at=100.0, rid=7, attempt=0, agent=1, turn=2, length=100, cached=64,
                    pe=0, de=1, de_group=1, side="pe", pe_tokens=64, de_tokens=0,
                    pe_read_q=0, de_read_q=5, pe_class="C1", de_class="normal",
                    inputs={"alpha": 10, "read_side": "dualpath",
                            "lookup": {"blocks": 8, "hit_blocks": 4, "misses": {}}})


def _same_json(record: Any, data: Any) -> None:
    assert json.dumps(record.to_dict()) == json.dumps(data)


def test_stories_and_rows_round_trip() -> None:
    row = inflight_row(RAW, _decision(), 11.0, 200.0, 1024)
    _same_json(InflightTurn.from_dict(row), row)
    finished = explain_request(7, [_decision()], OUTCOME)
    running = explain_request(7, [_decision()], partial_outcome(RAW), progress=row)
    pending = explain_request(7, [], progress=row)
    for story in (finished, running, pending):
        record = RequestStory.from_dict(story)
        _same_json(record, story)
        assert record.rid == 7
    assert RequestStory.from_dict(running).progress == InflightTurn.from_dict(row)
    assert RequestStory.from_dict(finished).layer_slack_s == (0.01, 0.02)
    newer = {**finished, "new_key": {"x": 1}}  # a newer server's key is kept, after the rest
    _same_json(RequestStory.from_dict(newer), newer)


def test_listings_round_trip_in_both_states() -> None:
    row = inflight_row(RAW, _decision(), 11.0, 200.0, 1024)
    inflight = {"state": "inflight", "at": 200.0, "total": 3, "requests": [row]}
    finished = {"state": "finished", "at": 200.0,
                "requests": [explain_request(7, [_decision()], OUTCOME)]}
    for data in (inflight, finished):
        _same_json(RequestListing.from_dict(data), data)
    assert RequestListing.from_dict(inflight).turns[0].rid == 7
    assert RequestListing.from_dict(finished).stories[0].state == "finished"
    recorded = {k: v for k, v in inflight.items() if k != "state"}  # a recording's form
    assert RequestListing.from_dict(recorded).turns == RequestListing.from_dict(inflight).turns


def test_warm_answers_round_trip() -> None:
    plan = WarmPlan([TemplatePlan("sys", 48, 3, 3, 0)], [], 4096, notes=["a note"])
    summary = {"plan": plan.to_dict(), "rate_bps": 1e8, "rate": "100 MB/s", "role": "all",
               "engines": [0, 1], "started": 123.5}
    metrics = {0: {"metrics": {"dualpath_storage_warm_bytes_total": [{"value": 8192.0}],
                               "dualpath_storage_warm_blocks_remaining": [{"value": 1.0}]}}}
    progress = live_progress(metrics, [0, 1])
    for answer in ({"seq": 4, **summary}, {**summary, "progress": progress},
                   {"progress": progress}):
        _same_json(WarmUp.from_dict(answer), answer)
    got = WarmUp.from_dict({**summary, "progress": progress})
    assert got.plan is not None and got.plan.blocks == 0 and got.plan.notes == ("a note",)
    assert got.progress is not None and got.progress.blocks_remaining == 1
    assert not got.progress.done


@pytest.mark.parametrize("spec", [
    "snic_throttle:node=1,fraction=0.25", "read_latency:node=0,latency=5ms",
    "read_errors:node=2,rate=0.1", "hot_blocks:node=1,count=3,rate=7",
    "hbm_frag:engine=3,stride=4", "slow_compute:engine=1,factor=2.5",
    "fabric_drop:engine=2"])
def test_faults_round_trip(spec: str) -> None:
    fault = parse_fault(spec)
    assert Fault.from_dict(fault.to_dict()) == fault
    _same_json(Fault.from_dict(fault.to_dict()), fault.to_dict())


def test_status_keeps_faults_of_a_kind_it_does_not_know_in_extra() -> None:
    known = parse_fault("hbm_frag:engine=1,stride=4").to_dict()
    future = {"spec": "gremlin:node=1", "kind": "gremlin", "node": 1}
    data = {"state": "ready", "pd": "1P1D", "model": "tiny", "policy": "dualpath",
            "engines": {"healthy": 2, "total": 2}, "thresholds": {
                "alpha_tokens": 1, "beta_tokens": 2, "quota_s": 0.3, "read_side": "dualpath",
                "z_factor": 1.05},
            "faults": [known, future]}
    st = status_from_dict(data)
    assert [f.spec() for f in st.faults] == ["hbm_frag:engine=1,stride=4"]
    assert st.extra["faults"] == [future]
