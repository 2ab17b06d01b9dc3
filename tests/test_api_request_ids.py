"""Request ids end to end: the official ``openai`` client against a real uvicorn server on
loopback reads the scheduler's id in ``x-request-id``, and ``dualpath explain`` tells the
same story by that id, the body's ``chatcmpl-``/``cmpl-`` id and the client's own id."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from fastapi import FastAPI
from openai.types.chat import ChatCompletionMessageParam
from openai_server import Served, serve_new, tiny_opts
from typer.testing import CliRunner

from dualpath_cli.api import openai_routes
from dualpath_cli.api.server import ServerThread
from dualpath_cli.cli.app import app

pytestmark = pytest.mark.e2e  # an API server on loopback

MODEL = "tiny"


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    with serve_new(tiny_opts()) as s:
        yield s


def _client(s: Served) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{s.url}/v1", api_key="unused-on-loopback")


def _explain(s: Served, request_id: str) -> dict[str, Any]:
    got = CliRunner().invoke(app, ["explain", request_id, "--url", s.url, "--json"])
    assert got.exit_code == 0, got.output
    story: dict[str, Any] = json.loads(got.stdout)
    return story


def test_chat_answer_names_its_turn_by_every_id(served: Served) -> None:
    client = _client(served)
    msgs: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": "Which turn is this? Tell the operator."}]
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=msgs, max_tokens=4,
        extra_headers={"x-request-id": "agent-run-17/turn-1"})
    rid = raw.headers["x-request-id"]
    assert rid.isdigit()
    reply = raw.parse()
    assert reply.id.startswith(f"chatcmpl-{rid}-")
    by_int = _explain(served, rid)
    assert by_int["rid"] == int(rid) and by_int["state"] == "finished"
    assert by_int["aliases"] == [reply.id, "agent-run-17/turn-1"]
    assert _explain(served, reply.id) == by_int
    assert _explain(served, "agent-run-17/turn-1") == by_int
    text = CliRunner().invoke(app, ["explain", reply.id, "--url", served.url])
    assert text.exit_code == 0 and f"request {rid} " in text.stdout
    assert "also known as: " in text.stdout


def test_completions_and_streams_carry_the_scheduler_id(served: Served) -> None:
    client = _client(served)
    raw = client.completions.with_raw_response.create(model=MODEL, prompt="count: 1 2 3",
                                                      max_tokens=3)
    plain = raw.parse()
    assert plain.id.startswith(f"cmpl-{raw.headers['x-request-id']}-")
    ids = set()
    for _ in range(2):  # two turns: two ids, each the body's
        with client.completions.with_streaming_response.create(
                model=MODEL, prompt="stream: 1 2 3", max_tokens=3, stream=True) as resp:
            rid = resp.headers["x-request-id"]
            events = [line for line in resp.iter_lines() if line.startswith("data: {")]
        assert all(json.loads(e[6:])["id"].startswith(f"cmpl-{rid}-") for e in events)
        ids.add(int(rid))
    with client.chat.completions.with_streaming_response.create(
            model=MODEL, max_tokens=3, stream=True,
            messages=[{"role": "user", "content": "stream a reply"}],
            extra_headers={"x-request-id": "stream-trace-1"}) as resp:
        rid = resp.headers["x-request-id"]
        list(resp.iter_lines())
    ids.add(int(rid))
    assert len(ids) == 3 and int(raw.headers["x-request-id"]) not in ids
    assert _explain(served, "stream-trace-1")["rid"] == int(rid)


def test_an_unknown_id_is_one_line(served: Served) -> None:
    resp = httpx.get(f"{served.url}/api/v1/requests/no-such-trace")
    assert resp.status_code == 404 and "unknown id" in resp.json()["detail"]
    assert "\n" not in resp.json()["detail"]
    got = CliRunner().invoke(app, ["explain", "no-such-trace", "--url", served.url])
    assert got.exit_code == 2 and len(got.output.strip().splitlines()) == 1


def test_an_error_after_admission_names_the_turn(served: Served) -> None:
    """A turn that outlives the router's timeout is a 504 that carries its id."""
    impatient = FastAPI()
    impatient.include_router(openai_routes.router(served.live, turn_timeout=1e-3))
    body = {"model": MODEL, "prompt": "a turn that outlives its timeout", "max_tokens": 16}
    with ServerThread(impatient) as server:
        for stream in (False, True):
            resp = httpx.post(f"{server.url}/v1/completions", json=body | {"stream": stream},
                              headers={"x-request-id": f"late-{stream}"}, timeout=60)
            assert resp.status_code == 504, resp.text
            assert resp.json()["error"]["code"] == "timeout"
            assert resp.headers["x-request-id"].isdigit()
            assert (served.live.aliases.resolve(f"late-{stream}")
                    == int(resp.headers["x-request-id"]))
    resp = httpx.post(f"{served.url}/v1/completions", json=body | {"model": "other"})
    assert resp.status_code == 404  # never admitted: a correlation id, not a scheduler's
    assert resp.headers["x-request-id"].startswith("req-")


def test_other_answers_carry_a_correlation_id(served: Served) -> None:
    """Not a turn: the client's own id comes back, else a generated one (never digits)."""
    mine = httpx.get(f"{served.url}/api/v1/status", headers={"x-request-id": "ops-check-1"})
    assert mine.headers["x-request-id"] == "ops-check-1"
    made = [httpx.get(f"{served.url}/v1/models").headers["x-request-id"] for _ in range(2)]
    assert made[0] != made[1] and all(m.startswith("req-") for m in made)
    refused = httpx.post(f"{served.url}/v1/completions", json={"model": "other", "prompt": "x"},
                         headers={"x-request-id": "12"})  # digits are the scheduler's
    assert refused.status_code == 404 and refused.headers["x-request-id"].startswith("req-")
