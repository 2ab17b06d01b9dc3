"""The OpenAI-compatible routes' request and response schemas, and the chat template.

Requests are validated here, strictly as OpenAI does (``max_tokens: "5"`` or ``true``,
``stream: "yes"`` and a user message without content are refused, not coerced); what greedy
decoding of the reference model cannot honour is refused with a reason. Both are a 400 in
OpenAI's error shape (api/openai_errors.py). Response models document the OpenAPI schema
(bodies are built as dicts).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationInfo, field_validator

__all__ = ["CHAT_GENERATION_PROMPT", "StreamOptions", "CommonRequest", "Prompt",
           "CompletionRequest", "TextPart", "ChatMessage", "ChatCompletionRequest",
           "render_chat", "PromptTokensDetails", "Usage", "CompletionChoice", "Completion",
           "AssistantMessage", "ChatChoice", "ChatCompletion", "ModelCard", "ModelList", "SSE"]

CHAT_GENERATION_PROMPT = "<|assistant|>\n"

#: Every request model: unknown fields refused by name, no type coerced (``"5"`` is not 5).
_STRICT = ConfigDict(extra="forbid", strict=True)


# -- requests ------------------------------------------------------------------------------

def _only(value: Any, allowed: tuple[Any, ...], why: str) -> Any:
    if value is not None and value not in allowed:
        raise ValueError(why)
    return value


class StreamOptions(BaseModel):
    """``stream_options``: ``include_usage`` adds a final usage chunk."""

    model_config = _STRICT
    include_usage: bool = False


class CommonRequest(BaseModel):
    """Fields shared by both endpoints (unknown fields are refused, by name)."""

    model_config = _STRICT

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


class CompletionRequest(CommonRequest):
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

    model_config = _STRICT
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    """One chat message (text content only)."""

    model_config = _STRICT
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = Field(None, validate_default=True)
    name: str | None = None

    @field_validator("content")
    @classmethod
    def _content_needed(cls, v: str | list[TextPart] | None, info: ValidationInfo
                        ) -> str | list[TextPart] | None:
        # as OpenAI: only an assistant's content may be null (its tool calls carry it)
        role = info.data.get("role")
        if v is None and role is not None and role != "assistant":
            raise ValueError(f"a {role} message needs content (a string or an array of "
                             "text parts), not null")
        return v

    def text(self) -> str:
        """The message's text (parts joined)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class ChatCompletionRequest(CommonRequest):
    """``POST /v1/chat/completions``: messages rendered by the chat template."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1, description="Same as max_tokens.")
    logprobs: bool | None = Field(None, description="false only.")

    @field_validator("logprobs")
    @classmethod
    def _logprobs(cls, v: bool | None) -> bool | None:
        return _only(v, (False,), "logprobs are not supported")


def render_chat(messages: list[ChatMessage]) -> str:
    """The prompt text of ``messages``: the chat template (see
    :mod:`dualpath_cli.api.openai_routes`)."""
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


SSE: dict[str, Any] = {"text/event-stream": {}}  # data: <chunk JSON> events, then [DONE]
