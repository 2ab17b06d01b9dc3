"""Request ids as people meet them: the integer id, the OpenAI body's id and a client's own
``x-request-id`` name one turn, in the fake client, the stories and a recording."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dualpath_cli.api.errors import Rejected
from dualpath_cli.api.fake import FakeClient
from dualpath_cli.api.render_bench import synthetic_view
from dualpath_cli.cli.app import app
from dualpath_cli.diagnose.explain import (
    RequestNotFound,
    explain_request,
    render_story,
    story_from_recording,
)
from dualpath_cli.services.recording import read_recording, write_recording
from dualpath_cli.telemetry.request_ids import (
    RequestAliases,
    body_id,
    parse_request_id,
    valid_alias,
)
from dualpath_cli.telemetry.stories import RequestStory
from dualpath_cli.telemetry.view import Decision


def _decision(rid: int = 7) -> Decision:
    return Decision(seq=rid, at=100.0, rid=rid, attempt=0, agent=1, turn=2, length=100,
                    cached=64, pe=0, de=1, de_group=1, side="pe", pe_tokens=64, de_tokens=0,
                    pe_read_q=0, de_read_q=5, pe_class="C1", de_class="normal",
                    inputs={"alpha": 10, "read_side": "dualpath",
                            "lookup": {"blocks": 8, "hit_blocks": 4, "misses": {}}})


def test_ids_parse_to_the_scheduler_id() -> None:
    chat, cmpl = body_id("chatcmpl", 42), body_id("cmpl", 3)
    assert chat.startswith("chatcmpl-42-") and chat != body_id("chatcmpl", 42)
    assert parse_request_id(chat) == 42 and parse_request_id(cmpl) == 3
    assert parse_request_id("42") == parse_request_id(42) == 42
    for other in ("agent-run-9", "chatcmpl-abc", "cmpl-", "-1", "", "٤٢", "4 2"):
        assert parse_request_id(other) is None, other
    assert parse_request_id(-1) is None
    assert valid_alias("trace-0af7651916cd43dd")
    for bad in (None, "", "123", "has space", "x" * 201, "naïve"):
        assert not valid_alias(bad), bad


def test_aliases_are_bounded_and_a_name_moves_to_its_newest_turn() -> None:
    names = RequestAliases(turns=2)
    names.add(1, ["client-a", None, ""])
    names.add(2, ["client-b"])
    assert names.resolve("client-a") == 1 and names.of(1) == ("client-a",)
    names.add(3, ["client-a"])  # sent again with another turn: it names the newer one
    assert names.resolve("client-a") == 3 and names.of(1) == ()
    assert names.resolve("client-b") == 2
    names.add(4, ["client-d"])  # two turns are kept: turn 2's names go
    assert names.resolve("client-b") is None and names.of(2) == ()
    assert names.resolve("client-a") == 3 and names.resolve("client-d") == 4
    assert names.resolve("5") == 5 and names.resolve("chatcmpl-9-ab") == 9
    assert names.resolve("never-seen") is None


def test_the_fake_finds_a_story_by_any_of_its_ids() -> None:
    fake = FakeClient(synthetic_view(1, 2, 1, layers=1), [_decision()])
    fake.outcomes[7] = {}
    chat = body_id("chatcmpl", 7)
    fake.aliases.add(7, [chat, "my-trace-1"])
    by_int = fake.request(7)
    assert by_int.aliases == (chat, "my-trace-1")
    assert fake.request(chat) == by_int == fake.request("my-trace-1") == fake.request("7")
    assert fake.requests("finished").stories == (by_int,)
    with pytest.raises(Rejected, match="unknown id") as err:
        fake.request("not-a-turn")
    assert err.value.status == 404 and "\n" not in str(err.value)
    with pytest.raises(Rejected, match="no decision kept"):
        fake.request(8)


def test_a_story_carries_its_aliases_through_a_recording(tmp_path: Path) -> None:
    story = explain_request(7, [_decision()], aliases=("cmpl-7-ab12", "my-trace-1"))
    assert RequestStory.from_dict(story).to_dict() == story
    assert "  also known as: cmpl-7-ab12, my-trace-1" in render_story(
        RequestStory.from_dict(story))
    rec_path = tmp_path / "rec.jsonl"
    write_recording(rec_path, {"source": "test", "interval_s": 1.0}, [], [_decision()],
                    stories=[story])
    rec = read_recording(rec_path)
    for name in (7, "7", "cmpl-7-ab12", "my-trace-1"):
        assert story_from_recording(rec, name).to_dict() == story
    with pytest.raises(RequestNotFound, match="unknown id"):
        story_from_recording(rec, "other-trace")
    runner = CliRunner()
    got = runner.invoke(app, ["explain", "my-trace-1", "--from", str(rec_path), "--json"])
    assert got.exit_code == 0, got.output
    assert json.loads(got.stdout) == story
    bad = runner.invoke(app, ["explain", "other-trace", "--from", str(rec_path)])
    assert bad.exit_code == 2 and len(bad.output.strip().splitlines()) == 1
