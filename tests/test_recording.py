"""Recordings: the compact sample form round-trips, old full-dict samples still read, and a
long recording can be read evenly strided (first and last always)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_diagnose_rules import decision, make_view

from dualpath_cli.services.recording import read_recording, write_recording
from dualpath_cli.telemetry.recording import (
    Extras,
    Sample,
    decode_view,
    encode_view,
    extras_from_metrics_text,
)
from dualpath_cli.telemetry.stories import InflightTurn, RequestListing


def test_compact_form_round_trips_and_the_full_dict_form_reads() -> None:
    view = make_view(3, frag={4: 0.5}, layer_blocks=8)
    assert decode_view(json.loads(json.dumps(encode_view(view)))) == view
    assert decode_view(json.loads(json.dumps(view.to_dict()))) == view
    # another writer's columns (one more, one fewer) still decode by name
    enc = json.loads(json.dumps(encode_view(view)))
    enc["engines"]["cols"].append("future_field")
    for row in enc["engines"]["rows"]:
        row.append(1)
    assert decode_view(enc).engines == view.engines


def test_the_membership_record_is_kept() -> None:
    """Issue 32: a recording keeps the membership record (diagnose's membership workflow
    and the operator's node names in replay read it); it was dropped from samples."""
    import dataclasses

    from dualpath_cli.telemetry.membership import Membership, NodeMember, RoleGap

    members = Membership("1P0D", "1P1D", (NodeMember("P0", 0, "prefill", "serving", 1, 1),
                                          NodeMember("D0", 1, "decode", "left", 1, 0)),
                         (RoleGap("decode", 1_000.0, "D0 left"),),
                         {"decode": {"left": 1}})
    view = dataclasses.replace(make_view(2), membership=members)
    assert decode_view(json.loads(json.dumps(encode_view(view)))).membership == members


def test_strided_read_keeps_first_and_last(tmp_path: Path) -> None:
    path = tmp_path / "long.jsonl"
    samples = [Sample(v.at, v) for v in (make_view(i) for i in range(100))]
    write_recording(path, {"interval_s": 1.0, "window_s": 99.0}, samples, [decision(1)])
    whole = read_recording(path)
    assert len(whole.samples) == 100 and whole.header["samples_in_file"] == 100
    part = read_recording(path, max_samples=10)
    ats = [s.at for s in part.samples]
    assert ats[0] == samples[0].at and ats[-1] == samples[-1].at
    assert 10 <= len(ats) <= 11 and ats == sorted(ats)
    assert part.header["samples_in_file"] == 100 and len(part.decisions) == 1
    by_engines = read_recording(path, max_engine_samples=60)  # 6 engines: ~10 samples
    assert 10 <= len(by_engines.samples) <= 11


def test_extras_from_a_prometheus_page() -> None:
    page = "\n".join([
        '# TYPE dualpath_ttft_seconds histogram',
        'dualpath_ttft_seconds_bucket{le="0.1"} 3.0',
        'dualpath_ttft_seconds_bucket{le="+Inf"} 5.0',
        'dualpath_ttft_seconds_count 5.0',
        'dualpath_ttft_seconds_sum 1.5',
        'dualpath_host_nic_errors_total{device="eth0",direction="rx"} 2.0',
        'dualpath_host_nic_errors_total{device="eth0",direction="tx"} 1.0',
        'dualpath_prefetch_accuracy_ratio{node="1"} 0.75',
        'dualpath_storage_prefetched_blocks_total{node="1"} 40.0',
        'dualpath_storage_cache_hit_ratio{node="0",tier="dram"} 0.5',
        'dualpath_storage_block_reads_total{block="7f3a"} 12.0',
    ])
    ex = extras_from_metrics_text(page)
    assert ex == Extras(ttft_buckets=((0.1, 3), (float("inf"), 5)), ttft_count=5,
                        ttft_sum=1.5, nic_errors=3, nic_drops=None,
                        prefetch_accuracy={1: 0.75}, block_reads={"7f3a": 12},
                        cache_hit_ratio={"0/dram": 0.5}, prefetched_blocks={1: 40})


def test_trace_replays_the_generated_counts_and_skips_control_decisions() -> None:
    """Turn 1's prompt is turn 0's prompt, its 5 generated tokens and 7 new ones."""
    import dataclasses

    from dualpath_cli.services.recording import trace_from_decisions

    d0 = dataclasses.replace(decision(1, turn=0, length=40), agent=3, gen=5)
    d1 = dataclasses.replace(decision(2, turn=1, length=52), agent=3, gen=9)
    retry = dataclasses.replace(d1, seq=3, attempt=1)  # a requeued attempt counts once
    trace = trace_from_decisions([d0, d1, retry])
    (traj,) = trace.trajectories
    assert [(t.append, t.gen) for t in traj.turns] == [(40, 5), (7, 9)]
    assert trace.header.generator["gen"] == "as generated"
    old = trace_from_decisions([dataclasses.replace(d0, gen=None)])
    assert [(t.append, t.gen) for t in old.trajectories[0].turns] == [(40, 1)]
    if "kind" in {f.name for f in dataclasses.fields(d0)}:  # control decisions are no turns
        ctl = dataclasses.replace(d0, seq=9, agent=-1, kind="control")
        assert len(trace_from_decisions([d0, ctl]).trajectories) == 1


def test_decision_lines_keep_the_decisions_own_kind(tmp_path: Path) -> None:
    import dataclasses

    d = dataclasses.replace(decision(1), gen=4)
    path = tmp_path / "r.jsonl"
    write_recording(path, {"interval_s": 1.0, "window_s": 0.0}, [Sample(1.0, make_view(0))],
                    [d])
    (back,) = read_recording(path).decisions
    assert back == d


def test_stories_and_inflight_round_trip_and_files_without_them_read(tmp_path: Path) -> None:
    from dualpath_cli.diagnose.explain import explain_request, story_from_recording

    d = decision(1)
    outcome = {"submitted": 10.0, "dispatched": 10.1, "first_at": 10.4, "done_at": 10.9,
               "tokens_out": 6, "rx_from_pe": 0, "pe": {
                   "arrived": 10.1, "kv_ready": 10.2, "compute": 10.2, "kv_bubble_s": 0.0,
                   "slack_s": [0.01], "pe_store_blocks": 3, "pe_snic_bytes": 300},
               "de": {"de_store_blocks": 0, "de_snic_bytes": 0}}
    story = explain_request(1, [d], outcome)
    listing = {"at": 1.0, "total": 1, "requests": [{"rid": 2, "phase": "queued"}]}
    path = tmp_path / "r.jsonl.gz"
    counts = write_recording(path, {"interval_s": 1.0, "window_s": 0.0},
                             [Sample(1.0, make_view(0), inflight=listing)], [d], [story])
    assert counts["outcomes"] == 1
    rec = read_recording(path)
    assert rec.stories == {1: story} and rec.samples[0].inflight == listing
    assert story_from_recording(rec, 1).to_dict() == story  # the whole story, as served
    # a recording from before outcomes (or of a request that had not finished): the
    # decision part only; a line of a kind this reader does not know is skipped
    old = tmp_path / "old.jsonl"
    write_recording(old, {"interval_s": 1.0, "window_s": 0.0}, [Sample(1.0, make_view(0))],
                    [d])
    text = old.read_text().splitlines()
    old.write_text("\n".join([*text[:-1], '{"kind":"future","x":1}', text[-1]]) + "\n")
    rec = read_recording(old)
    assert rec.stories == {} and rec.samples[0].inflight is None and rec.complete
    told = story_from_recording(rec, 1)
    assert told.hits is None and told.read is not None and told.read["side"] == d.side


def test_the_audit_line_round_trips_and_files_without_it_read_as_unknown(
        tmp_path: Path) -> None:
    """The audit entries in reach of the window and alpha's seconds per token come back as
    written; given as a call, it gets the first and the last sample's time after the
    samples; a file without the line (an older recorder) says ``None``, not ``()``."""
    from dualpath_cli.telemetry.recording import RecordedAudit
    from dualpath_cli.telemetry.view import AuditEntry

    entries = (AuditEntry(3, 0.5, "tok-1", "faults", {"faults": []}, {"faults": [{"n": 1}]}),
               AuditEntry(4, 2.5, "tok-1", "scheduler", {"alpha_tokens": 2000},
                          {"alpha_tokens": 1000}))
    samples = [Sample(v.at, v) for v in (make_view(i) for i in range(4))]
    path = tmp_path / "a.jsonl.gz"
    asked: list[tuple[float, float]] = []

    def audit(first: float, last: float) -> RecordedAudit:
        asked.append((first, last))
        return RecordedAudit(entries, 0.001)

    counts = write_recording(path, {"interval_s": 1.0, "window_s": 3.0}, iter(samples),
                             [decision(1)], (), audit)
    assert asked == [(samples[0].at, samples[-1].at)] and counts["audit"] == 2
    rec = read_recording(path)
    assert rec.audit == entries and rec.alpha_s_per_token == 0.001 and rec.complete
    assert len(rec.samples) == 4 and len(rec.decisions) == 1  # the rest as before
    # known, and nothing in reach: an empty log, still written
    empty = tmp_path / "e.jsonl"
    write_recording(empty, {}, samples, [], (), RecordedAudit(()))
    rec = read_recording(empty)
    assert rec.audit == () and rec.alpha_s_per_token is None
    # an older recording (no audit line), or a recorder that could not read the status
    for made in (None, lambda first, last: None):
        old = tmp_path / "old.jsonl"
        counts = write_recording(old, {}, samples, [], (), made)
        assert "audit" not in counts and '"kind":"audit"' not in old.read_text()
        rec = read_recording(old)
        assert rec.audit is None and rec.alpha_s_per_token is None and len(rec.samples) == 4


def _collect(client: object, more: dict[int, list[int]], monkeypatch: pytest.MonkeyPatch,
             keep: int) -> tuple[list[Sample], dict[int, dict[str, object]]]:
    """Three samples a second apart; before sample ``i`` the requests ``more[i]`` finish."""
    from dualpath_cli.services import recording

    monkeypatch.setattr(recording, "MAX_OUTCOMES", keep)
    monkeypatch.setattr(recording, "_PAGE", 3)
    now = [0.0]
    taken = [0]

    def sleep(seconds: float) -> None:
        now[0] += seconds
        taken[0] += 1
        for rid in more.get(taken[0], []):
            client.outcomes[rid] = {"submitted": 1.0}  # type: ignore[attr-defined]

    stories: dict[int, dict[str, object]] = {}
    samples = list(recording.collect(client, 2.0, 1.0, clock=lambda: now[0], sleep=sleep,
                                     decisions_out=[], stories_out=stories, inflight=True,
                                     with_metrics=False))
    return samples, stories


def test_collect_pages_the_finished_stories_and_keeps_the_newest(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from dualpath_cli.api.fake import FakeClient

    def client() -> FakeClient:
        fake = FakeClient(make_view(0), [decision(s) for s in range(1, 30)],
                          inflight=[{"rid": 29, "phase": "prefill"}])
        for rid in range(1, 6):
            fake.outcomes[rid] = {"submitted": 1.0}
        return fake

    more = {1: list(range(6, 13)), 2: list(range(13, 21))}
    samples, stories = _collect(client(), more, monkeypatch, keep=100)
    # the first sample takes the newest page; later ones page forward from the cursor
    assert list(stories) == list(range(3, 21))
    row = InflightTurn.from_dict({"rid": 29, "phase": "prefill"}).to_dict()  # as served
    assert all(s.inflight == {"at": make_view(0).at, "total": 1, "requests": [row]}
               for s in samples)
    _, stories = _collect(client(), more, monkeypatch, keep=8)
    assert list(stories) == list(range(13, 21))  # bounded: the newest kept


def test_collect_from_a_server_without_the_listing(monkeypatch: pytest.MonkeyPatch) -> None:
    from dualpath_cli.api.errors import Rejected
    from dualpath_cli.api.fake import FakeClient

    fake = FakeClient(make_view(0), [decision(1)])

    def old_server(*_: object, **__: object) -> dict[str, object]:
        raise Rejected("http://fake/api/v1/requests: HTTP 404: Not Found", 404)

    fake.requests = old_server  # type: ignore[method-assign]
    samples, stories = _collect(fake, {}, monkeypatch, keep=10)
    assert len(samples) == 3 and stories == {}
    assert all(s.inflight is None for s in samples)


def test_the_first_page_of_stories_keeps_only_turns_that_arrived_in_the_window() -> None:
    # the first call takes the newest page, which reaches back before the window: a turn
    # that arrived before the window start is not this window's evidence (an operator's
    # 20 s recording kept 97 stories, about 6 of them from inside the window)
    from dualpath_cli.services.recording import _more_stories

    stories = [{"rid": rid, "arrival": 10.0 * rid} for rid in range(1, 6)]

    class Pages:
        def requests(self, state: str = "inflight", limit: int = 100,
                     after: int | None = None) -> RequestListing:
            return RequestListing.from_dict({"state": "finished", "at": 0.0, "requests": [
                s for s in stories if after is None or s["rid"] > after]})

    out: dict[int, dict[str, object]] = {}
    cursor = _more_stories(Pages(), None, out, since=30.0)  # type: ignore[arg-type]
    assert list(out) == [3, 4, 5] and cursor == 5
    stories.append({"rid": 6, "arrival": 5.0})  # later calls page on, whatever the arrival
    assert _more_stories(Pages(), cursor, out) == 6  # type: ignore[arg-type]
    assert list(out) == [3, 4, 5, 6]
