"""``dualpath top`` driven by Textual's pilot, against the shipped FakeClient and a recording.

The cluster is test_diagnose_rules' 2P4D (engine id = node id: P0 P1 D2 D3 D4 D5) with two
faults: D3's storage NIC saturated with its read queue far over alpha, and engine 4's HBM
fragmented. Each test drives the real app with keys and reads the rendered screen as text.
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
import re
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from test_diagnose_rules import ALPHA, BETA, decision, make_view

from dualpath_cli.api.errors import Rejected
from dualpath_cli.api.fake import FakeClient
from dualpath_cli.cli.app import main as dualpath_main
from dualpath_cli.cli.monitor_cmd import main as monitor_main
from dualpath_cli.cli.source import ClusterRef
from dualpath_cli.errors import UsageError
from dualpath_cli.services.recording import read_recording, write_recording
from dualpath_cli.telemetry.recording import Recording, Sample
from dualpath_cli.telemetry.view import ClusterView, Decision
from dualpath_cli.tui.app import TopApp
from dualpath_cli.tui.format import (
    GRADE_MARKS,
    engine_rows,
    graded_name,
    nic_quadrants,
    sparkline,
)
from dualpath_cli.tui.source import LiveSource, ReplaySource

Pilot = Any


def faulted_view(i: int) -> ClusterView:
    """Sample ``i``: D3's storage NIC saturated (read queue 350K > alpha), engine 4
    fragmented, engine 1 over beta, layer 2 loading late."""
    return make_view(i, util={2: 0.35, 3: 1.0, 4: 0.35, 5: 0.35}, read_q={3: 350_000},
                     frag={4: 0.97}, tokens={1: BETA + 1}, slack={2: -0.01},
                     layer_blocks=8)


KVB = 64 * 1024  # KV bytes per token (all layers) of the fake cluster


def pe_facts() -> dict[str, Any]:
    """What a PE reports with a first token: 12 of 14 hit blocks from the store."""
    return {"arrived": 999.6, "kv_ready": 999.7, "compute": 999.72, "kv_bubble_s": 0.01,
            "slack_s": [0.02, 0.01, -0.005], "pe_tokens": 900, "de_tokens": 0,
            "pe_dram_misses": {}, "pe_dram_blocks": 2, "pe_store_blocks": 12,
            "pe_snic_bytes": 12 * 64 * KVB}


def raw_flight(rid: int, phase: str, now: float = 1000.0) -> dict[str, Any]:
    """The scheduler's in-flight row of request ``rid`` in ``phase`` (its decision is
    test_diagnose_rules' ``decision(rid)``: PE 0, DE 2 + rid % 4)."""
    placed = phase in ("prefill", "decode")
    return {"rid": rid, "agent": rid % 7, "turn": 1, "attempt": 0, "submitted": now - 0.5,
            "phase": phase, "first_at": now - 0.1 if phase == "decode" else None,
            "prompt_tokens": 1000, "gen": 8, "cached": 900, "pe": 0 if placed else -1,
            "de": 2 + rid % 4 if placed else -1, "de_group": 2 + rid % 4 if placed else -1,
            "pe_tokens": 900 if placed else 0, "dispatched": now - 0.4 if placed else None,
            "pe_facts": pe_facts() if phase == "decode" else None,
            "lookup": {"prompt_tokens": 1000, "blocks": 15, "hit_blocks": 14,
                       "misses": {"never_stored": 1}, "evicted_age_s": None}}


def inflight_listing(flights: list[tuple[int, str]], decisions: list[Decision],
                     at: float) -> dict[str, Any]:
    """``GET /api/v1/requests?state=inflight``'s answer for ``flights`` (rid, phase), made
    by the service's own :func:`inflight_row`."""
    from dualpath_cli.diagnose.explain import inflight_row

    by_rid = {d.rid: d for d in decisions}
    rows = [inflight_row(raw_flight(rid, phase), by_rid.get(rid), 1000.0, at, KVB)
            for rid, phase in flights]
    return {"at": at, "total": len(rows), "requests": rows}


def outcome(rid: int) -> dict[str, Any]:
    """A finished request's timeline as the ledger keeps it."""
    return {"submitted": 999.5, "dispatched": 999.6, "first_at": 999.9, "done_at": 1000.3,
            "attempts": 1, "cached": 900, "pe_tokens": 900, "rx_from_pe": 4096,
            "tokens_out": 8, "pe": pe_facts(),
            "de": {"de_dram_blocks": 0, "de_store_blocks": 0, "de_snic_bytes": 0}}


def fake_client(n: int = 12, **kw: Any) -> FakeClient:
    decisions = [decision(s, de=2 + s % 4) for s in range(1, 20)]
    flights = [(17, "decode"), (18, "prefill"), (19, "prefill"), (25, "queued")]
    kw.setdefault("inflight", inflight_listing(flights, decisions, faulted_view(0).at)[
        "requests"])
    client = FakeClient([faulted_view(i) for i in range(n)], decisions, **kw)
    for rid in range(1, 17):
        client.outcomes[rid] = outcome(rid)
    return client


