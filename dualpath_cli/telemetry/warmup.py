"""Typed records of what ``/api/v1/storage/warm`` answers: a warm-up's plan and progress.

Why records: ``dualpath storage warm --url`` and the tests read these answers through the
API client or its shipped fake; named, typed fields replace ``.get("plan", {})`` chains.
The server builds the answers as dicts (services/warm.py: ``WarmPlan.to_dict``,
``start_live``, ``live_progress``); ``from_dict`` reads them and ``to_dict`` gives the same
JSON back, key for key and in order (``--json`` prints it). A key this reader does not know
(a newer server) is kept in ``extra``. Pure data: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Template", "WarmPlanSummary", "WarmProgress", "WarmUp"]


@dataclass(frozen=True, slots=True)
class Template:
    """One named prompt prefix, as token ids (what a warm-up warms; services/warm.py reads
    a templates file into these, the API client posts them)."""

    name: str
    tokens: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        """The template as ``POST /api/v1/storage/warm`` takes it."""
        return {"name": self.name, "tokens": list(self.tokens)}


@dataclass(frozen=True, slots=True)
class WarmPlanSummary:
    """The plan a warm-up follows: per template (``name``, ``tokens``, ``blocks``,
    ``stored``, ``shared``), the blocks and bytes it reads, what the DRAM cache could not
    hold, and notes for the operator."""

    templates: tuple[dict[str, Any], ...] = ()
    blocks: int = 0
    bytes: int = 0
    block_bytes: int = 0
    dropped_over_cache: int = 0
    notes: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)

    _KEYS = ("templates", "blocks", "bytes", "block_bytes", "dropped_over_cache", "notes")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> WarmPlanSummary:
        """The record of the plan as the API serves it."""
        return cls(tuple(dict(t) for t in data.get("templates") or ()),
                   int(data.get("blocks", 0)), int(data.get("bytes", 0)),
                   int(data.get("block_bytes", 0)), int(data.get("dropped_over_cache", 0)),
                   tuple(str(n) for n in data.get("notes") or ()),
                   {k: v for k, v in data.items() if k not in cls._KEYS})

    def to_dict(self) -> dict[str, Any]:
        """The plan as the API serves it."""
        return {"templates": [dict(t) for t in self.templates], "blocks": self.blocks,
                "bytes": self.bytes, "block_bytes": self.block_bytes,
                "dropped_over_cache": self.dropped_over_cache, "notes": list(self.notes),
                **self.extra}


@dataclass(frozen=True, slots=True)
class WarmProgress:
    """A warm-up's progress summed over the engines: bytes read, blocks still to read (in
    all and by engine id), and whether every engine sent it is done."""

    bytes: int = 0
    blocks_remaining: int = 0
    engines: dict[str, float] = field(default_factory=dict)
    done: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    _KEYS = ("bytes", "blocks_remaining", "engines", "done")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> WarmProgress:
        """The record of the progress as the API serves it."""
        return cls(int(data.get("bytes", 0)), int(data.get("blocks_remaining", 0)),
                   dict(data.get("engines") or {}), bool(data.get("done", False)),
                   {k: v for k, v in data.items() if k not in cls._KEYS})

    def to_dict(self) -> dict[str, Any]:
        """The progress as the API serves it."""
        return {"bytes": self.bytes, "blocks_remaining": self.blocks_remaining,
                "engines": dict(self.engines), "done": self.done, **self.extra}


@dataclass(frozen=True, slots=True)
class WarmUp:
    """A warm-up: ``POST`` answers the one it started (``seq``: its audit entry; no
    ``progress``), ``GET`` the last one with its ``progress`` (no ``seq``; only
    ``progress`` when none was started). ``None``: not in that answer.

    ``rate_bps``/``rate``: the cap per node (bytes/s, and for people); ``role``: the
    engines it targets; ``engines``: the ids sent it; ``started``: wall-clock seconds.
    """

    seq: int | None = None
    plan: WarmPlanSummary | None = None
    rate_bps: float | None = None
    rate: str | None = None
    role: str | None = None
    engines: tuple[int, ...] | None = None
    started: float | None = None
    progress: WarmProgress | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    _KEYS = ("seq", "plan", "rate_bps", "rate", "role", "engines", "started", "progress")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> WarmUp:
        """The record of a ``/api/v1/storage/warm`` answer."""
        plan, progress, engines = data.get("plan"), data.get("progress"), data.get("engines")
        return cls(data.get("seq"),
                   None if plan is None else WarmPlanSummary.from_dict(plan),
                   data.get("rate_bps"), data.get("rate"), data.get("role"),
                   None if engines is None else tuple(engines), data.get("started"),
                   None if progress is None else WarmProgress.from_dict(progress),
                   {k: v for k, v in data.items() if k not in cls._KEYS})

    def to_dict(self) -> dict[str, Any]:
        """The answer as the API serves it (fields it lacked are left out)."""
        values: dict[str, Any] = {
            "seq": self.seq, "plan": None if self.plan is None else self.plan.to_dict(),
            "rate_bps": self.rate_bps, "rate": self.rate, "role": self.role,
            "engines": None if self.engines is None else list(self.engines),
            "started": self.started,
            "progress": None if self.progress is None else self.progress.to_dict()}
        return {**{k: v for k, v in values.items() if v is not None}, **self.extra}
