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
- ``stream: true``: server-sent events in OpenAI's chunk format ending with ``data: [DONE]``:
  the text as the decode engine makes it (the PE's first token, then a chunk per decode step
  or per wake-up of the event loop, whichever is coarser; chat's first chunk also carries
  the role), the finish chunk, and with ``stream_options.include_usage`` a last chunk with
  empty ``choices`` and the ``usage``. The joined text equals the unstreamed answer (bytes
  split across chunks are decoded incrementally). A client that disconnects cancels its
  turn (the scheduler drops it, its engines free what they hold), unless it sent an
  ``Idempotency-Key``: that turn runs on for its resubmission.
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

Request ids: every answer of an admitted turn (streamed or not, and its errors) carries
``x-request-id``, the scheduler's integer request id (the decision log's ``rid``); the body's
``id`` is ``chatcmpl-<rid>-<random>`` (``cmpl-`` for completions). A client's own
``x-request-id`` request header is kept as an alias of the turn. ``dualpath explain`` and
``GET /api/v1/requests/{id}`` take any of the three (telemetry/request_ids.py).

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

Waiting never blocks the event loop: the scheduler's threads hand a turn's tokens and end
to the loop (:mod:`.openai_turns`).

The request and response schemas and the chat template are in :mod:`.openai_schema`, the
error shape in :mod:`.openai_errors`, the waiting in :mod:`.openai_turns`; this module resolves
a request against the served model and answers it.
"""

from __future__ import annotations

import codecs
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Header
from fastapi.responses import JSONResponse, Response, StreamingResponse

from dualpath_cli.api.openai_errors import ERRORS, OpenAIError, OpenAIRoute, draining_error
from dualpath_cli.api.openai_schema import (
    SSE,
    ChatCompletion,
    ChatCompletionRequest,
    CommonRequest,
    Completion,
    CompletionRequest,
    ModelCard,
    ModelList,
    render_chat,
)
from dualpath_cli.api.openai_turns import Turn, turn_result
from dualpath_cli.core.reference_model import model_config
from dualpath_cli.core.tokenizer import N_BYTE_TOKENS, ByteTokenizer
from dualpath_cli.errors import DualPathError
from dualpath_cli.services.live import Draining, LiveCluster, TurnResult
from dualpath_cli.services.restart import KeyConflict, check_key
from dualpath_cli.telemetry.request_ids import body_id, valid_alias

__all__ = ["router", "DEFAULT_MAX_TOKENS", "MAX_TOKENS_LIMIT", "TURN_TIMEOUT_S"]

DEFAULT_MAX_TOKENS = 16
"""``max_tokens`` when a request omits it (OpenAI's completions default)."""
MAX_TOKENS_LIMIT = 1024
"""The largest ``max_tokens`` a request may ask for (the router's default limit)."""
TURN_TIMEOUT_S = 600.0
"""A turn that has not finished after this long is answered 504."""

# The headers both turn routes read (their descriptions are the OpenAPI docs'). Module
# level: FastAPI resolves a route's annotations among the module's names.
SessionHeader = Annotated[str | None, Header(description=(
    "Session key: one session is one agent's prefix chain."))]
IdempotencyHeader = Annotated[str | None, Header(description=(
    "Names this turn: a resubmission gets the same turn's answer."))]
ClientIdHeader = Annotated[str | None, Header(description=(
    "Your own id for this turn (1-200 printable characters, not all digits): kept as an "
    "alias, so dualpath explain finds the turn by it."))]


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


def _usage(served: _Served, r: TurnResult) -> dict[str, Any]:
    n_prompt, n_out = len(served.tokens), len(r.tokens)
    return {"prompt_tokens": n_prompt, "completion_tokens": n_out,
            "total_tokens": n_prompt + n_out,
            "prompt_tokens_details": {"cached_tokens": int(r.cached)}}


def _sse(data: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


# -- the router ------------------------------------------------------------------------------

def router(live: LiveCluster, *, max_tokens_limit: int = MAX_TOKENS_LIMIT,
           turn_timeout: float = TURN_TIMEOUT_S) -> APIRouter:
    """The OpenAI-compatible routes over ``live`` (see the module docstring).

    Args:
        live: the running cluster.
        max_tokens_limit: the largest ``max_tokens`` a request may ask for.
        turn_timeout: seconds a request waits for its turn before answering 504.
    """
    cfg = model_config(live.opts.model)
    model_id = live.opts.model
    vocab, context = cfg.vocab_size, cfg.max_seq_len
    tokenizer = ByteTokenizer(cfg.vocab_size)
    created = int(time.time())
    r = APIRouter(route_class=OpenAIRoute, tags=["openai"])

    def resolve(req: CommonRequest, tokens: list[int], session_header: str | None,
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

    def admit(served: _Served, key: str | None = None) -> Turn:
        try:
            if key is not None:
                ticket = live.submit(served.tokens, served.gen, served.session,
                                     key=check_key(key), stream=served.stream)
            else:
                ticket = live.submit(served.tokens, served.gen, served.session,
                                     stream=served.stream)
        except KeyConflict as err:
            raise OpenAIError(422, str(err), param="Idempotency-Key",
                              code="idempotency_key_reused") from None
        except Draining as err:
            raise draining_error(err) from None
        except DualPathError as err:
            raise OpenAIError(400, str(err)) from None
        return Turn(live, ticket, turn_timeout, keep=key is not None)

    def name(turn: Turn, kind: str, client_id: str | None) -> tuple[str, dict[str, str]]:
        """The turn's body id (``<kind>-<rid>-<random>``) and its ``x-request-id`` header
        (the scheduler's id); the body id and the client's own id become its aliases."""
        rid = turn.ticket.rid
        if rid is None:  # a kept answer restored without its id (an older checkpoint)
            return f"{kind}-{uuid.uuid4().hex}", {}
        body = body_id(kind, rid)
        live.name_turn(rid, (body, client_id if valid_alias(client_id) else None))
        return body, {"x-request-id": str(rid)}

    async def finish(turn: Turn) -> TurnResult:
        await turn.done
        return turn_result(turn.ticket, turn_timeout)

    async def stream(served: _Served, turn: Turn, rid: str, obj: str,
                     chunk: Callable[[str | None, str | None, list[int] | None],
                                     dict[str, Any]], id_headers: dict[str, str]) -> Response:
        # wait for the first token before answering, so an error before it is a status code
        try:
            await turn.started()
        except BaseException:
            turn.cancel()  # the client went away while its turn waited
            raise
        if turn.ticket.error is not None or (turn.done.done() and not turn.done.result()):
            try:  # the error (or the timeout) is told before the cancel makes it "cancelled"
                turn_result(turn.ticket, turn_timeout)
            finally:
                turn.cancel()

        def envelope(choices: list[dict[str, Any]]) -> dict[str, Any]:
            return {"id": rid, "object": obj, "created": int(time.time()),
                    "model": served.model, "choices": choices}

        async def events() -> AsyncIterator[bytes]:
            text = codecs.getincrementaldecoder("utf-8")(errors="replace")
            sent: list[int] = []

            def piece(ids: list[int], final: bool = False) -> bytes:
                sent.extend(ids)
                part = text.decode(bytes(t for t in ids if 0 <= t < N_BYTE_TOKENS), final)
                if not part and not served.token_ids:
                    return b""  # a character's first bytes: they go with its last
                return _sse(envelope([chunk(part, None, ids if served.token_ids else None)]))

            try:
                yield _sse(envelope([chunk("", None, None)]))
                async for ids in turn.tokens():
                    if data := piece(ids):
                        yield data
                r = await finish(turn)
            except OpenAIError as err:
                yield _sse({"error": {"message": err.message, "type": err.type,
                                      "param": err.param, "code": err.code}})
                yield b"data: [DONE]\n\n"
                return
            finally:
                turn.cancel()  # the client went away mid-stream (a no-op once it ended)
            rest = list(r.tokens[len(sent):])  # an engine that does not stream: all of it
            if rest or text.getstate()[0]:  # (or bytes held back as a character's start)
                if data := piece(rest, True):
                    yield data
            yield _sse(envelope([chunk(None, "length", None)]))
            if served.include_usage:
                yield _sse(envelope([]) | {"usage": _usage(served, r)})
            yield b"data: [DONE]\n\n"

        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"} | id_headers
        return StreamingResponse(events(), media_type="text/event-stream", headers=headers)

    def reply(body: dict[str, Any], headers: dict[str, str]) -> Response:
        return JSONResponse(body, headers=headers)

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

    @r.get("/v1/models/{model}", response_model=ModelCard, responses=ERRORS)
    async def model(model: str) -> dict[str, Any]:
        """One served model by id (404 for any other)."""
        if model != model_id:
            raise OpenAIError(404, f"model {model!r} is not served here; this cluster serves "
                                   f"{model_id!r}", param="model", code="model_not_found")
        return {"id": model_id, "object": "model", "created": created, "owned_by": "dualpath"}

    @r.post("/v1/completions", response_model=Completion,
            responses=ERRORS | {200: {"content": SSE}})
    async def completions(
            body: CompletionRequest,
            x_session_id: SessionHeader = None,
            idempotency_key: IdempotencyHeader = None,
            x_request_id: ClientIdHeader = None,
    ) -> Response:
        """Complete one prompt (text or token ids) greedily; ``stream`` for SSE chunks."""
        p = body.prompt  # one prompt after validation: text or token ids
        tokens = encode(p) if isinstance(p, str) else [
            t for t in p if isinstance(t, int)]
        served = resolve(body, tokens, x_session_id, body.max_tokens)
        turn = admit(served, idempotency_key)
        rid, id_headers = name(turn, "cmpl", x_request_id)

        def chunk(text: str | None, finish_reason: str | None,
                  ids: list[int] | None) -> dict[str, Any]:
            c: dict[str, Any] = {"index": 0, "text": text or "", "logprobs": None,
                                 "finish_reason": finish_reason}
            if ids is not None:
                c["token_ids"] = ids
            return c

        try:
            if served.stream:
                return await stream(served, turn, rid, "text_completion", chunk, id_headers)
            r = await finish(turn)
        except OpenAIError as err:
            raise err.tagged(id_headers) from None
        choice = chunk(tokenizer.decode(r.tokens), "length", None)
        if served.token_ids:
            choice |= {"token_ids": list(r.tokens), "prompt_token_ids": served.tokens}
        return reply({"id": rid, "object": "text_completion",
                              "created": int(time.time()), "model": served.model,
                              "choices": [choice], "usage": _usage(served, r)}, id_headers)

    @r.post("/v1/chat/completions", response_model=ChatCompletion,
            responses=ERRORS | {200: {"content": SSE}})
    async def chat_completions(
            body: ChatCompletionRequest,
            x_session_id: SessionHeader = None,
            idempotency_key: IdempotencyHeader = None,
            x_request_id: ClientIdHeader = None,
    ) -> Response:
        """Reply to ``messages`` (rendered by the chat template) greedily."""
        tokens = encode(render_chat(body.messages))
        max_tokens = body.max_completion_tokens or body.max_tokens
        served = resolve(body, tokens, x_session_id, max_tokens)
        turn = admit(served, idempotency_key)
        rid, id_headers = name(turn, "chatcmpl", x_request_id)

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

        try:
            if served.stream:
                return await stream(served, turn, rid, "chat.completion.chunk", chunk, id_headers)
            r = await finish(turn)
        except OpenAIError as err:
            raise err.tagged(id_headers) from None
        choice: dict[str, Any] = {"index": 0, "message": {
            "role": "assistant", "content": tokenizer.decode(r.tokens)},
            "logprobs": None, "finish_reason": "length"}
        if served.token_ids:
            choice |= {"token_ids": list(r.tokens), "prompt_token_ids": served.tokens}
        return reply({"id": rid, "object": "chat.completion",
                              "created": int(time.time()), "model": served.model,
                              "choices": [choice], "usage": _usage(served, r)}, id_headers)

    return r