def screen_text(app: TopApp) -> str:
    """The screen as plain text, the way a person reads it."""
    width, height = app.size
    console = Console(width=width, height=height, file=io.StringIO(), force_terminal=True,
                      color_system=None, record=True, legacy_windows=False, safe_box=False)
    console.print(app.screen._compositor.render_update(
        full=True, screen_stack=app._background_screens))
    return console.export_text()


async def wait_for(pilot: Pilot, cond: Callable[[], bool], what: str,
                   timeout: float = 10.0) -> None:
    """Let the app run until ``cond()`` holds (a deadline, not a sleep)."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}:\n{screen_text(pilot.app)}")
        await pilot.pause(0.02)


async def wait_text(pilot: Pilot, text: str, timeout: float = 10.0) -> str:
    """Wait until ``text`` is on screen; returns the screen."""
    await wait_for(pilot, lambda: text in screen_text(pilot.app), repr(text), timeout)
    return screen_text(pilot.app)


def detail(app: TopApp) -> str:
    """The requests screen's detail pane, whole (it scrolls on screen)."""
    from textual.widgets import Static

    return str(app.screen.query_one("#detail", Static).content)


async def wait_detail(pilot: Pilot, text: str, timeout: float = 10.0) -> str:
    """Wait until the requests screen's detail holds ``text``; returns the detail."""
    await wait_for(pilot, lambda: text in detail(pilot.app), repr(text), timeout)
    return detail(pilot.app)


def run(app: TopApp, scenario: Callable[[Pilot], Awaitable[None]],
        size: tuple[int, int] = (110, 32)) -> None:
    """Run ``scenario`` against ``app`` after its first frame arrived."""
    async def go() -> None:
        async with app.run_test(size=size) as pilot:
            await wait_for(pilot, lambda: app.frames >= 1, "the first frame")
            await scenario(pilot)
    asyncio.run(go())


def live_app(client: FakeClient | None = None, token_id: str | None = "tok-fake",
             **kw: Any) -> tuple[TopApp, FakeClient]:
    client = client or fake_client()
    source = LiveSource(lambda: client, "http://fake", token_id)
    return TopApp(source, interval_s=kw.pop("interval_s", 60.0), **kw), client


def recording(tmp_path: Path, n: int = 20) -> Path:
    """``n`` samples a second; decision ``s`` at half a second each; at sample ``i``,
    requests 2i-1 (prefill), 2i (decode) and 2i+1 (queued) are in flight and the earlier
    ones have finished (their stories recorded)."""
    from dualpath_cli.diagnose.explain import explain_request

    path = tmp_path / "incident.jsonl"
    decisions = [decision(s, de=2 + s % 4) for s in range(1, 2 * n)]
    samples = [Sample(v.at, v, inflight=inflight_listing(
        [(2 * i - 1, "prefill"), (2 * i, "decode"), (2 * i + 1, "queued")][int(i == 0):],
        [d for d in decisions if d.at <= v.at], v.at))
        for i, v in ((i, faulted_view(i)) for i in range(n))]
    stories = [explain_request(rid, decisions, outcome(rid)) for rid in range(1, 2 * n - 3)]
    write_recording(path, {"source": "test", "interval_s": 1.0, "window_s": n - 1}, samples,
                    decisions, stories)
    return path


def replay_app(tmp_path: Path, **kw: Any) -> TopApp:
    path = recording(tmp_path)
    return TopApp(ReplaySource(read_recording(path), str(path)), **kw)


# --- the screens --------------------------------------------------------------------------------
def test_cluster_screen_marks_each_class_in_words() -> None:
    app, _ = live_app()

    async def scenario(pilot: Pilot) -> None:
        text = await wait_text(pilot, "long-rq")
        rows = {ln.split()[0]: ln for ln in text.splitlines()
                if ln.strip() and ln.split()[0].isdigit()}
        assert "long-rq" in rows["3"] and "350K" in rows["3"] and "D3" in rows["3"]
        assert "overloaded" in rows["1"]  # tokens over beta
        assert "short-rq" in rows["0"] and "0.97" in rows["4"]
        assert "short-rq 4 long-rq 1 overloaded 1 down 0" in text
        assert "3 CRITICAL 4 WARNING" in text and "alpha 100K beta 200K" in text
    run(app, scenario)


