"""Request ids as people meet them, mapped to the scheduler's integer request id.

Why: the operator tools (``dualpath explain``, ``GET /api/v1/requests/{id}``, recordings)
know a turn by the scheduler's integer id (the decision log's ``rid``), while a client sees
the OpenAI body's ``chatcmpl-...``/``cmpl-...`` id, the ``x-request-id`` response header, or
the ``x-request-id`` it sent itself. Every one of those names the same turn:

* the integer id, as digits (``42``): always the scheduler's id;
* the body's id, ``chatcmpl-<rid>-<random>`` or ``cmpl-<rid>-<random>``: the id is in it;
* a client's own ``x-request-id``: kept as an alias of the turn in a bounded map
  (:class:`RequestAliases`), and in the turn's story (``aliases``), so a recording finds it.

Pure data and a lock: no I/O.
"""

from __future__ import annotations

import collections
import re
import secrets
import threading
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["RequestAliases", "body_id", "parse_request_id", "valid_alias", "ALIASES_MAX"]

ALIASES_MAX = 10_000
"""Turns whose aliases are kept (the decision ring's default size: a turn whose story is
still known keeps its names)."""

_BODY_ID = re.compile(r"(?:chatcmpl|cmpl)-(\d{1,18})-[0-9a-f]+")
_ALIAS = re.compile(r"[!-~]{1,200}")


def body_id(kind: str, rid: int) -> str:
    """The OpenAI body's id of turn ``rid``: ``<kind>-<rid>-<random>`` (``kind``:
    ``chatcmpl`` or ``cmpl``); the random part keeps ids unique across cluster runs."""
    return f"{kind}-{rid}-{secrets.token_hex(8)}"


def parse_request_id(text: str | int) -> int | None:
    """The integer id ``text`` names by itself (digits, or a body id), else ``None`` (a
    client's alias, or nothing known)."""
    if isinstance(text, int):
        return text if text >= 0 else None
    text = text.strip()
    if text.isascii() and text.isdigit():
        return int(text)
    m = _BODY_ID.fullmatch(text)
    return int(m.group(1)) if m else None


def valid_alias(text: str | None) -> bool:
    """Whether a client's ``x-request-id`` can be kept as an alias: 1-200 printable ASCII
    characters, not all digits (digits always name the scheduler's id)."""
    return (text is not None and _ALIAS.fullmatch(text) is not None
            and not text.isdigit())


class RequestAliases:
    """Names of the newest turns (at most ``turns`` of them), both ways: alias to id, id to
    its aliases in the order given. A name given again moves to the newest turn it names.

    Args:
        turns: turns whose names are kept (the oldest turn's go first).
    """

    def __init__(self, turns: int = ALIASES_MAX) -> None:
        self._max = max(1, turns)
        self._ids: dict[str, int] = {}
        self._names: collections.OrderedDict[int, list[str]] = collections.OrderedDict()
        self._lock = threading.Lock()
        self.version = 0
        """Moves on every :meth:`add`: a checkpoint writer's cheap "something changed"."""

    def add(self, rid: int, names: Iterable[str | None]) -> None:
        """Name turn ``rid`` (``None`` and empty names are skipped)."""
        with self._lock:
            self.version += 1
            kept = self._names.setdefault(rid, [])
            self._names.move_to_end(rid)
            for name in names:
                if not name:
                    continue
                old = self._ids.get(name)
                if old is not None and old != rid and name in self._names.get(old, ()):
                    self._names[old].remove(name)
                self._ids[name] = rid
                if name not in kept:
                    kept.append(name)
            while len(self._names) > self._max:
                old, gone = self._names.popitem(last=False)
                for name in gone:
                    if self._ids.get(name) == old:
                        del self._ids[name]

    def of(self, rid: int) -> tuple[str, ...]:
        """Turn ``rid``'s names (empty if none, or forgotten)."""
        with self._lock:
            return tuple(self._names.get(rid, ()))

    def resolve(self, text: str | int) -> int | None:
        """The integer id ``text`` names: digits or a body id by themselves, else a kept
        alias; ``None`` if none."""
        if isinstance(text, str):
            with self._lock:
                rid = self._ids.get(text)
            if rid is not None and not text.isdigit():
                return rid
        return parse_request_id(text)

    def export(self, rids: Iterable[int]) -> list[list[Any]]:
        """``[[rid, [name, ...]], ...]`` for those of ``rids`` that have names, oldest
        first (a checkpoint keeps the names of the turns it carries)."""
        want = set(rids)
        with self._lock:
            return [[rid, list(names)] for rid, names in self._names.items()
                    if rid in want and names]

    def restore(self, items: Iterable[Sequence[Any]]) -> int:
        """Put back what :meth:`export` gave (a restored scheduler's turns answer to their
        names again); how many turns came back named.

        Raises:
            ValueError: an item that is not ``[rid, [name, ...]]``.
        """
        n = 0
        for item in items:
            rid, names = item
            if not isinstance(names, list) or not all(isinstance(x, str) for x in names):
                raise ValueError(f"aliases of request {rid!r} are not a list of names")
            self.add(int(rid), names)
            n += 1
        return n
