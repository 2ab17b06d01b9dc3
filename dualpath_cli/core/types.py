"""Engine snapshots and requests: the inputs every scheduling policy reads.

Units: every quantity the scheduler compares is in **tokens**. ``read_q`` is the number of
tokens queued for reading on the engine's node storage NIC (the paper's read_q, compared
with alpha in tokens); ``hbm_free`` is the KV capacity left in the engine's HBM, in tokens.
Converting bytes or seconds to tokens happens once, in config resolution.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from dualpath_cli.core.frozen import by_fields

__all__ = ["Role", "ReadSide", "EngineSnapshot", "Request"]


class Role(str, Enum):
    """Engine role in PD disaggregation."""

    PREFILL = "prefill"
    DECODE = "decode"


class ReadSide(str, Enum):
    """Which node's storage NIC reads a request's cached KV."""

    PE = "pe"  # PE read path: storage -> PE buffer
    DE = "de"  # DE read path: storage -> DE buffer -> compute network -> PE


@dataclass(slots=True)
class EngineSnapshot:
    """What an engine reports on each fetch (paper 6.1), plus identity and health.

    Mutable on purpose: a policy works on its own copy and updates ``tok``/``seq``/``hbm_free``
    after each assignment, exactly as the paper's algorithms do.
    """

    engine_id: int
    node: int
    group: int
    role: Role
    seq: int = 0          # unfinished requests assigned to this engine
    tok: int = 0          # total tokens of those requests
    read_q: int = 0       # tokens queued for reading on this engine's node
    hbm_free: int = 0     # free KV capacity in tokens (decode engines)
    healthy: bool = True

    def copy(self) -> EngineSnapshot:
        """A shallow copy a policy may mutate without touching the caller's view."""
        return EngineSnapshot(self.engine_id, self.node, self.group, self.role, self.seq,
                              self.tok, self.read_q, self.hbm_free, self.healthy)


@dataclass(frozen=True, slots=True)
class Request:
    """One agent turn waiting to be scheduled.

    ``length`` is the full prompt length len_r (cached + new tokens); ``cached`` is the
    prefix found in storage, the part some node must read.
    """

    request_id: int
    length: int
    cached: int = 0

    @property
    def new_tokens(self) -> int:
        """Tokens to prefill (the miss part)."""
        return self.length - self.cached

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return by_fields(self)  # a compiled frozen class pickles by its constructor