def test_cluster_screen_sorts_and_filters() -> None:
    app, _ = live_app()

    def ids() -> list[str]:
        return [ln.split()[0] for ln in screen_text(app).splitlines()
                if ln.strip() and ln.split()[0].isdigit() and len(ln.split()) > 5]

    async def scenario(pilot: Pilot) -> None:
        await wait_text(pilot, "long-rq")
        assert ids() == ["0", "1", "2", "3", "4", "5"]
        for _ in range(4):  # id -> node -> class -> tokens -> read queue
            await pilot.press("s")
        assert "sort read_q" in screen_text(app)
        await pilot.press("S")
        await wait_text(pilot, "sort read_q desc")
        assert ids()[0] == "3"  # the longest read queue first
        await pilot.press("slash")
        await pilot.press("D", "3")
        await wait_for(pilot, lambda: ids() == ["3"], "the filter to keep D3")
        assert "filter 'D3': 1 of 6" in screen_text(app)
        await pilot.press("enter", "escape")
        await wait_for(pilot, lambda: len(ids()) == 6, "the filter to clear")
        await pilot.click("#engines", offset=(8, 0))  # the "node" header
        await wait_text(pilot, "sort node")
    run(app, scenario)


def test_engine_rows_classify_with_core_and_filter_by_class() -> None:
    view = faulted_view(0)
    rows = engine_rows(view, "overloaded")
    assert [r.engine_id for r in rows] == [1]
    assert [r.engine_id for r in engine_rows(view, sort="read_q", reverse=True)][0] == 3
    th = view.scheduler.thresholds
    assert (th.alpha_tokens, th.beta_tokens) == (ALPHA, BETA)


def test_nic_screen_shows_quadrants_and_the_imbalance() -> None:
    app, _ = live_app()

    async def scenario(pilot: Pilot) -> None:
        await pilot.press("2")
        text = await wait_text(pilot, "DE storage NIC")
        for title in ("PE storage NIC", "PE compute NIC", "DE compute NIC"):
            assert title in text
        assert "Max/Avg 1.95" in text  # D3 at 100% against 35% on D2, D4, D5
        assert re.search(r"D3!!? +100%", text)  # marked: open findings cover it
    run(app, scenario)


def test_a_node_is_graded_by_its_worst_finding_or_fault() -> None:
    from dualpath_cli.diagnose import rules
    from dualpath_cli.diagnose.model import Evidence, Severity
    from dualpath_cli.faultspec import Fault
    from dualpath_cli.tui.format import node_grades

    view = make_view(0)
    assert node_grades((), (), view) == {}
    engine = next(e for e in view.engines if e.role == "decode")
    faults = (Fault("slow_compute", engine=engine.engine_id, factor=2.0, id=1, since=1.0),)
    assert node_grades((), faults, view) == {engine.node: Severity.WARNING}
    views = [faulted_view(i) for i in range(5)]
    reports = rules.run_all(Evidence([Sample(v.at, v) for v in views]))
    grades = node_grades(reports, (), views[-1])
    assert grades[3] in (Severity.WARNING, Severity.CRITICAL)  # D3's NIC runs hot
    qs = nic_quadrants([Sample(v.at, v) for v in views], grades)
    de = next(q for q in qs if q.title == "DE storage NIC")
    assert dict(zip([n[0] for n in de.nodes], de.grades, strict=True))["D3"] == grades[3]
    rows = {r.engine_id: r for r in engine_rows(views[-1], grades=grades)}
    assert rows[3].cells[1].startswith("D3!")
    # and coloured by that grade (issue 32: top never drew the node in a warning colour)
    assert rows[3].node_style == GRADE_MARKS[grades[3]][1]
    assert all(r.node_style == "" for r in rows.values()
               if views[-1].engines[r.engine_id].node not in grades)


def test_the_cluster_screen_draws_a_graded_node_in_its_colour(tmp_path: Path) -> None:
    """Replay: the node a finding grades is drawn in the grade's colour in the engines
    table (its mark beside the name says it without colour)."""
    from rich.style import Style

    from dualpath_cli.tui.widgets.engine_table import EngineTable

    app = replay_app(tmp_path)

    async def scenario(pilot: Pilot) -> None:
        await pilot.press("end")
        table = app.screen.query_one("#engines", EngineTable)
        await wait_for(pilot, lambda: any(r.node_style for r in table.rows), "a graded row")
        y = next(i for i, r in enumerate(table.rows) if r.node_style) + 1
        segments = list(table.render_line(y))
        node = next(s for s in segments if "!" in s.text)
        want = Style.parse(table.rows[y - 1].node_style)
        assert node.style is not None and node.style.color == want.color
        others = [s for s in segments if s.text.strip() and "!" not in s.text]
        assert others and all(s.style is None or s.style.color != want.color
                              for s in others)

    run(app, scenario)


def test_nic_quadrants_follow_the_window() -> None:
    views = [make_view(i, util={3: 0.1 * i}) for i in range(5)]
    qs = nic_quadrants([Sample(v.at, v) for v in views])
    de = next(q for q in qs if q.title == "DE storage NIC")
    first, last = de.mean[0], de.mean[-1]
    assert len(de.mean) == 5 and first is not None and last is not None and first < last
    assert sparkline([0.0, 0.5, 1.0], 3, ascii_only=True, top=1.0) == "_+@"
    assert sparkline([None, 1.0], 4) == "  " + " █"


