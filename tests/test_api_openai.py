"""OpenAI-compatible serving, end to end: the official ``openai`` client against a real
uvicorn server on loopback over a live 1P2D cluster (engine processes, PosixStore)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
from conftest import wait_until
from openai.types.chat import ChatCompletionMessageParam
from openai_server import Served, serve, serve_processes, tiny_opts

from dualpath_cli.api.openai_schema import ChatMessage, render_chat
from dualpath_cli.cluster.system import RuntimeSystem
from dualpath_cli.core.tokenizer import ByteTokenizer
from dualpath_cli.runtime.turns import TurnRequest
from dualpath_cli.services.live import LiveCluster

pytestmark = pytest.mark.e2e  # an API server over engine processes

BT = 8  # tiny_opts' block_tokens
MODEL = "tiny"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with serve_processes(tmp_path_factory.mktemp("store")) as s:
        yield s


def _client(s: Served, **kw: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{s.url}/v1", api_key="unused-on-loopback", **kw)


def _in_process(prompts: list[list[int]], gens: list[int]) -> list[list[int]]:
    """The same prompts as one agent's turns, run in-process through RuntimeSystem."""
    with RuntimeSystem(tiny_opts()) as system:
        return [system.submit(TurnRequest(0, i, np.asarray(p), g)).wait(60).tokens
                for i, (p, g) in enumerate(zip(prompts, gens, strict=True))]


def _layer_hits(live: LiveCluster) -> int:
    """Layer blocks the engines got from a cache tier (dram, store, peer), summed."""
    snap = live.system.metrics(fresh=True)
    return int(sum(row["value"] for e in snap.values()
                   for row in e["metrics"].get("dualpath_layer_cache_hits_total", [])))


def test_three_turn_chat_hits_the_cache_and_matches_in_process(served: Served) -> None:
    client = _client(served)
    hits0 = _layer_hits(served.live)
    messages: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": "You are agent 7 of a chat test; reply tersely."},
        {"role": "user", "content": "List the files in the repository and read README."}]
    prompts: list[list[int]] = []
    outputs: list[list[int]] = []
    cached: list[int] = []
    for turn in range(3):
        r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=6,
                                           temperature=0, user="chat-agent-7",
                                           extra_body={"return_token_ids": True})
        choice = r.choices[0]
        extra = choice.model_extra or {}
        assert r.usage is not None and r.usage.prompt_tokens_details is not None
        prompts.append(extra["prompt_token_ids"])
        outputs.append(extra["token_ids"])
        cached.append(r.usage.prompt_tokens_details.cached_tokens or 0)
        assert r.usage.completion_tokens == 6 and choice.finish_reason == "length"
        assert r.usage.prompt_tokens == len(prompts[-1])
        assert choice.message.content == ByteTokenizer().decode(outputs[-1])
        messages += [{"role": "assistant", "content": choice.message.content or ""},
                     {"role": "user", "content": f"Now run the tests, step {turn}."}]
    first = [ChatMessage.model_validate(m) for m in messages[:2]]
    assert prompts[0] == ByteTokenizer().encode(render_chat(first))
    assert cached[0] == 0
    for n in (1, 2):  # the template is append-only: turn n extends turn n-1's prompt
        assert prompts[n][:len(prompts[n - 1])] == prompts[n - 1]
        assert cached[n] >= len(prompts[n - 1]) // BT * BT > 0
    assert _layer_hits(served.live) > hits0  # the cache-hit metrics moved
    assert outputs == _in_process(prompts, [6, 6, 6])


def test_token_id_turns_of_a_session_extend_one_prefix_chain(served: Served) -> None:
    client = _client(served)
    rng = np.random.default_rng(3)
    context: list[int] = []
    prompts, outputs, cached = [], [], []
    for turn in range(3):
        prompt = context + rng.integers(0, 256, 40 if turn == 0 else 12).tolist()
        r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=5,
                                      extra_headers={"X-Session-Id": "ids-agent"},
                                      extra_body={"return_token_ids": True})
        ids = (r.choices[0].model_extra or {})["token_ids"]
        assert r.usage is not None and r.usage.prompt_tokens_details is not None
        prompts.append(prompt)
        outputs.append(ids)
        cached.append(r.usage.prompt_tokens_details.cached_tokens)
        context = prompt + ids
    assert cached[0] == 0
    for n in (1, 2):  # the whole previous prompt plus all but the last output token hit
        assert cached[n] == (len(prompts[n - 1]) + 5 - 1) // BT * BT
    assert outputs == _in_process(prompts, [5, 5, 5])


