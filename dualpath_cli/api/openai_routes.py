"""OpenAI-compatible serving: ``/v1/completions``, ``/v1/chat/completions``, ``/v1/models``.

Why a subset of OpenAI's API: every agent framework and the official ``openai`` client speak
it, so a launched cluster can be driven by them unchanged. What is served:

- One model, the cluster's reference model (its runtime name, e.g. ``tiny``); any other
  ``model`` is 404 ``model_not_found``.
- ``prompt`` as text, as token ids (``list[int]``), or a list holding one of those; text is
  mapped to ids by the reference model's byte tokenizer (one token per UTF-8 byte).
- ``messages`` rendered to text by the chat template below, then tokenized the same way.
- Greedy decoding only: ``temperature`` must be omitted or 0 (likewise ``top_p`` 1, ``n`` 1,
  no penalties, no ``stop``, no logprobs): anything else is a 422 that says so. ``seed`` is
  accepted and ignored (greedy output does not depend on it).
- ``max_tokens`` (chat also ``max_completion_tokens``): 1 to the router's limit (default
  1024, 16 when omitted); prompt plus output must fit the model's context. The runtime
  generates exactly ``max_tokens`` tokens (it does not stop at EOS), so ``finish_reason`` is
  always ``length``; special tokens are not part of the text.
- ``stream: true``: server-sent events in OpenAI's chunk format ending with ``data: [DONE]``.
  The runtime reports the first token's time and then the whole output, so a stream sends a
  first (empty) chunk when the first token exists, the text in one chunk when the turn is
  done, the finish chunk, and with ``stream_options.include_usage`` a usage chunk.
- ``usage`` with ``prompt_tokens_details.cached_tokens``: the prompt tokens whose KV came
  from the cache (this turn's cached prefix).
- Extension (as vLLM's): ``return_token_ids: true`` adds ``token_ids`` (generated ids) and
  ``prompt_token_ids`` to the choice, for clients that keep exact token chains (``dualpath
  bench --url``): decoding bytes to text is lossy (invalid UTF-8 becomes U+FFFD).

Sessions: the ``X-Session-Id`` header, else ``prompt_cache_key``, else ``user``, names a
session; one session is one agent of the cluster, so turn n+1 (whose prompt extends turn n's
prompt and output) hits turn n's blocks. Without a key each request is a new agent.

Idempotency: an ``Idempotency-Key`` header (1-200 printable ASCII characters) names the turn.
Sent again with the same request (a connection cut, a scheduler restarted after ``kill -9``),
it gets the turn already admitted under that key, still running or its kept answer, never a
second run; the same key with a different request is refused (422). See docs/multinode.md.

Chat template (append-only, so turn n+1's rendering extends turn n's prompt and reply)::

    <|{role}|>\\n{content}<|end|>\\n     for every message, then
    <|assistant|>\\n                    the generation prompt

The reply comes back as the assistant message's content; sending it back verbatim with the
next user message makes the next prompt start with this one and its reply.

Errors use OpenAI's JSON shape ``{"error": {"message", "type", "param", "code"}}``: 422 for
a request that does not fit the schema, 400 for one the model cannot serve (too long, token
id outside the vocabulary, ``max_tokens`` above the limit), 404 for an unknown model, 503
with ``Retry-After`` while the cluster drains (retryable; the official client retries it),
504 when a turn outlives the router's timeout.

Waiting never blocks the event loop: each request's submit and waits run on a worker of a
thread pool that hands results to the loop through futures.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator
from starlette.exceptions import HTTPException as StarletteHTTPException

from dualpath_cli.errors import DualPathError
from dualpath_cli.runtime.model import model_config
from dualpath_cli.runtime.model.tokenizer import ByteTokenizer
from dualpath_cli.runtime.turns import Ticket, TurnResult
from dualpath_cli.services.live import Draining, LiveCluster
from dualpath_cli.services.restart import KeyConflict, check_key

__all__ = ["router", "render_chat", "CompletionRequest", "ChatCompletionRequest",
           "OpenAIError", "DEFAULT_MAX_TOKENS", "MAX_TOKENS_LIMIT", "CHAT_GENERATION_PROMPT"]

DEFAULT_MAX_TOKENS = 16
"""``max_tokens`` when a request omits it (OpenAI's completions default)."""
MAX_TOKENS_LIMIT = 1024
"""The largest ``max_tokens`` a request may ask for (the router's default limit)."""
TURN_TIMEOUT_S = 600.0
"""A turn that has not finished after this long is answered 504."""
CHAT_GENERATION_PROMPT = "<|assistant|>\n"


# -- errors ------------------------------------------------------------------------------

class OpenAIError(Exception):
    """An error answered in OpenAI's JSON shape with an HTTP status."""

    def __init__(self, status: int, message: str, *, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = " ".join(message.split())
        self.type = type_
        self.param = param
        self.code = code
        self.headers = headers

    def response(self) -> JSONResponse:
        """The error as a response."""
        return JSONResponse({"error": {"message": self.message, "type": self.type,
                                       "param": self.param, "code": self.code}},
                            self.status, headers=self.headers)


def _draining(err: Draining) -> OpenAIError:
    return OpenAIError(503, str(err), type_="service_unavailable", code="draining",
                       headers={"Retry-After": str(err.retry_after_s)})


def _validation_error(err: RequestValidationError) -> OpenAIError:
    errors = list(err.errors())
    parts: list[str] = []
    param: str | None = None
    for e in errors[:3]:
        loc = ".".join(str(x) for x in e.get("loc", ()) if x != "body")
        msg = str(e.get("msg", "invalid")).removeprefix("Value error, ")
        parts.append(f"{loc}: {msg}" if loc and not msg.startswith(loc) else msg)
        param = param or loc or None
    return OpenAIError(422, "; ".join(parts) or "invalid request", param=param,
                       code="invalid_value")


class _OpenAIRoute(APIRoute):
    """Answers schema violations and :class:`OpenAIError` in OpenAI's error shape.

    Why a route class: the app's exception handlers answer ``{"detail": ...}`` (the control
    API's shape); OpenAI clients expect ``{"error": {...}}`` from these routes only.
    """

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def run(request: Request) -> Response:
            try:
                return await handler(request)
            except RequestValidationError as err:
                return _validation_error(err).response()
            except OpenAIError as err:
                return err.response()
            except StarletteHTTPException as err:  # e.g. a body that is not even text
                return OpenAIError(err.status_code, str(err.detail),
                                   headers=getattr(err, "headers", None)).response()

        return run


class ErrorDetail(BaseModel):
    """OpenAI's error object."""

    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """Every error of these routes."""

    error: ErrorDetail


# -- requests ------------------------------------------------------------------------------

def _only(value: Any, allowed: tuple[Any, ...], why: str) -> Any:
    if value is not None and value not in allowed:
        raise ValueError(why)
    return value


class StreamOptions(BaseModel):
    """``stream_options``: ``include_usage`` adds a final usage chunk."""

    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False


class _Common(BaseModel):
    """Fields shared by both endpoints (unknown fields are refused, by name)."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(examples=["tiny"])
    max_tokens: int | None = Field(None, ge=1, description="Tokens to generate (default 16).")
    temperature: float | None = Field(None, description="0 only (greedy decoding).")
    top_p: float | None = Field(None, description="1 only.")
    n: int | None = Field(None, description="1 only.")
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = Field(None, description="Not supported (omit it).")
    presence_penalty: float | None = Field(None, description="0 only.")
    frequency_penalty: float | None = Field(None, description="0 only.")
    logit_bias: dict[str, float] | None = Field(None, description="Empty only.")
    seed: int | None = Field(None, description="Accepted and ignored (greedy decoding).")
    user: str | None = Field(None, description="Session key (after X-Session-Id and "
                                               "prompt_cache_key).")
    prompt_cache_key: str | None = Field(None, description="Session key (after "
                                                           "X-Session-Id).")
    return_token_ids: bool = Field(False, description="Extension: add token_ids and "
                                                      "prompt_token_ids to the choice.")

    @field_validator("temperature")
    @classmethod
    def _greedy(cls, v: float | None) -> float | None:
        return _only(v, (0, 0.0), f"temperature {v} is not supported: the reference model "
                                  "decodes greedily; send 0 or omit it")

    @field_validator("top_p")
    @classmethod
    def _top_p(cls, v: float | None) -> float | None:
        return _only(v, (1, 1.0), f"top_p {v} is not supported (greedy decoding); send 1 "
                                  "or omit it")

    @field_validator("n")
    @classmethod
    def _n(cls, v: int | None) -> int | None:
        return _only(v, (1,), f"n {v} is not supported: one choice per request")

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _penalty(cls, v: float | None) -> float | None:
        return _only(v, (0, 0.0), "penalties are not supported (greedy decoding); send 0 "
                                  "or omit them")

    @field_validator("stop")
    @classmethod
    def _stop(cls, v: str | list[str] | None) -> str | list[str] | None:
        if v:
            raise ValueError("stop sequences are not supported: the runtime generates "
                             "exactly max_tokens tokens")
        return v

    @field_validator("logit_bias")
    @classmethod
    def _bias(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        if v:
            raise ValueError("logit_bias is not supported (greedy decoding)")
        return v


Prompt = str | list[StrictInt] | list[str] | list[list[StrictInt]]


class CompletionRequest(_Common):
    """``POST /v1/completions``: one prompt, as text or token ids."""

    prompt: Prompt = Field(examples=["The cache hit"])
    echo: bool | None = Field(None, description="false only.")
    logprobs: int | None = Field(None, description="Not supported (omit it).")
    best_of: int | None = Field(None, description="1 only.")
    suffix: str | None = Field(None, description="Not supported (omit it).")

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v: Prompt) -> Prompt:
        if isinstance(v, list) and v and isinstance(v[0], (str, list)):
            if len(v) != 1:
                raise ValueError(f"{len(v)} prompts in one request: send one prompt per "
                                 "request (batches are not supported)")
            v = v[0]
        if len(v) == 0:
            raise ValueError("prompt is empty")
        return v

    @field_validator("echo")
    @classmethod
    def _echo(cls, v: bool | None) -> bool | None:
        return _only(v, (False,), "echo is not supported")

    @field_validator("logprobs")
    @classmethod
    def _logprobs(cls, v: int | None) -> int | None:
        return _only(v, (0,), "logprobs are not supported")

    @field_validator("best_of")
    @classmethod
    def _best_of(cls, v: int | None) -> int | None:
        return _only(v, (1,), "best_of is not supported: one choice per request")

    @field_validator("suffix")
    @classmethod
    def _suffix(cls, v: str | None) -> str | None:
        if v:
            raise ValueError("suffix is not supported")
        return v


class TextPart(BaseModel):
    """A text content part of a chat message."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    """One chat message (text content only)."""

    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        """The message's text (parts joined)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class ChatCompletionRequest(_Common):
    """``POST /v1/chat/completions``: messages rendered by the chat template."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1, description="Same as max_tokens.")
    logprobs: bool | None = Field(None, description="false only.")

    @field_validator("logprobs")
    @classmethod
    def _logprobs(cls, v: bool | None) -> bool | None:
        return _only(v, (False,), "logprobs are not supported")


def render_chat(messages: list[ChatMessage]) -> str:
    """The prompt text of ``messages``: the chat template (module docstring)."""
    return "".join(f"<|{m.role}|>\n{m.text()}<|end|>\n" for m in messages) + \
        CHAT_GENERATION_PROMPT


# -- responses (schemas for the OpenAPI document; bodies are built as dicts) ----------------

class PromptTokensDetails(BaseModel):
    """Prompt tokens served from the cache."""

    cached_tokens: int


class Usage(BaseModel):
    """Token counts of one completion."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class CompletionChoice(BaseModel):
    """The one choice of a completion."""

    index: int
    text: str
    logprobs: None = None
    finish_reason: str | None
    token_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None


class Completion(BaseModel):
    """A ``text_completion`` (non-streamed)."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class AssistantMessage(BaseModel):
    """The reply."""

    role: Literal["assistant"]
    content: str


class ChatChoice(BaseModel):
    """The one choice of a chat completion."""

    index: int
    message: AssistantMessage
    logprobs: None = None
    finish_reason: str
    token_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None


class ChatCompletion(BaseModel):
    """A ``chat.completion`` (non-streamed)."""

    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ModelCard(BaseModel):
    """One served model."""

    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ModelList(BaseModel):
    """The served models (one)."""

    object: Literal["list"]
    data: list[ModelCard]


_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse} for code in (400, 404, 422, 503, 504)}
_SSE: dict[str, Any] = {"text/event-stream": {}}  # data: <chunk JSON> events, then [DONE]


# -- waiting on a ticket without blocking the loop -----------------------------------------

class _Turn:
    """One admitted turn whose first token and end arrive as event-loop futures.

    ``submit`` runs on the loop (a lock and the prefix lookup: well under a millisecond).
    A non-streamed turn needs only its end: the ticket's done callback, run by the scheduler
    thread that finishes the turn, hands it straight to the loop (one wake-up; a timer on
    the loop answers a turn that runs past ``timeout``). A streamed turn also needs its first
    token, so a worker of the router's pool does the two blocking waits and hands each
    outcome to the loop. Why so few hand-offs: every one between threads is a wake-up on the
    critical path (on a busy 2-core box about a millisecond each, most of the HTTP overhead),
    and starting a thread blocks the loop until that thread runs.
    """

    def __init__(self, pool: ThreadPoolExecutor, live: LiveCluster, ticket: Ticket,
                 timeout: float, stream: bool) -> None:
        loop = asyncio.get_running_loop()
        self.loop = loop
        self.ticket = ticket
        self.first: asyncio.Future[bool] = loop.create_future()
        self.done: asyncio.Future[bool] = loop.create_future()
        self._args = (live, timeout, stream)
        if stream:
            pool.submit(self._wait)
            return
        self._timer = loop.call_later(timeout, self._expire)
        ticket.add_done_callback(self._on_done)

    def _post(self, *outcomes: tuple[asyncio.Future[bool], bool]) -> None:
        def deliver() -> None:
            for fut, value in outcomes:
                if not fut.done():  # else the request went away
                    fut.set_result(value)
        try:
            self.loop.call_soon_threadsafe(deliver)
        except RuntimeError:
            pass  # the loop is closed: nobody is waiting any more

    def _on_done(self) -> None:
        """The ticket's done callback, on the scheduler thread that finished the turn (with
        its lock held): only hand the end to the loop. Releasing the ticket takes the live
        cluster's lock, which a request thread holds while it submits (and waits for the
        scheduler's lock): done here, that is a lock-order deadlock, so the loop does it."""
        live = self._args[0]

        def deliver() -> None:
            live.done(self.ticket)
            self._timer.cancel()
            for fut in (self.first, self.done):
                if not fut.done():  # else the request went away or timed out
                    fut.set_result(True)
        try:
            self.loop.call_soon_threadsafe(deliver)
        except RuntimeError:
            pass  # the loop is closed: nobody is waiting any more

    def _expire(self) -> None:
        """On the loop: the turn ran past its timeout (the ticket stays until it ends)."""
        for fut in (self.first, self.done):
            if not fut.done():
                fut.set_result(False)

    def _wait(self) -> None:
        live, timeout, stream = self._args
        ticket = self.ticket
        try:
            t0 = time.monotonic()
            self._post((self.first, ticket.first_event.wait(timeout)))
            left = max(0.0, timeout - (time.monotonic() - t0))
            self._post((self.done, ticket.event.wait(left)))
        finally:
            live.done(ticket)


@dataclass
class _Served:
    """What a request resolved to before it is submitted."""

    model: str
    tokens: list[int]
    gen: int
    session: str | None
    stream: bool
    include_usage: bool
    token_ids: bool


def _result(ticket: Ticket, timeout: float) -> TurnResult:
    """The finished ticket's result, or its error as an :class:`OpenAIError`."""
    try:
        return ticket.wait(0)
    except TimeoutError:
        raise OpenAIError(504, f"the turn did not finish within {timeout:g} s",
                          type_="timeout", code="timeout") from None
    except Draining as err:
        raise _draining(err) from None
    except DualPathError as err:
        raise OpenAIError(500, str(err), type_="server_error") from None


def _usage(served: _Served, r: TurnResult) -> dict[str, Any]:
    n_prompt, n_out = len(served.tokens), len(r.tokens)
    return {"prompt_tokens": n_prompt, "completion_tokens": n_out,
            "total_tokens": n_prompt + n_out,
            "prompt_tokens_details": {"cached_tokens": int(r.cached)}}


def _sse(data: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


# -- the router ------------------------------------------------------------------------------

def router(live: LiveCluster, *, max_tokens_limit: int = MAX_TOKENS_LIMIT,
           turn_timeout: float = TURN_TIMEOUT_S, max_in_flight: int = 1024) -> APIRouter:
    """The OpenAI-compatible routes over ``live`` (see the module docstring).

    Args:
        live: the running cluster.
        max_tokens_limit: the largest ``max_tokens`` a request may ask for.
        turn_timeout: seconds a request waits for its turn before answering 504.
        max_in_flight: turns waited on at once (more queue for a worker).
    """
    cfg = model_config(live.opts.model)
    model_id = live.opts.model
    vocab, context = cfg.vocab_size, cfg.max_seq_len
    tokenizer = ByteTokenizer(cfg.vocab_size)
    created = int(time.time())
    r = APIRouter(route_class=_OpenAIRoute, tags=["openai"])
    # one worker per turn in flight (created on demand, reused; each ends its turn's wait
    # within turn_timeout, and a closing cluster answers every ticket)
    pool = ThreadPoolExecutor(max_workers=max_in_flight, thread_name_prefix="openai-turn")

    def resolve(req: _Common, tokens: list[int], session_header: str | None,
                max_tokens: int | None) -> _Served:
        if req.model != model_id:
            raise OpenAIError(404, f"model {req.model!r} is not served here; this cluster "
                                   f"serves {model_id!r}", param="model",
                              code="model_not_found")
        gen = DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens
        if gen > max_tokens_limit:
            raise OpenAIError(400, f"max_tokens {gen} is above this server's limit "
                                   f"{max_tokens_limit}", param="max_tokens",
                              code="max_tokens_too_large")
        if not tokens:
            raise OpenAIError(400, "prompt is empty", param="prompt", code="empty_prompt")
        bad = next((t for t in tokens if not 0 <= t < vocab), None)
        if bad is not None:
            raise OpenAIError(400, f"token id {bad} is outside the vocabulary [0, {vocab})",
                              param="prompt", code="invalid_token")
        if len(tokens) + gen > context:
            raise OpenAIError(400, f"prompt ({len(tokens)} tokens) plus max_tokens ({gen}) "
                                   f"exceed the model's context of {context} tokens",
                              param="prompt", code="context_length_exceeded")
        session = session_header or req.prompt_cache_key or req.user
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return _Served(model_id, tokens, gen, session, req.stream, include_usage,
                       req.return_token_ids)

    def admit(served: _Served, key: str | None = None) -> _Turn:
        try:
            if key is not None:
                ticket = live.submit(served.tokens, served.gen, served.session,
                                     key=check_key(key))
            else:
                ticket = live.submit(served.tokens, served.gen, served.session)
        except KeyConflict as err:
            raise OpenAIError(422, str(err), param="Idempotency-Key",
                              code="idempotency_key_reused") from None
        except Draining as err:
            raise _draining(err) from None
        except DualPathError as err:
            raise OpenAIError(400, str(err)) from None
        return _Turn(pool, live, ticket, turn_timeout, served.stream)

    async def finish(turn: _Turn) -> TurnResult:
        await turn.done
        return _result(turn.ticket, turn_timeout)

    async def stream(served: _Served, turn: _Turn, rid: str, obj: str,
                     chunk: Callable[[str | None, str | None, list[int] | None],
                                     dict[str, Any]]) -> Response:
        # wait for the first token before answering, so an error before it is a status code
        await turn.first
        if turn.ticket.error is not None or not turn.ticket.first_event.is_set():
            _result(turn.ticket, turn_timeout)  # raises the error (or the timeout)

        def envelope(choices: list[dict[str, Any]]) -> dict[str, Any]:
            return {"id": rid, "object": obj, "created": int(time.time()),
                    "model": served.model, "choices": choices}

        async def events() -> AsyncIterator[bytes]:
            yield _sse(envelope([chunk("", None, None)]))
            try:
                r = await finish(turn)
            except OpenAIError as err:
                yield _sse({"error": {"message": err.message, "type": err.type,
                                      "param": err.param, "code": err.code}})
                yield b"data: [DONE]\n\n"
                return
            yield _sse(envelope([chunk(tokenizer.decode(r.tokens), None,
                                       r.tokens if served.token_ids else None)]))
            yield _sse(envelope([chunk(None, "length", None)]))
            if served.include_usage:
                yield _sse(envelope([]) | {"usage": _usage(served, r)})
            yield b"data: [DONE]\n\n"

        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        return StreamingResponse(events(), media_type="text/event-stream", headers=headers)

    def reply(body: dict[str, Any]) -> Response:
        return JSONResponse(body)

    def encode(text: str) -> list[int]:
        try:
            return tokenizer.encode(text)
        except UnicodeEncodeError as err:  # a lone surrogate (JSON allows "\udc80")
            raise OpenAIError(400, f"the text is not valid Unicode ({err.reason} at "
                                   f"character {err.start})", code="invalid_text") from None

    @r.get("/v1/models", response_model=ModelList)
    async def models() -> dict[str, Any]:
        """The served model (one: the cluster's reference model)."""
        return {"object": "list", "data": [{"id": model_id, "object": "model",
                                            "created": created, "owned_by": "dualpath"}]}

    @r.get("/v1/models/{model}", response_model=ModelCard, responses=_ERRORS)
    async def model(model: str) -> dict[str, Any]:
        """One served model by id (404 for any other)."""
        if model != model_id:
            raise OpenAIError(404, f"model {model!r} is not served here; this cluster serves "
                                   f"{model_id!r}", param="model", code="model_not_found")
        return {"id": model_id, "object": "model", "created": created, "owned_by": "dualpath"}

    @r.post("/v1/completions", response_model=Completion,
            responses=_ERRORS | {200: {"content": _SSE}})
    async def completions(
            body: CompletionRequest,
            x_session_id: Annotated[str | None, Header(description=(
                "Session key: one session is one agent's prefix chain."))] = None,
            idempotency_key: Annotated[str | None, Header(description=(
                "Names this turn: a resubmission gets the same turn's answer."))] = None,
    ) -> Response:
        """Complete one prompt (text or token ids) greedily; ``stream`` for SSE chunks."""
        p = body.prompt  # one prompt after validation: text or token ids
        tokens = encode(p) if isinstance(p, str) else [
            t for t in p if isinstance(t, int)]
        served = resolve(body, tokens, x_session_id, body.max_tokens)
        rid = f"cmpl-{uuid.uuid4().hex}"
        turn = admit(served, idempotency_key)

        def chunk(text: str | None, finish_reason: str | None,
                  ids: list[int] | None) -> dict[str, Any]:
            c: dict[str, Any] = {"index": 0, "text": text or "", "logprobs": None,
                                 "finish_reason": finish_reason}
            if ids is not None:
                c["token_ids"] = ids
            return c

        if served.stream:
            return await stream(served, turn, rid, "text_completion", chunk)
        r = await finish(turn)
        choice = chunk(tokenizer.decode(r.tokens), "length", None)
        if served.token_ids:
            choice |= {"token_ids": list(r.tokens), "prompt_token_ids": served.tokens}
        return reply({"id": rid, "object": "text_completion",
                              "created": int(time.time()), "model": served.model,
                              "choices": [choice], "usage": _usage(served, r)})

    @r.post("/v1/chat/completions", response_model=ChatCompletion,
            responses=_ERRORS | {200: {"content": _SSE}})
    async def chat_completions(
            body: ChatCompletionRequest,
            x_session_id: Annotated[str | None, Header(description=(
                "Session key: one session is one agent's prefix chain."))] = None,
            idempotency_key: Annotated[str | None, Header(description=(
                "Names this turn: a resubmission gets the same turn's answer."))] = None,
    ) -> Response:
        """Reply to ``messages`` (rendered by the chat template) greedily."""
        tokens = encode(render_chat(body.messages))
        max_tokens = body.max_completion_tokens or body.max_tokens
        served = resolve(body, tokens, x_session_id, max_tokens)
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        turn = admit(served, idempotency_key)

        def chunk(text: str | None, finish_reason: str | None,
                  ids: list[int] | None) -> dict[str, Any]:
            delta: dict[str, Any] = {}
            if text == "" and finish_reason is None:
                delta = {"role": "assistant", "content": ""}
            elif text is not None:
                delta = {"content": text}
            c: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None,
                                 "finish_reason": finish_reason}
            if ids is not None:
                c["token_ids"] = ids
            return c

        if served.stream:
            return await stream(served, turn, rid, "chat.completion.chunk", chunk)
        r = await finish(turn)
        choice: dict[str, Any] = {"index": 0, "message": {
            "role": "assistant", "content": tokenizer.decode(r.tokens)},
            "logprobs": None, "finish_reason": "length"}
        if served.token_ids:
            choice |= {"token_ids": list(r.tokens), "prompt_token_ids": served.tokens}
        return reply({"id": rid, "object": "chat.completion",
                              "created": int(time.time()), "model": served.model,
                              "choices": [choice], "usage": _usage(served, r)})

    return r