def test_layers_screen_heat_map_and_late_layer() -> None:
    app, _ = live_app()

    async def scenario(pilot: Pilot) -> None:
        await pilot.press("3")
        text = await wait_text(pilot, "slack median")
        rows = {ln.split()[0]: ln for ln in text.splitlines()
                if ln.strip() and ln.split()[0].isdigit()}
        assert set(rows) >= {"0", "1", "2", "3"}
        assert "late" in rows["2"] and "-10.00 ms" in rows["2"]
        assert "late" not in rows["1"] and "%" in rows["1"]
    run(app, scenario)


def test_heat_map_styles_are_valid_colours() -> None:
    from rich.style import Style

    from dualpath_cli.tui.screens.cluster import CLASS_STYLES
    from dualpath_cli.tui.screens.layers import HEAT

    for style in [*(s for steps in HEAT.values() for s in steps), *CLASS_STYLES.values()]:
        Style.parse(style)  # a bad colour name raises here, not silently at render time


def test_requests_screen_lists_turns_in_flight_and_tells_their_story() -> None:
    app, client = live_app()

    async def scenario(pilot: Pilot) -> None:
        await pilot.press("4")
        text = await wait_text(pilot, "4 turns in flight")
        rows = {ln.split()[0]: ln for ln in text.splitlines() if ln.split()[:1] in (
            ["17"], ["18"], ["19"], ["25"])}
        assert set(rows) == {"17", "18", "19", "25"}
        # PE, DE, read side, KV bytes read of those to read, TTFT (so far)
        assert "decode" in rows["17"] and "56.2MiB/56.2MiB" in rows["17"]
        assert "400ms" in rows["17"]  # TTFT known: first token 0.4 s after arrival
        assert "prefill" in rows["18"] and "loading/56.2MiB" in rows["18"]
        assert ">500ms" in rows["18"]  # no first token yet: waited so far
        assert "queued" in rows["25"] and "0B/56.2MiB" in rows["25"]
        assert "C2" in rows["18"] and "normal" in rows["18"]
        # the oldest is highlighted: its story (explain's) and the decision that placed it
        text = await wait_detail(pilot, "request 17 (agent 3, turn 1): in flight: decode")
        assert "read side: pe" in text and "PE 0 (class C2" in text
        assert "decision #17" in text and '"de_engine"' in text
        await pilot.press("down")
        text = await wait_detail(pilot, "request 18 (agent 4, turn 1): in flight: prefill")
        assert "loading its KV and prefilling" in text and "KV read loading of 56.2MiB" in text
        assert "no first token yet after 500.0 ms" in text and "decision #18" in text
        await pilot.press("down", "down")
        text = await wait_detail(pilot, "request 25 (agent 4, turn 1): in flight: queued")
        assert "not placed yet" in text and "missed blocks: 1 never_stored" in text
        # the turn finishes: it leaves the list, its story is the whole one
        client.inflight = client.inflight[1:3]
        client.outcomes[17] = outcome(17)
        await pilot.press("up", "up")
        await wait_detail(pilot, "request 18 (agent 4")
        app.request_poll()
        await wait_text(pilot, "2 turns in flight")
        assert "request 18 (" in await wait_detail(pilot, "request 18 (")  # follows the rid
    run(app, scenario)
    assert "requests" in client.calls and "request" in client.calls


def test_requests_screen_lists_recent_decisions_on_l() -> None:
    app, _ = live_app()

    async def scenario(pilot: Pilot) -> None:
        await pilot.press("4")
        await wait_text(pilot, "turns in flight")
        await wait_detail(pilot, "request 17 (")
        await pilot.press("l")  # the selected request stays selected
        text = await wait_text(pilot, "recent decisions, newest first")
        assert text.index("\n 19 ") < text.index("\n 18 ") < text.index("\n 17 ")
        await pilot.press("up", "up")
        text = await wait_detail(pilot, "request 19 (agent 5, turn 1)")
        assert "decision #19" in text
        await pilot.press("down", "down")
        text = await wait_detail(pilot, "request 17 (agent 3, turn 1)")
        assert "decision #17" in text and '"de_engine"' in text and "read side PE" in text
        await pilot.press("down")  # request 16 finished: its whole story
        text = await wait_detail(pilot, "request 16 (agent 2, turn 1): finished")
        assert "TTFT 400.0 ms = queueing" in text and "load-ahead slack per layer" in text
        assert "blocks hit: PE side dram 2, store 12" in text
        await pilot.press("l")
        await wait_text(pilot, "turns in flight")
    run(app, scenario)


