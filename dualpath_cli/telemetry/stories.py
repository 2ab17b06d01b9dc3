"""Typed records of what ``GET /api/v1/requests[/{id}]`` serves: turns in flight and stories.

Why records: the API client, its shipped fake, the recorder, the TUI and ``dualpath explain``
all read these answers; a frozen record with named, typed fields catches a misspelt key at
type-check time instead of as a ``KeyError`` in front of a user. The server builds the
answers as plain dicts (diagnose/explain.py's :func:`explain_request` and
:func:`inflight_row`: the JSON contract) and the client turns them into these records with
``from_dict``; ``to_dict`` gives the same JSON back, key for key and in the server's order,
so a recording written from records is byte-identical to one written from the answers.
A key this reader does not know yet (a newer server) is kept in ``extra`` and written back
after the known ones. Pure data: no I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any

__all__ = ["InflightTurn", "RequestStory", "RequestListing"]


@cache
def _names(cls: type) -> tuple[str, ...]:
    """The wire keys of a record: its fields in order, less ``extra``."""
    return tuple(f.name for f in dataclasses.fields(cls) if f.name != "extra")


def _split(cls: type, data: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``data`` as (known fields present, unknown keys)."""
    names = _names(cls)
    known = {k: data[k] for k in names if k in data}
    return known, {k: v for k, v in data.items() if k not in names}


@dataclass(frozen=True, slots=True)
class InflightTurn:
    """One turn in flight (``GET /api/v1/requests?state=inflight``'s row; diagnose/explain.py's
    :func:`inflight_row` documents each field). ``None``: not known yet (not placed, no first
    token), or absent from an older server's row."""

    rid: int
    agent: int | None = None
    turn: int | None = None
    attempt: int | None = None
    phase: str | None = None
    arrived_at: float | None = None
    age_s: float | None = None
    pe: int | None = None
    de: int | None = None
    de_group: int | None = None
    side: str | None = None
    prompt_tokens: int | None = None
    gen: int | None = None
    cached_tokens: int | None = None
    pe_tokens: int | None = None
    de_tokens: int | None = None
    bytes_to_read: int | None = None
    bytes_read: int | None = None
    pe_snic_bytes: int | None = None
    de_to_pe_bytes: int | None = None
    ttft_s: float | None = None
    waited_s: float | None = None
    decision_seq: int | None = None
    pe_class: str | None = None
    de_class: str | None = None
    #: the prefix lookup: ``blocks``, ``hit_blocks``, ``misses`` by reason, ``evicted_age_s``
    lookup: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> InflightTurn:
        """The record of one row as the API serves it."""
        known, extra = _split(cls, data)
        return cls(**known, extra=extra)

    def to_dict(self) -> dict[str, Any]:
        """The row as the API serves it."""
        out = {k: getattr(self, k) for k in _names(InflightTurn)}
        return {**out, **self.extra}


@dataclass(frozen=True, slots=True)
class RequestStory:
    """One request's story (``GET /api/v1/requests/{id}``; diagnose/explain.py's
    :func:`explain_request` documents it): why it went where it went, what it hit, where the
    time went. The nested parts stay JSON objects (``pe``/``de``: the chosen engines'
    snapshots; ``read``: side, tokens per side and why; ``lookup``: blocks and misses;
    ``hits``/``dram_misses``/``nic_bytes``/``ttft_split``: the outcome, ``None`` until the
    request's first token)."""

    rid: int
    #: the request's other ids: the OpenAI body's id, a client's ``x-request-id``
    aliases: tuple[str, ...] = ()
    agent: int | None = None
    turn: int | None = None
    state: str = ""
    attempts: tuple[dict[str, Any], ...] = ()
    decided_at: float | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    block_tokens: int | None = None
    pe: dict[str, Any] | None = None
    de: dict[str, Any] | None = None
    thresholds: dict[str, Any] | None = None
    read: dict[str, Any] | None = None
    lookup: dict[str, Any] = field(default_factory=dict)
    hits: dict[str, Any] | None = None
    dram_misses: dict[str, Any] | None = None
    nic_bytes: dict[str, Any] | None = None
    layer_slack_s: tuple[float, ...] | None = None
    ttft_s: float | None = None
    ttft_split: dict[str, float | None] | None = None
    tpot_s: float | None = None
    arrival: float | None = None
    #: the turn's in-flight row while it runs; ``None`` once it finished
    progress: InflightTurn | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def placed(self) -> bool:
        """Whether a decision placed it (PE, DE, read side and thresholds are known)."""
        return not (self.pe is None or self.de is None or self.read is None
                    or self.thresholds is None)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RequestStory:
        """The record of a story as the API serves it."""
        known, extra = _split(cls, data)
        known["attempts"] = tuple(known.get("attempts") or ())
        known["aliases"] = tuple(str(a) for a in known.get("aliases") or ())
        known["lookup"] = dict(known.get("lookup") or {})
        if known.get("layer_slack_s") is not None:
            known["layer_slack_s"] = tuple(known["layer_slack_s"])
        if known.get("progress") is not None:
            known["progress"] = InflightTurn.from_dict(known["progress"])
        return cls(**known, extra=extra)

    def to_dict(self) -> dict[str, Any]:
        """The story as the API serves it."""
        out = {k: getattr(self, k) for k in _names(RequestStory)}
        out["attempts"] = list(self.attempts)
        out["aliases"] = list(self.aliases)
        if self.layer_slack_s is not None:
            out["layer_slack_s"] = list(self.layer_slack_s)
        if self.progress is not None:
            out["progress"] = self.progress.to_dict()
        return {**out, **self.extra}


@dataclass(frozen=True, slots=True)
class RequestListing:
    """``GET /api/v1/requests``: the turns in flight (``state`` ``inflight``: the oldest
    ``turns`` of ``total``) or finished requests' ``stories`` (``finished``, finish order).

    A recording keeps each sample's in-flight listing without its ``state`` (it is always
    ``inflight`` there); :meth:`from_dict` reads that form too.
    """

    state: str
    at: float
    total: int | None = None
    turns: tuple[InflightTurn, ...] = ()
    stories: tuple[RequestStory, ...] = ()

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RequestListing:
        """The record of a listing as the API serves it (or as a recording keeps it)."""
        state = str(data.get("state", "inflight"))
        rows = data.get("requests") or ()
        total = data.get("total")
        return cls(state, data.get("at", 0.0),
                   None if total is None else int(total),
                   turns=() if state == "finished" else tuple(
                       InflightTurn.from_dict(r) for r in rows),
                   stories=tuple(RequestStory.from_dict(r) for r in rows)
                   if state == "finished" else ())

    def to_dict(self) -> dict[str, Any]:
        """The listing as the API serves it."""
        out: dict[str, Any] = {"state": self.state, "at": self.at}
        if self.total is not None:
            out["total"] = self.total
        rows = self.stories if self.state == "finished" else self.turns
        out["requests"] = [r.to_dict() for r in rows]
        return out
