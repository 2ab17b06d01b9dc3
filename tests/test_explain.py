"""``dualpath explain`` and GET /api/v1/requests/{id}: one request's story, live or recorded.

A real LiveCluster behind a real server: a round-robin turn that reads on the DE side, then
(after a PATCH of the read side) a split read; each story must name the side and the read
queues that chose it, exactly as the decision log has them.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from served_cluster import serve_with_token
from typer.testing import CliRunner

from dualpath_cli.api.client import DualPathClient
from dualpath_cli.api.errors import Rejected
from dualpath_cli.api.fake import FakeClient
from dualpath_cli.cli.app import app
from dualpath_cli.diagnose.explain import explain_request, render_story, side_reason
from dualpath_cli.runtime.options import RuntimeOptions
from dualpath_cli.services.live import LiveCluster
from dualpath_cli.services.recording import write_recording
from dualpath_cli.telemetry.gpu import UnavailableGpu
from dualpath_cli.telemetry.stories import InflightTurn, RequestStory
from dualpath_cli.telemetry.view import Decision

pytestmark = pytest.mark.e2e  # an API server over a live cluster

BT = 8


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[tuple[LiveCluster, DualPathClient, dict[str, Decision]]]:
    opts = RuntimeOptions(policy="round-robin", block_tokens=BT, heartbeat_timeout=30.0)
    with serve_with_token(opts, tmp_path_factory.mktemp("run") / "token",
                          UnavailableGpu("no GPU in this test")) as s, \
            DualPathClient(s.url, s.auth.token, timeout=30) as client:
        live = s.live
        prompt = [(i * 7) % 250 + 1 for i in range(41)]
        picked: dict[str, Decision] = {}
        for turn in range(3):
            if turn == 2:
                client.update_scheduler(read_side="split")
            ticket = live.submit(prompt, 3, "s1")
            result = ticket.wait(120)
            live.done(ticket)
            d = client.decisions()[-1]
            picked[{0: "none", 1: "de", 2: "split"}[turn]] = d
            prompt = prompt + list(result.tokens) + [(turn * 13 + i) % 250 + 1
                                                     for i in range(24)]
        yield live, client, picked


def test_de_side_read_names_the_side_and_its_queues(
        served: tuple[LiveCluster, DualPathClient, dict[str, Decision]]) -> None:
    _, client, picked = served
    d = picked["de"]
    assert d.side == "de" and d.cached > 0
    story = client.request(d.rid)
    assert story.read["side"] == "de"
    assert story.read["pe_read_q"] == d.pe_read_q
    assert story.read["de_read_q"] == d.de_read_q
    assert f"PE node {d.pe_read_q} tokens, DE node {d.de_read_q} tokens" in \
        story.read["why"]
    assert story.pe["engine"] == d.pe and story.pe["class"] == d.pe_class
    assert story.de["engine"] == d.de and story.de["class"] == d.de_class
    assert story.thresholds["alpha"] == d.inputs["alpha"]
    # the nodes under the names status and top give them (P0, D1 in a launch)
    names = {e.engine_id: e.node_name for e in served[0].view().engines}
    assert story.pe["node_name"] == names[d.pe] and story.de["node_name"] == names[d.de]
    assert names[d.pe].startswith("P") and names[d.de].startswith("D")
    # the outcome: the DE read every cached block, and streamed them to the PE
    hits = story.hits
    assert hits["de"]["store"] + hits["de"]["dram"] == d.cached // BT
    assert hits["pe"]["store"] is None and hits["peer_blocks"] == d.cached // BT
    assert story.nic_bytes["de_snic_read"] > 0 == story.nic_bytes["pe_snic_read"]
    assert story.nic_bytes["de_cnic_tx_to_pe"] > 0
    assert len(story.layer_slack_s) == 4  # the tiny model's layers
    split = story.ttft_split
    total = sum(split.values())
    assert all(v >= 0 for v in split.values())
    assert abs(total - story.ttft_s) <= 0.01 * story.ttft_s + 1e-3
    text = "\n".join(render_story(story))
    assert "read side: de" in text and "TTFT" in text


def test_split_read_names_both_parts(
        served: tuple[LiveCluster, DualPathClient, dict[str, Decision]]) -> None:
    _, client, picked = served
    d = picked["split"]
    assert d.side == "split" and d.pe_tokens > 0 and d.de_tokens > 0
    story = client.request(d.rid)
    rd = story.read
    assert (rd["side"], rd["pe_tokens"], rd["de_tokens"]) == ("split", d.pe_tokens,
                                                              d.de_tokens)
    assert f"PE node {d.pe_read_q} tokens, DE node {d.de_read_q} tokens" in rd["why"]
    assert story.thresholds["read_side"] == "split"
    assert story.thresholds["sources"]["read_side"] == "api"
    hits = story.hits
    assert hits["pe"]["store"] + hits["pe"]["dram"] == d.pe_tokens // BT
    assert hits["de"]["store"] + hits["de"]["dram"] == d.de_tokens // BT


def test_unknown_request_is_404_with_one_line(
        served: tuple[LiveCluster, DualPathClient, dict[str, Decision]]) -> None:
    _, client, _ = served
    with pytest.raises(Rejected, match="no decision kept"):
        client.request(10**6)
    resp = httpx.get(f"{client.url}/api/v1/requests/{10**6}")
    assert resp.status_code == 404 and "\n" not in resp.json()["detail"]


def test_explain_cli_live_and_from_a_recording(
        served: tuple[LiveCluster, DualPathClient, dict[str, Decision]], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    live, client, picked = served
    d = picked["de"]
    decisions = client.decisions()
    fake = FakeClient(live.view(), decisions)
    fake.outcomes[d.rid] = live.system.scheduler.request(d.rid)[1] or {}
    monkeypatch.setattr("dualpath_cli.cli.source.connect", lambda ref, timeout: fake)
    runner = CliRunner()
    got = runner.invoke(app, ["explain", str(d.rid), "--json"])
    assert got.exit_code == 0, got.output
    story = json.loads(got.stdout)
    assert story["read"]["side"] == "de" and story["hits"] is not None
    rec = tmp_path / "rec.jsonl"
    write_recording(rec, {"source": "test", "interval_s": 1.0}, [], decisions)
    got = runner.invoke(app, ["explain", str(d.rid), "--from", str(rec)])
    assert got.exit_code == 0, got.output
    assert "read side: de" in got.stdout
    assert f"PE node {d.pe_read_q} tokens, DE node {d.de_read_q} tokens" in got.stdout
    assert "outcome: not available" in got.stdout  # a recording holds decisions only
    names = {e.engine_id: e.node_name for e in live.view().engines}
    assert f"node {names[d.pe]}," in got.stdout and f"on node {names[d.de]} " in got.stdout
    bad = runner.invoke(app, ["explain", "999999", "--from", str(rec)])
    assert bad.exit_code == 2 and "no decision kept" in bad.output


def _decision(side: str, pe_q: int, de_q: int, policy: str = "dualpath") -> Decision:
    return Decision(seq=1, at=0.0, rid=7, attempt=0, agent=0, turn=1, length=100, cached=64,
                    pe=0, de=1, de_group=1, side=side, pe_tokens=64 if side == "pe" else 0,
                    de_tokens=64 if side == "de" else 0, pe_read_q=pe_q, de_read_q=de_q,
                    pe_class="C1", de_class="normal", inputs={"read_side": policy})


def test_side_reason_follows_the_policy_rule() -> None:
    assert side_reason(_decision("de", 500, 0)).endswith("the DE node's queue is shorter")
    assert side_reason(_decision("pe", 0, 0)).endswith("a tie goes to the PE side")
    assert side_reason(_decision("pe", 0, 9)).endswith("the PE node's queue is shorter")
    story = explain_request(7, [_decision("de", 500, 0)])
    assert story["hits"] is None and story["read"]["de_read_q"] == 0


def test_inflight_endpoint_shows_a_turn_while_it_runs(
        served: tuple[LiveCluster, DualPathClient, dict[str, Decision]]) -> None:
    """A long turn is listed with its phase, PE, DE, read side, KV bytes and TTFT while it
    runs; its story says what is known so far; once done it leaves the list and its story
    is the whole one."""
    import time

    live, client, _ = served
    prompt = [(i * 11) % 250 + 1 for i in range(41)]
    first = live.submit(prompt, 2, "inflight")  # stores the prefix the next turn reads
    first.wait(120)
    live.done(first)
    agent = client.decisions()[-1].agent  # the session's agent: its decision is the newest
    ticket = live.submit(prompt + [7] * 16, 120, "inflight")
    seen: dict[str, InflightTurn] = {}
    row: InflightTurn | None = None
    deadline = time.monotonic() + 120
    while row is None or row.phase != "decode":
        assert time.monotonic() < deadline, f"never seen decoding; phases seen {list(seen)}"
        assert not ticket.event.is_set(), f"finished before seen decoding ({list(seen)})"
        listing = client.requests("inflight", 10)
        rows = [r for r in listing.turns if r.agent == agent]
        row = rows[0] if rows else None
        if row is not None:
            seen[str(row.phase)] = row
    assert listing.total is not None and listing.total >= 1
    d = next(x for x in reversed(client.decisions()) if x.rid == row.rid)
    kvb = 4 * live.system.shape.bytes_per_token_layer  # the tiny model's 4 layers
    assert (row.pe, row.de, row.side) == (d.pe, d.de, d.side)
    assert (row.pe_tokens, row.de_tokens) == (d.pe_tokens, d.de_tokens)
    assert row.cached_tokens == d.cached > 0 and row.decision_seq == d.seq
    assert row.bytes_read == row.bytes_to_read == d.cached * kvb
    assert row.ttft_s > 0 and row.waited_s is None and row.pe_class == d.pe_class
    for early in ("queued", "routed", "placed"):
        if early in seen:  # nothing read before dispatch, no first token either
            assert seen[early].bytes_read == 0 and seen[early].ttft_s is None
    story = client.request(row.rid)
    assert story.state == "in flight: decode" and story.progress.rid == row.rid
    assert story.read["side"] == d.side and story.ttft_s == pytest.approx(row.ttft_s)
    assert story.nic_bytes["de_snic_read"] is None  # the DE reports when the turn ends
    assert len(story.layer_slack_s) == 4 and sum(story.ttft_split.values()) == \
        pytest.approx(story.ttft_s, rel=0.01, abs=1e-3)
    assert "in flight: first token out, decoding" in "\n".join(render_story(story))
    ticket.wait(120)
    live.done(ticket)
    assert row.rid not in {r.rid for r in client.requests("inflight").turns}
    done = client.request(row.rid)
    assert done.state == "finished" and done.progress is None
    assert done.ttft_s == pytest.approx(row.ttft_s) and done.tpot_s > 0
    finished = client.requests("finished", 1000).stories
    assert finished[-1].rid == row.rid and finished[-1] == done
    # a cursor pages forward in finish order
    before = finished[-2].rid
    assert [s.rid for s in client.requests("finished", 5, after=before).stories] == \
        [row.rid]


@pytest.mark.parametrize("query", ["state=bogus", "limit=0", "limit=1001", "after=-1",
                                   "limit=x", "state="])
def test_requests_listing_refuses_bad_parameters_in_one_line(
        served: tuple[LiveCluster, DualPathClient, dict[str, Decision]], query: str) -> None:
    _, client, _ = served
    resp = httpx.get(f"{client.url}/api/v1/requests?{query}")
    assert resp.status_code == 422
    detail = resp.json()["detail"]
    assert "\n" not in detail and query.split("=")[0] in detail


def test_record_then_explain_from_the_recording_tells_the_same_story(
        served: tuple[LiveCluster, DualPathClient, dict[str, Decision]],
        tmp_path: Path) -> None:
    """``dualpath record`` while turns run keeps the finished requests' stories and the
    in-flight list; ``explain --from`` then tells each story as the live cluster does."""
    import threading

    from dualpath_cli.services.recording import read_recording

    live, client, _ = served
    stop = threading.Event()
    errors: list[BaseException] = []

    def workload() -> None:
        prompt = [(i * 5) % 250 + 1 for i in range(33)]
        try:  # turns until the recording ends (it must see some in flight), 48 at most
            for turn in range(48):
                if stop.is_set():
                    return
                ticket = live.submit(prompt, 4, "recorded")
                result = ticket.wait(120)
                live.done(ticket)
                prompt = prompt + list(result.tokens) + [turn + 1] * 16
        except BaseException as err:  # reported by the test
            errors.append(err)

    rec = tmp_path / "rec.jsonl.gz"
    worker = threading.Thread(target=workload)
    worker.start()
    try:
        got = CliRunner().invoke(app, ["record", "--url", client.url, "--window", "3s",
                                       "--interval", "250ms", "-o", str(rec), "--json"])
    finally:
        stop.set()
        worker.join(240)
    assert not errors and got.exit_code == 0, got.output
    counts = json.loads(got.stdout)
    recording = read_recording(rec)
    assert recording.complete and counts["outcomes"] == len(recording.stories) > 0
    assert any(s.inflight and s.inflight["requests"] for s in recording.samples)
    assert all(s.inflight is not None for s in recording.samples)
    decided = {d.rid for d in recording.decisions}
    both = sorted(set(recording.stories) & decided)
    assert both, "no request both decided and finished inside the window"
    for rid in both:
        got = CliRunner().invoke(app, ["explain", str(rid), "--from", str(rec), "--json"])
        assert got.exit_code == 0, got.output
        recorded = json.loads(got.stdout)
        assert recorded == client.request(rid).to_dict()  # the whole story, outcome included
        assert recorded["state"] == "finished" and recorded["ttft_split"] is not None
    got = CliRunner().invoke(app, ["explain", str(both[-1]), "--from", str(rec)])
    assert "TTFT" in got.stdout and "outcome: not available" not in got.stdout


def test_top_requests_screen_shows_a_running_turn_of_a_launched_cluster(
        served: tuple[LiveCluster, DualPathClient, dict[str, Decision]]) -> None:
    """The cockpit on the live API: the running turn is listed, and its story is the API's."""
    import asyncio
    import time

    from textual.widgets import Static

    from dualpath_cli.faultspec import parse_fault
    from dualpath_cli.tui.app import TopApp
    from dualpath_cli.tui.source import LiveSource

    live, client, _ = served
    prompt = [(i * 13) % 250 + 1 for i in range(41)]
    warm = live.submit(prompt, 2, "top")
    warm.wait(120)
    live.done(warm)
    # the decode engines compute 20x slower while the cockpit looks: on a fast host 120
    # tokens took less than the cockpit's first frames, and the turn was gone before it
    # could be listed decoding
    live.set_faults([parse_fault(f"slow_compute:engine={e.engine_id},factor=20")
                     for e in live.view().engines if e.role == "decode"], "test")
    ticket = live.submit(prompt + [9] * 16, 120, "top")
    source = LiveSource(lambda: DualPathClient(client.url, timeout=30), client.url,
                        with_metrics=False)
    app = TopApp(source, interval_s=0.5, start="requests")

    async def until(cond: Any, what: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            await pilot.pause(0.05)

    async def go() -> None:
        nonlocal pilot
        async with app.run_test(size=(120, 40)) as pilot:
            def decoding() -> bool:
                frame = app.frame
                rows = frame.inflight.turns if frame and frame.inflight else ()
                return any(r.phase == "decode" for r in rows)
            await until(decoding, "the turn decoding in the listing")
            detail = app.screen.query_one("#detail", Static)
            await until(lambda: "in flight: decode" in str(detail.content), "its story")
            text = str(detail.content)
            assert "TTFT" in text and "placed by decision #" in text and "read side:" in text

    pilot: Any = None
    try:
        asyncio.run(go())
    finally:
        live.clear_faults("test")
        ticket.wait(120)
        live.done(ticket)


def test_the_story_prints_z_to_two_places() -> None:
    """The walk printed 'Z 906.1500000000001' (the float's repr)."""
    d = dataclasses.replace(_decision("pe", 0, 0), z=906.1500000000001)
    line = next(s for s in render_story(RequestStory.from_dict(explain_request(7, [d])))
                if s.startswith("  DE "))
    assert "Z 906.15;" in line