def test_requests_screen_without_an_inflight_listing_shows_decisions() -> None:
    client = fake_client()

    def older_server(*_: object, **__: object) -> None:
        raise Rejected("http://fake/api/v1/requests: HTTP 404: Not Found", 404)

    client.requests = older_server  # type: ignore[assignment, method-assign]
    app, _ = live_app(client)

    async def scenario(pilot: Pilot) -> None:
        await pilot.press("4")
        text = await wait_text(pilot, "serves no in-flight list")
        assert "decision #19" in (await wait_detail(pilot, "decision #19"))
        assert "recent decisions" in text
    run(app, scenario)


def test_requests_screen_replays_what_was_in_flight(tmp_path: Path) -> None:
    app = replay_app(tmp_path)

    async def scenario(pilot: Pilot) -> None:
        await pilot.press("4")
        text = await wait_text(pilot, "3 turns in flight")
        assert "request 37 (agent 2, turn 1): in flight: prefill" in (
            await wait_detail(pilot, "request 37 ("))
        await pilot.press("left", "left")  # two samples back: 33, 34, 35 were in flight
        text = await wait_detail(pilot, "request 33 (agent 5, turn 1): in flight: prefill")
        assert "decision #33" in text
        await pilot.press("l")  # the decisions up to the cursor, request 33 still selected
        await wait_text(pilot, "recent decisions, newest first")
        await pilot.press("down")  # request 32 had finished by then
        text = await wait_detail(pilot, "request 32 (agent 4, turn 1): finished")
        assert "TTFT 400.0 ms = queueing" in text  # the story the cluster served, recorded
    run(app, scenario)


def test_alerts_panel_shows_findings_with_action() -> None:
    app, _ = live_app()

    async def scenario(pilot: Pilot) -> None:
        await pilot.press("5")
        text = await wait_text(pilot, "snic-imbalance")
        assert "CRITICAL" in text and "do:" in text
        assert "engine 4" in text  # hbm-frag
        await pilot.press("o")
        await wait_text(pilot, "OK ")
    run(app, scenario)


def test_help_pause_interval_theme_and_quit() -> None:
    app, client = live_app(interval_s=0.25)

    async def scenario(pilot: Pilot) -> None:
        await pilot.press("question_mark")
        await wait_text(pilot, "dualpath top: keys")
        await pilot.press("escape")
        await wait_for(pilot, lambda: "dualpath top: keys" not in screen_text(app), "help")
        await pilot.press("p")
        assert app.paused
        await wait_text(pilot, "PAUSED")
        polls = client.calls.count("view")
        await pilot.pause(0.6)  # two intervals: a paused cockpit does not poll
        assert client.calls.count("view") == polls
        await pilot.press("p")
        await wait_for(pilot, lambda: client.calls.count("view") > polls, "a poll")
        await pilot.press("i")
        assert app.interval_s == 0.5
        theme = app.theme
        await pilot.press("d")
        assert app.theme != theme and app.theme in ("textual-light", "textual-dark")
        await pilot.press("q")
    run(app, scenario)
    assert app.return_code == 0


def test_cluster_going_away_is_a_banner_then_it_reconnects() -> None:
    client = fake_client()
    connects = []

    def connect() -> FakeClient:
        connects.append(1)
        return client
    app = TopApp(LiveSource(connect, "http://fake", "tok-fake"), interval_s=0.25)

    async def scenario(pilot: Pilot) -> None:
        await wait_text(pilot, "long-rq")
        client.unreachable = True
        text = await wait_text(pilot, "CLUSTER UNREACHABLE")
        assert "connection refused" in text and "long-rq" in text  # last data kept
        n = len(connects)
        client.unreachable = False
        await wait_for(pilot, lambda: "UNREACHABLE" not in screen_text(app), "reconnect")
        assert len(connects) > n  # a new client after the failure
    run(app, scenario)


def test_no_cluster_at_start_is_a_banner_not_a_crash() -> None:
    app, _ = live_app(fake_client(unreachable=True))

    async def scenario(pilot: Pilot) -> None:
        text = await wait_text(pilot, "CLUSTER UNREACHABLE")
        assert "no data yet" in text
        for key in "12345":
            await pilot.press(key)
        await pilot.press("t")
        await wait_text(pilot, "tune the running scheduler")
    run(app, scenario)


# --- tuning -------------------------------------------------------------------------------------
async def _tune_alpha(pilot: Pilot, value: str) -> None:
    await pilot.press("t")
    await wait_text(pilot, "tune the running scheduler")
    box = pilot.app.screen.query_one("#in-alpha")
    box.value = value
    await pilot.pause()


