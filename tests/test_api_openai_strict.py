"""The OpenAI routes refuse what OpenAI refuses, in OpenAI's shape (issue 34 item 5).

``max_tokens: "5"`` and ``true``, ``stream: "yes"`` and a user message with ``content:
null`` were coerced or accepted. Now no type is coerced and every schema violation is a 400
``{"error": {"message", "type": "invalid_request_error", "param", "code"}}``. Validation
runs before a handler, so a stand-in cluster serves these (no engines).
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from dualpath_cli.api.app import create_app
from dualpath_cli.api.auth import TokenAuth
from dualpath_cli.api.server import ServerThread
from dualpath_cli.telemetry.gpu import FakeGpuBackend

pytestmark = pytest.mark.e2e  # a real uvicorn server on loopback

USER = {"role": "user", "content": "hi"}


class _Live:
    opts = SimpleNamespace(model="tiny", api_rate_limit=5000.0)

    def readiness(self) -> tuple[bool, str]:
        return True, ""

    def phase(self) -> str:
        return "running"

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"a handler ran: live.{name}")


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    app = create_app(_Live(), TokenAuth("t" * 43), gpu=FakeGpuBackend())  # type: ignore[arg-type]
    with ServerThread(app) as s:
        yield s


def _post(s: ServerThread, path: str, body: bytes) -> tuple[int, Any]:
    c = http.client.HTTPConnection(s.host, s.port, timeout=30)
    try:
        c.request("POST", path, body=body, headers={"content-type": "application/json"})
        res = c.getresponse()
        return res.status, json.loads(res.read())
    finally:
        c.close()


CASES = [
    ("/v1/completions", {"prompt": "hi", "max_tokens": "5"}, "max_tokens", "invalid_type",
     "expected an integer, but got a string"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": True}, "max_tokens", "invalid_type",
     "expected an integer, but got a boolean"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 2.0}, "max_tokens", "invalid_type",
     "expected an integer, but got a number"),
    ("/v1/completions", {"prompt": "hi", "stream": "yes"}, "stream", "invalid_type",
     "expected a boolean, but got a string"),
    ("/v1/completions", {"prompt": "hi", "stream": 1}, "stream", "invalid_type",
     "expected a boolean"),
    ("/v1/completions", {"prompt": "hi", "temperature": "0"}, "temperature", "invalid_type",
     "expected a number, but got a string"),
    ("/v1/completions", {"prompt": 5}, "prompt", "invalid_type", "Invalid type for 'prompt'"),
    ("/v1/completions", {"prompt": "hi", "frobnicate": 1}, "frobnicate", "unknown_parameter",
     "Unrecognized request argument supplied: frobnicate"),
    ("/v1/completions", {"prompt": "hi", "temperature": 0.7}, "temperature", "invalid_value",
     "temperature 0.7 is not supported"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": None}]},
     "messages[0].content", "invalid_value", "a user message needs content"),
    ("/v1/chat/completions", {"messages": [{"role": "user"}]},
     "messages[0].content", "invalid_value", "a user message needs content"),
    ("/v1/chat/completions", {"messages": [USER, {"role": "system", "content": None}]},
     "messages[1].content", "invalid_value", "a system message needs content"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]},
     "messages[0].content", "invalid_type", "expected a string or an array"),
    ("/v1/chat/completions", {"messages": [USER], "stream": "yes"}, "stream", "invalid_type",
     "expected a boolean"),
    ("/v1/chat/completions", {"messages": [USER], "max_completion_tokens": "5"},
     "max_completion_tokens", "invalid_type", "expected an integer"),
    ("/v1/chat/completions", {"messages": [USER], "stream_options": {"include_usage": "yes"}},
     "stream_options.include_usage", "invalid_type", "expected a boolean"),
]


@pytest.mark.parametrize("path,body,param,code,words", CASES,
                         ids=[f"{c[0].split('/')[-1]}-{c[2]}-{c[3]}" for c in CASES])
def test_a_bad_request_is_400_in_openai_shape(server: ServerThread, path: str,
                                              body: dict[str, Any], param: str, code: str,
                                              words: str) -> None:
    status, answer = _post(server, path, json.dumps({"model": "tiny", **body}).encode())
    assert status == 400
    assert set(answer) == {"error"} and set(answer["error"]) == {"message", "type", "param",
                                                                  "code"}
    err = answer["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param
    assert err["code"] == code and words in err["message"], err


def test_a_body_that_is_not_json_is_400(server: ServerThread) -> None:
    status, answer = _post(server, "/v1/completions", b"{not json")
    assert status == 400 and answer["error"]["type"] == "invalid_request_error"
    assert "could not parse the JSON body" in answer["error"]["message"]


def test_an_assistant_message_may_have_null_content() -> None:
    from dualpath_cli.api.openai_schema import ChatCompletionRequest

    req = ChatCompletionRequest.model_validate(
        {"model": "tiny", "messages": [USER, {"role": "assistant", "content": None}, USER]})
    assert req.messages[1].text() == ""


def test_the_official_client_gets_bad_request_errors(server: ServerThread) -> None:
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="tiny", prompt="hi", max_tokens="5")
    assert info.value.body["param"] == "max_tokens" and info.value.code == "invalid_type"
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny",
                                       messages=[{"role": "user", "content": None}])
    assert info.value.body["param"] == "messages[0].content"