def test_streaming_chunks_concatenate_to_the_plain_text(served: Served) -> None:
    client = _client(served)
    prompt = "The quick brown fox jumps over the lazy dog; stream this."
    plain = client.completions.create(model=MODEL, prompt=prompt, max_tokens=7)
    chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=7,
                                            stream=True,
                                            stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == plain.choices[0].text and len(text) > 0
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 7
    assert usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == plain.usage.prompt_tokens // BT * BT  # type: ignore[union-attr]

    msgs: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": "Stream a chat reply, please."}]
    reply = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=5)
    stream = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=5,
                                            stream=True)
    deltas = [c.choices[0].delta for c in stream if c.choices]
    assert deltas[0].role == "assistant"
    assert "".join(d.content or "" for d in deltas) == reply.choices[0].message.content


def test_a_streamed_chat_arrives_in_several_chunks_equal_to_the_plain_answer(
        served: Served) -> None:
    """Tokens stream as the DE decodes them: content chunks before the end, joined equal to
    the unstreamed reply; ``include_usage`` ends with an empty-choices usage chunk."""
    client = _client(served)
    msgs: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": "Stream a longer chat reply, token by token."}]
    reply = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=48)
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=msgs, max_tokens=48, stream=True,
        stream_options={"include_usage": True}))
    content = [c for c in chunks if c.choices and c.choices[0].delta.content]
    finish = [i for i, c in enumerate(chunks) if c.choices and c.choices[0].finish_reason]
    assert len(content) >= 3, [c.choices[0].delta.content for c in content]
    assert finish and all(chunks.index(c) < finish[0] for c in content)
    assert "".join(c.choices[0].delta.content or "" for c in content) == \
        reply.choices[0].message.content
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 48


def _inflight(s: Served) -> int:
    r = httpx.get(f"{s.url}/api/v1/requests", params={"state": "inflight"}, timeout=10)
    r.raise_for_status()
    return int(r.json()["total"])


def _de_hbm_used(s: Served) -> int:
    """HBM blocks the DEs hold, from their heartbeats."""
    return sum(hb.hbm_used_blocks for eid, hb in s.live.system.scheduler.heartbeats().items()
               if hb is not None and s.live.system.scheduler.engines[eid].role == "decode")


def _cancelled(s: Served) -> float:
    text = httpx.get(f"{s.url}/metrics", timeout=10).text
    rows = [line for line in text.splitlines()
            if line.startswith("dualpath_scheduler_cancelled_turns_total")]
    return float(rows[0].split()[-1]) if rows else 0.0