def test_tune_dialog_confirms_applies_and_audits() -> None:
    app, client = live_app()

    async def scenario(pilot: Pilot) -> None:
        await _tune_alpha(pilot, "50K")
        text = screen_text(app)
        assert "token tok-fake" in text and "no changes yet" in text
        assert "predicted effect" in text
        await pilot.press("enter")
        text = await wait_text(pilot, "apply alpha 100K -> 50K")
        assert "http://fake" in text and "tok-fake" in text
        await pilot.press("y")
        await wait_text(pilot, "#1 ")
        assert [a.new for a in client.audit] == [{"alpha": "50K"}]
        assert "tok-fake scheduler: alpha 100000 -> 50K" in screen_text(app)
        await _no_then_escape(pilot)
    run(app, scenario)


async def _no_then_escape(pilot: Pilot) -> None:
    box = pilot.app.screen.query_one("#in-beta")
    box.value = "300K"
    await pilot.press("enter")
    await wait_text(pilot, "apply beta 200K -> 300K")
    await pilot.press("n")
    await wait_text(pilot, "not applied")
    await pilot.press("escape")
    await wait_for(pilot, lambda: "tune the running" not in screen_text(pilot.app), "close")


def test_tune_refusals_are_one_line() -> None:
    app, client = live_app(fake_client(client_token="wrong"))

    async def scenario(pilot: Pilot) -> None:
        await _tune_alpha(pilot, "50K")
        await pilot.press("enter")
        await wait_text(pilot, "apply alpha")
        await pilot.press("y")
        text = await wait_text(pilot, "refused:")
        assert "HTTP 403" in text
    run(app, scenario)
    assert client.audit == []


def test_tune_without_token_or_on_a_recording_is_read_only(tmp_path: Path) -> None:
    app, client = live_app(token_id=None)

    async def scenario(pilot: Pilot) -> None:
        await _tune_alpha(pilot, "50K")
        assert "no token: read-only" in screen_text(app)
        await pilot.press("enter")
        await pilot.pause()
        assert "apply alpha" not in screen_text(app)
    run(app, scenario)
    assert client.audit == []
    rep = replay_app(tmp_path)

    async def scenario2(pilot: Pilot) -> None:
        await _tune_alpha(pilot, "50K")
        assert "a recording is read-only" in screen_text(rep)
    run(rep, scenario2)


def test_twin_prediction_is_shown_on_request() -> None:
    seen: list[dict[str, str]] = []

    def predict(view: ClusterView, decisions: Any, change: dict[str, str]) -> str:
        seen.append(change)
        assert len(decisions) == 19
        return f"TTFT p90 5.8 s -> 2.1 s for {change}"
    app, client = live_app(predictor=predict)

    async def scenario(pilot: Pilot) -> None:
        await _tune_alpha(pilot, "50K")
        await wait_text(pilot, "F2 asks the twin")
        await pilot.press("f2")
        await wait_text(pilot, "predicted effect: TTFT p90 5.8 s -> 2.1 s")
    run(app, scenario)
    assert seen == [{"alpha": "50K"}] and client.audit == []  # predicting changes nothing


def test_the_twin_service_predicts_from_the_window() -> None:
    from dualpath_cli.services.twin import cockpit_predictor

    predict = cockpit_predictor()  # what cli/top_cmd.py hands the cockpit
    view = dataclasses.replace(faulted_view(0), model="ds660b")  # a profile world: no
    text = predict(view, [decision(s, de=2 + s % 4) for s in range(1, 20)],  # measuring
                   {"alpha": "50K"})
    assert text.startswith("TTFT p90 ") and "turns replayed, profile world" in text


def test_twin_failure_is_one_line() -> None:
    def predict(view: ClusterView, decisions: Any, change: dict[str, str]) -> str:
        raise UsageError("no served turns to replay")
    app, _ = live_app(predictor=predict)

    async def scenario(pilot: Pilot) -> None:
        await _tune_alpha(pilot, "50K")
        await pilot.press("f2")
        await wait_text(pilot, "the twin cannot predict this: no served turns")
    run(app, scenario)


# --- replay ----------------------------------------------------------------------------------
def test_replay_scrubber_keys(tmp_path: Path) -> None:
    app = replay_app(tmp_path)
    rep = app.replay
    assert rep is not None

    async def scenario(pilot: Pilot) -> None:
        await wait_text(pilot, "20/20")
        await pilot.press("home")
        await wait_text(pilot, "1/20 x1 stopped")
        await pilot.press("right", "right")
        await wait_text(pilot, "3/20")
        await pilot.press("left")
        await wait_text(pilot, "2/20")
        await pilot.press("right_square_bracket")
        await wait_text(pilot, "4/20")
        await pilot.press("end")
        await wait_text(pilot, "20/20")
        await pilot.press("left_square_bracket")
        await wait_text(pilot, "18/20")
        await pilot.press("plus", "plus", "plus", "plus", "plus")
        await wait_text(pilot, "x32")
        await pilot.press("space")  # plays at 32x: 1 s samples every 0.05 s
        await wait_text(pilot, "20/20 x32 stopped", timeout=10)
        await pilot.press("minus")
        await wait_text(pilot, "x16")
        await pilot.press("4", "l")  # decisions up to the cursor's time only
        text = await wait_text(pilot, "recent decisions, newest first")
        seqs = [ln.split()[0] for ln in text.splitlines()[4:] if ln.split()[:1] != []]
        assert seqs[0] == "38" and "39" not in seqs  # 1..38 are at or before the cursor
    run(app, scenario)
    assert rep.index == rep.total - 1


