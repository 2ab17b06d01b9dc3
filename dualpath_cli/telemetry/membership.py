"""Membership: which nodes and engines serve now, beside what was configured.

Why one record: ``status``, ``/readyz``, ``/api/v1/status``, ``/metrics``, the monitor, top
and diagnose all answer "what serves?"; each used to count engines its own way (a left
node counted as healthy, a joined node named by its index). They all read this record,
which the scheduler's engine table derives (plain data, so a recording or a client has it
without the runtime).

Node states: ``joining`` (its engines have not all said hello), ``serving``, ``draining``
(it is leaving, ``DELETE /api/v1/join/NAME`` or its agent's Ctrl-C: it finishes its turns and
takes no new ones; or the whole cluster stops), ``left`` (it left on purpose, or was removed;
``said_hello`` False when that was before its first hello), ``dead`` (its engines exited or
fell silent).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["NODE_STATES", "NodeMember", "RoleGap", "Membership", "membership_from_dict",
           "node_state", "shape"]

#: A node's states, as the scheduler's record says them.
NODE_STATES: tuple[str, ...] = ("joining", "serving", "draining", "left", "dead")
#: The roles a cluster needs one serving engine of each to finish a turn.
ROLES: tuple[str, ...] = ("prefill", "decode")


@dataclass(frozen=True, slots=True)
class NodeMember:
    """One node under the operator's name (``--node D0``; ``P0``/``D0`` in a launch)."""

    name: str
    node: int
    role: str
    state: str
    engines: int
    serving: int
    said_hello: bool = True
    restarts: int = 0  # its engines' restarts by the launcher (cluster.restart)
    crash_loop: bool = False  # an engine died too often and is left down
    down_since: float | None = None  # wall clock of its engine's death, until it serves again
    restarting: bool = False  # the launcher restarts its dead engine (due, or no hello yet)


@dataclass(frozen=True, slots=True)
class RoleGap:
    """A role with no serving engine: since when (wall clock) and why (``D0 left``)."""

    role: str
    since: float
    why: str

    def line(self) -> str:
        """``no decode engine since 03:12:07 (D0 left)``."""
        at = time.strftime("%H:%M:%S", time.localtime(self.since))
        return f"no {self.role} engine since {at}" + (f" ({self.why})" if self.why else "")


@dataclass(frozen=True, slots=True)
class Membership:
    """What serves now (``serving``, e.g. ``1P0D``) beside what was configured (``of``),
    each node's state, and the roles with no serving engine (``missing``)."""

    serving: str
    of: str
    nodes: tuple[NodeMember, ...] = ()
    missing: tuple[RoleGap, ...] = ()
    engines: dict[str, dict[str, int]] = field(default_factory=dict)  # role -> state -> n

    @property
    def complete(self) -> bool:
        """Every role has a serving engine."""
        return not self.missing

    def missing_line(self) -> str:
        """The missing roles in one line (empty when none)."""
        return "; ".join(g.line() for g in self.missing)

    def leaving(self) -> tuple[NodeMember, ...]:
        """The nodes leaving or gone on purpose (``draining``, or ``left`` after serving)
        whose name has not joined again: what serves is less than what was configured
        because an operator stopped them (a death is ``dead``, not here)."""
        back = {n.name for n in self.nodes if n.state in ("joining", "serving")}
        return tuple(n for n in self.nodes if n.name not in back and (
            n.state == "draining" or (n.state == "left" and n.said_hello)))

    def name_of(self, node: int) -> str | None:
        """The operator's name of node index ``node`` (None: not known)."""
        for n in self.nodes:
            if n.node == node:
                return n.name
        return None


def shape(counts: dict[str, int]) -> str:
    """``1P2D`` from nodes by role."""
    return f"{counts.get('prefill', 0)}P{counts.get('decode', 0)}D"


def node_state(engine_states: list[str], said: bool, *,
               draining: bool = False) -> tuple[str, bool]:
    """A node's state from its engines' (``starting``/``ready``/``draining``/``dead``/
    ``left``) and whether any of them said hello."""
    if any(s == "ready" for s in engine_states):
        return ("draining" if draining else "serving"), True
    if any(s == "draining" for s in engine_states):
        return "draining", True
    if engine_states and all(s == "left" for s in engine_states):
        return "left", said
    if any(s == "dead" for s in engine_states):
        return "dead", True
    return "joining", said


def membership_from_dict(data: dict[str, Any] | None) -> Membership | None:
    """A :class:`Membership` from its JSON form (None stays None: an older recording)."""
    if not data:
        return None
    return Membership(
        serving=str(data.get("serving", "")), of=str(data.get("of", "")),
        nodes=tuple(NodeMember(**{k: v for k, v in n.items()
                                  if k in NodeMember.__dataclass_fields__})
                    for n in data.get("nodes", ())),
        missing=tuple(RoleGap(str(g["role"]), float(g["since"]), str(g.get("why", "")))
                      for g in data.get("missing", ())),
        engines={str(r): {str(s): int(n) for s, n in by.items()}
                 for r, by in (data.get("engines") or {}).items()})


def build_membership(engines: list[tuple[str, int, str, str, bool]],
                     configured: dict[str, int],
                     gaps: dict[str, tuple[float, str]], *,
                     draining: bool = False,
                     supervision: dict[int, tuple[int, bool]] | None = None,
                     down: dict[int, tuple[float, bool]] | None = None) -> Membership:
    """The record from each engine's ``(node name, node index, role, state, said hello)``,
    the nodes
    configured by role (a launch's ``--pd``; for joined nodes, the names that joined and
    did not leave before their hello) and the scheduler's open gaps by role;
    ``supervision``: per node index, its engines' restarts and whether one crash-loops;
    ``down``: per node index whose engine died and does not serve again yet, since when
    (wall clock) and whether the launcher is restarting it."""
    by_node: dict[int, list[tuple[str, int, str, str, bool]]] = {}
    for row in engines:
        by_node.setdefault(row[1], []).append(row)
    nodes = []
    serving: dict[str, int] = {}
    counts: dict[str, dict[str, int]] = {r: {} for r in ROLES}
    for node in sorted(by_node):
        rows = by_node[node]
        name, _, role = rows[0][:3]
        states = [r[3] for r in rows]
        for s in states:
            counts.setdefault(role, {})[s] = counts.setdefault(role, {}).get(s, 0) + 1
        state, said = node_state(states, any(r[4] for r in rows), draining=draining)
        restarts, loop = (supervision or {}).get(node, (0, False))
        since, restarting = (down or {}).get(node, (None, False))
        nodes.append(NodeMember(name, node, role, state, len(rows),
                                sum(1 for s in states if s == "ready"), said, restarts, loop,
                                since, restarting))
        if state in ("serving", "draining"):
            serving[role] = serving.get(role, 0) + 1
    missing = tuple(RoleGap(role, *gaps[role]) for role in ROLES
                    if not serving.get(role) and role in gaps)
    return Membership(shape(serving), shape(configured), tuple(nodes), missing, counts)