def test_a_client_that_disconnects_mid_stream_cancels_its_turn(served: Served) -> None:
    """Closing the stream after its first content: the scheduler drops the turn (no turn
    in flight), its DE frees the turn's HBM, the cancellation is counted."""
    before = _cancelled(served)
    body = {"model": MODEL, "prompt": "Cancel me once a few tokens came back.",
            "max_tokens": 1000, "stream": True}
    with httpx.stream("POST", f"{served.url}/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        content = 0
        for line in r.iter_lines():  # (leaving the loop closes the connection)
            if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["text"]:
                content += 1
                if content >= 2:
                    assert _inflight(served) == 1  # still decoding as the client goes
                    break
    wait_until(lambda: _inflight(served) == 0, 30, "the cancelled turn to leave the flights")
    wait_until(lambda: _cancelled(served) == before + 1, 30, "the cancellation's count")
    wait_until(lambda: _de_hbm_used(served) == 0, 30, "the DE to free the turn's HBM")


def test_stream_is_server_sent_events_ending_with_done(served: Served) -> None:
    body = {"model": MODEL, "prompt": [1, 2, 3, 4, 5, 6, 7, 8, 9], "max_tokens": 3,
            "stream": True}
    with httpx.stream("POST", f"{served.url}/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    first = json.loads(events[0][6:])
    assert first["object"] == "text_completion" and first["choices"][0]["text"] == ""


def test_concurrent_requests_are_all_served(served: Served) -> None:
    """Eight clients at once (the waits run off the event loop); each gets its own turn."""
    client = _client(served)
    prompts = [[(7 * k + i) % 256 for i in range(24)] for k in range(8)]
    got: dict[int, list[int]] = {}

    def one(k: int) -> None:
        r = client.completions.create(model=MODEL, prompt=prompts[k], max_tokens=4,
                                      user=f"conc-{k}", extra_body={"return_token_ids": True})
        got[k] = (r.choices[0].model_extra or {})["token_ids"]

    threads = [threading.Thread(target=one, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(got) == list(range(8))
    with RuntimeSystem(tiny_opts()) as system:
        want = {k: system.submit(TurnRequest(k, 0, np.asarray(p), 4)).wait(60).tokens
                for k, p in enumerate(prompts)}
    assert got == want


@pytest.mark.parametrize(("kw", "status", "words"), [
    ({"temperature": 0.7}, 400, "temperature 0.7 is not supported"),
    ({"max_tokens": 100_000}, 400, "above this server's limit"),
    ({"prompt": ""}, 400, "prompt is empty"),
    ({"prompt": []}, 400, "prompt is empty"),
    ({"model": "gpt-4o"}, 404, "'gpt-4o' is not served"),
    ({"n": 2}, 400, "one choice per request"),
    ({"prompt": ["a", "b"]}, 400, "one prompt per request"),
    ({"prompt": [1, 2, 999]}, 400, "token id 999 is outside the vocabulary"),
    ({"stop": ["\n"]}, 400, "stop sequences are not supported"),
])
def test_bad_requests_get_a_4xx_with_the_reason(served: Served, kw: dict[str, Any],
                                                status: int, words: str) -> None:
    client = _client(served, max_retries=0)
    args: dict[str, Any] = {"model": MODEL, "prompt": "hello", "max_tokens": 2} | kw
    with pytest.raises(openai.APIStatusError) as info:
        client.completions.create(**args)
    err = info.value
    assert err.status_code == status
    assert isinstance(err.body, dict) and words in err.body["message"]
    assert err.body["type"] == "invalid_request_error"


def test_bad_chat_and_malformed_bodies(served: Served) -> None:
    client = _client(served, max_retries=0)
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.chat.completions.create(model=MODEL, temperature=1.0,
                                       messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=[])
    r = httpx.post(f"{served.url}/v1/completions", content=b"{not json",
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and "error" in r.json()
    r = httpx.post(f"{served.url}/v1/completions",  # JSON allows a lone surrogate
                   content=b'{"model": "tiny", "prompt": "a\\udc80"}',
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and "not valid Unicode" in r.json()["error"]["message"]
    r = httpx.post(f"{served.url}/v1/completions", json={"model": MODEL, "prompt": "x",
                                                          "frobnicate": 1})
    assert r.status_code == 400 and "frobnicate" in r.json()["error"]["message"]


def test_models_lists_the_one_served_model(served: Served) -> None:
    client = _client(served)
    assert [m.id for m in client.models.list()] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        _client(served, max_retries=0).models.retrieve("gpt-4o")


def test_a_draining_cluster_answers_503_with_retry_after(tmp_path: Path) -> None:
    live = LiveCluster(tiny_opts())
    live.start()
    try:
        with serve(live) as s:
            live.drain(timeout=5)
            r = httpx.post(f"{s.url}/v1/completions", json={"model": MODEL, "prompt": "x"})
            assert r.status_code == 503 and int(r.headers["retry-after"]) > 0
            assert r.json()["error"]["code"] == "draining"
            with pytest.raises(openai.InternalServerError) as info:
                _client(s, max_retries=0).completions.create(model=MODEL, prompt="x",
                                                              max_tokens=1)
            assert info.value.status_code == 503
    finally:
        live.close()