def test_replay_source_steps_and_windows(tmp_path: Path) -> None:
    rec = read_recording(recording(tmp_path))
    src = ReplaySource(rec, "x")
    src.seek(0)
    first = src.poll()
    assert len(first.history) == 1 and first.replay is not None
    assert all(d.at <= first.view.at for d in first.decisions)  # type: ignore[union-attr]
    src.jump(0.5)
    assert src.index == 10
    assert src.step(100) == 19 and not src.playing
    with pytest.raises(Exception, match="read-only"):
        src.tune(alpha="1K")
    with pytest.raises(Exception, match="no samples"):
        ReplaySource(Recording({}, (), ()), "empty")


def _snic_title(reports: tuple[Any, ...], node: str = "node D3") -> str:
    """The title of the cockpit's storage-NIC finding on ``node``."""
    (title,) = {f.title for r in reports for f in r.findings
                if f.subject == node and "storage NIC" in f.title}
    return title


def test_live_findings_name_a_change_by_its_audit_entry(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The cockpit's rules get the audit log it polls (and alpha's seconds per token from
    the status), and its decisions from before the window as the reads before the change:
    the snic finding on a slow node is the re-check diagnose prints live."""
    from test_diagnose_rules import _after_tune_set

    from dualpath_cli.tui import source as tui_source

    monkeypatch.setattr(tui_source, "RULES_DUTY", 1e12)  # the rules on every poll
    ev = _after_tune_set(1)  # audit #17 3 s before the window; 10/25 reads to D3 before it
    client = FakeClient([s.view for s in ev.samples], [*ev.earlier, *ev.decisions])
    client.audit.extend(ev.audit or ())
    served = client.status

    def status() -> Any:  # the API's thresholds carry alpha in seconds (2s: ALPHA)
        st = served()
        return dataclasses.replace(st, thresholds=dataclasses.replace(st.thresholds,
                                                                      alpha_s=2.0))
    monkeypatch.setattr(client, "status", status)
    src = LiveSource(lambda: client, "http://fake", "tok-fake")
    for _ in ev.samples:
        frame = src.poll()
    assert frame.error is None and len(frame.history) == len(ev.samples)
    assert frame.audit == tuple(ev.audit or ())
    assert _snic_title(frame.reports) == ("node D3 storage NIC still slow; reads to D3 down "
                                          "from 40% to 4% since alpha 2s -> 1s (audit #17)")


def test_a_replayed_recording_names_its_audited_change_and_an_older_one_its_samples(
        tmp_path: Path) -> None:
    from test_diagnose_rules import T0, _recorded_change

    from dualpath_cli.telemetry.recording import RecordedAudit
    from dualpath_cli.telemetry.view import AuditEntry

    ev = _recorded_change()  # alpha halved between samples 4 and 5
    change = AuditEntry(17, T0 + 4.55, "tok-1", "scheduler", {"alpha_tokens": ALPHA},
                        {"alpha_tokens": ALPHA // 2})
    path = tmp_path / "audited.jsonl"
    write_recording(path, {"interval_s": 1.0}, ev.samples, ev.decisions, (),
                    RecordedAudit((change,), 2.0 / ALPHA))
    src = ReplaySource(read_recording(path), str(path))
    frame = src.poll()  # the last sample
    assert frame.audit == (change,)
    assert _snic_title(frame.reports) == ("node D3 storage NIC still slow; reads to D3 down "
                                          "from 50% to 0% since alpha 2s -> 1s (audit #17)")
    src.seek(3)  # before the change: not in the trail yet
    assert src.poll().audit == ()
    # a recording without the audit line reads the change off its samples, as before
    old = tmp_path / "old.jsonl"
    write_recording(old, {"interval_s": 1.0}, ev.samples, ev.decisions)
    frame = ReplaySource(read_recording(old), str(old)).poll()
    assert frame.audit == ()
    assert _snic_title(frame.reports).endswith(
        "since alpha 100K -> 50K (set by api, seen in the samples +5 s into the window)")


# --- terminal conditions ---------------------------------------------------------------------
@pytest.mark.parametrize("key", list("12345"))
def test_every_screen_degrades_at_80x24(key: str) -> None:
    app, _ = live_app()

    async def scenario(pilot: Pilot) -> None:
        await pilot.press(key)
        mode = {"1": "cluster", "2": "nic", "3": "layers", "4": "requests", "5": "alerts"}[key]
        # the screen's header and footer draw after the switch: wait for both (a deadline)
        await wait_for(pilot, lambda: screen_text(app).startswith(f"{mode}  2P4D ready")
                       and "12345 screens" in screen_text(app).splitlines()[-1],
                       f"the {mode} screen's header and footer")
        lines = screen_text(app).splitlines()
        assert len(lines) == 24 and all(len(ln) <= 80 for ln in lines)
        assert lines[0].startswith(f"{mode}  2P4D ready")
        assert "12345 screens" in lines[-1] and "q Quit" in lines[-1] and "t Tune" in lines[-1]
    run(app, scenario, size=(80, 24))


def test_ascii_mode_draws_only_ascii(tmp_path: Path) -> None:
    app = replay_app(tmp_path, ascii_only=True)

    async def scenario(pilot: Pilot) -> None:
        for key in "12345":
            await pilot.press(key)
            await pilot.pause()
            text = screen_text(app)
            bad = sorted({c for c in text if ord(c) > 127})
            assert not bad, (key, bad, text)
    run(app, scenario)


def test_no_color_is_honoured(monkeypatch: pytest.MonkeyPatch) -> None:
    import re

    monkeypatch.setenv("NO_COLOR", "1")
    app, _ = live_app()
    assert app.no_color

    async def scenario(pilot: Pilot) -> None:
        await wait_text(pilot, "long-rq")
        svg = app.export_screenshot()
        colours = set(re.findall(r"terminal-r\d+ \{ fill: #([0-9a-f]{6})", svg))
        colours |= set(re.findall(r'<rect fill="#([0-9a-f]{6})"', svg))  # the cells' text
        # and backgrounds (the SVG's window frame around them has colours of its own)
        assert colours
        hues = {c for c in colours if len({c[0:2], c[2:4], c[4:6]}) > 1}
        assert not hues, hues  # every colour on screen is a grey
    run(app, scenario)


# --- the commands ------------------------------------------------------------------------------
def test_top_needs_a_terminal_and_checks_arguments(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    rec = recording(tmp_path)
    assert dualpath_main(["top", "--from", str(rec)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs a terminal" in err[0]
    assert dualpath_main(["top", "--screen", "nics"]) == 2
    assert "did you mean 'nic'" in capsys.readouterr().err
    assert dualpath_main(["top", "--interval", "10ms"]) == 2
    assert monitor_main(["--tui", "--from", str(rec)]) == 2  # the monitor opens the cockpit
    assert "needs a terminal" in capsys.readouterr().err


def test_top_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dualpath_cli.cli import top_cmd
    from dualpath_cli.errors import UsageError

    with pytest.raises(UsageError, match="exclude"):
        top_cmd.make_source(ClusterRef("http://x"), tmp_path / "a.jsonl")
    with pytest.raises(UsageError, match="no such recording"):
        top_cmd.make_source(ClusterRef(), tmp_path / "missing.jsonl")
    client = fake_client()
    calls = []

    def connect(ref: ClusterRef) -> tuple[FakeClient, str, str | None]:
        calls.append(ref)
        return client, "http://fake", "tok-fake"
    monkeypatch.setattr(top_cmd, "connect", connect)
    src = top_cmd.make_source(ClusterRef(), None)
    assert src.poll().view is not None and src.token_id == "tok-fake"
    client.unreachable = True
    assert src.poll().error is not None
    client.unreachable = False
    assert src.poll().error is None and len(calls) == 2  # connected again
    app = top_cmd.build_app(src, 1.0, False, "light", "alerts")
    assert isinstance(app, TopApp)


def test_a_big_recording_replays_evenly_spaced(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from dualpath_cli.cli import top_cmd

    rec = recording(tmp_path)  # 20 samples
    monkeypatch.setattr(top_cmd, "MAX_SAMPLES", 5)
    src = top_cmd.make_source(ClusterRef(), rec)
    assert isinstance(src, ReplaySource)
    assert src.total < 20 and src.label.endswith("(every 4 samples)")
    frame = src.poll()  # the cursor starts on the last sample, always kept
    assert frame.view is not None and frame.view.at == faulted_view(19).at


def test_a_long_node_name_is_cut_never_its_grade_mark() -> None:
    """The engine table's node column is 4 wide: ``gpu-a!!`` would read ``gpu-`` (the
    CRITICAL mark lost); the name is cut instead."""
    from dualpath_cli.diagnose.model import Severity

    assert graded_name("gpu-a", Severity.CRITICAL, 4) == "g…!!"
    assert graded_name("D1", Severity.CRITICAL, 4) == "D1!!"
    assert graded_name("gpu-a", None, 4) == "gpu…"
    assert graded_name("gpu-a", Severity.WARNING) == "gpu-a!"  # no column: whole
