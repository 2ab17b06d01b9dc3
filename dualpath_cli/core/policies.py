"""The one policy table, and one full decision for a request, shared by runtime and sim.

A policy is a row of :data:`POLICIES`: its name, its read rule (the ``plan`` function: which
side reads a request's cached KV), whether prefill is layerwise, whether the NICs are shaped
(``False``: I/O costs nothing, the oracle) and a description. The runtime (``--policy``),
the simulator, config's ``scheduler.read_side``, ``PATCH /api/v1/scheduler`` and the plugin
hook all read this table; a plugin's read-path policy is added to it by
:func:`register_policy` (``plugins.manager.load_policies``), so it is selectable everywhere
a built-in one is. Every policy selects engines the same way (PE: paper Algorithm 1 in
:mod:`.pe_fetch`; DE: the two phases in :mod:`.de_schedule`), so a comparison between
policies isolates the loading mechanism and the read path:

=============  ============  =========  ======  ===========================================
name           read rule     layerwise  shaped  meaning
=============  ============  =========  ======  ===========================================
``basic``      basic         no         yes     PE-side reads, whole-prompt KV (paper Basic)
``layerwise``  basic         yes        yes     Basic + layerwise prefill (ablation step)
``round-robin`` round-robin  yes        yes     alternate PE, DE by decision ordinal
``dualpath``   dualpath      yes        yes     the side with the shorter read queue (6.4)
``random``     random        yes        yes     PE or DE from a hash of (seed, request id)
``split``      split         yes        yes     both sides, blocks divided so both queues
                                                drain together (the paper's future work)
``seed-select`` seed-select  yes        yes     the seed's ``select_loading_path``: PE if
                                                healthy (read_q <= alpha, tok <= beta), else
                                                DE if healthy, else :class:`NoAvailableEngine`
``oracle``     basic         yes        no      no I/O cost: unshaped NICs (runtime), no
                                                reads or transfers modelled (simulator)
=============  ============  =========  ======  ===========================================

``dual-rr`` (the simulator's old name of round robin) is kept as a deprecated alias.

A runtime or simulator calls the fetch-level functions (:func:`pe_fetch`, :func:`de_route`,
:func:`de_place`) when groups fetch and :func:`read_plan` once a request has both engines;
:func:`decide` chains all of them for one request.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from dualpath_cli.core.de_schedule import DEFAULT_Z_FACTOR, GroupLoads, de_place, de_route
from dualpath_cli.core.frozen import by_fields
from dualpath_cli.core.pe_fetch import pe_fetch
from dualpath_cli.core.read_side import (
    DEFAULT_BLOCK_TOKENS,
    SplitRead,
    choose_read_side,
    split_read,
)
from dualpath_cli.core.types import EngineSnapshot, ReadSide, Request
from dualpath_cli.errors import NoAvailableEngine, UsageError, pick

__all__ = [
    "SchedParams",
    "ReadPlan",
    "Policy",
    "POLICIES",
    "BUILTIN_POLICIES",
    "ALIASES",
    "get_policy",
    "register_policy",
    "unregister_policy",
    "read_plan",
    "charge_read",
    "Decision",
    "DecisionResult",
    "decide",
    "random_side",
]


@dataclass(frozen=True, slots=True)
class SchedParams:
    """Resolved scheduler parameters, all in tokens (rates in tokens per second)."""

    alpha: int
    beta: int
    z_factor: float = DEFAULT_Z_FACTOR
    block_tokens: int = DEFAULT_BLOCK_TOKENS
    pe_read_rate: float = 1.0
    de_read_rate: float = 1.0
    seed: int = 0

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return by_fields(self)  # a compiled frozen class pickles by its constructor


@dataclass(frozen=True, slots=True)
class ReadPlan:
    """How a request's cached tokens are read: by one side, or split (``side`` is None)."""

    side: ReadSide | None
    pe_tokens: int
    de_tokens: int
    split: SplitRead | None = None

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return by_fields(self)  # a compiled frozen class pickles by its constructor


PlanFn = Callable[[Request, EngineSnapshot, EngineSnapshot, SchedParams, int], ReadPlan]


@dataclass(frozen=True, slots=True)
class Policy:
    """One row of the policy table; ``plan(request, pe, de, params, ordinal)`` gives the plan.

    Attributes:
        name: what users select it by (``--policy``, ``scheduler.read_side``).
        description: one line for tables and ``plugins list``.
        plan: the read rule.
        layerwise: prefill streams KV layer by layer (False: every layer's KV first).
        shaped: the NICs are shaped (False: I/O costs nothing, the oracle).
        rule: the read rule's name when another policy's rule is reused ("" = ``name``).
    """

    name: str
    description: str
    plan: PlanFn
    layerwise: bool = True
    shaped: bool = True
    rule: str = ""

    @property
    def read_rule(self) -> str:
        """The read rule's name (``basic`` for ``layerwise`` and ``oracle``)."""
        return self.rule or self.name

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return by_fields(self)  # a compiled frozen class pickles by its constructor


def _whole(side: ReadSide, cached: int) -> ReadPlan:
    return ReadPlan(side, cached, 0) if side is ReadSide.PE else ReadPlan(side, 0, cached)


def _plan_dualpath(r: Request, pe: EngineSnapshot, de: EngineSnapshot, p: SchedParams,
                   i: int) -> ReadPlan:
    c = r.cached
    if choose_read_side(pe.read_q, de.read_q) is ReadSide.PE:
        return ReadPlan(ReadSide.PE, c, 0)
    return ReadPlan(ReadSide.DE, 0, c)


def _plan_basic(r: Request, pe: EngineSnapshot, de: EngineSnapshot, p: SchedParams,
                i: int) -> ReadPlan:
    return ReadPlan(ReadSide.PE, r.cached, 0)


def _plan_round_robin(r: Request, pe: EngineSnapshot, de: EngineSnapshot, p: SchedParams,
                      i: int) -> ReadPlan:
    return _whole(ReadSide.PE if i % 2 == 0 else ReadSide.DE, r.cached)


_MASK = (1 << 64) - 1


def random_side(seed: int, request_id: int) -> ReadSide:
    """PE or DE from splitmix64(seed, request_id): seeded, and the same in any order."""
    z = (seed * 0x9E3779B97F4A7C15 + request_id + 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    z ^= z >> 31
    return ReadSide.PE if z & 1 == 0 else ReadSide.DE


def _plan_random(r: Request, pe: EngineSnapshot, de: EngineSnapshot, p: SchedParams,
                 i: int) -> ReadPlan:
    return _whole(random_side(p.seed, r.request_id), r.cached)


def _plan_split(r: Request, pe: EngineSnapshot, de: EngineSnapshot, p: SchedParams,
                i: int) -> ReadPlan:
    s = split_read(r.cached, pe.read_q, de.read_q, pe_rate=p.pe_read_rate,
                   de_rate=p.de_read_rate, block_tokens=p.block_tokens)
    return ReadPlan(None, s.pe_tokens, s.de_tokens, s)


def _ok(e: EngineSnapshot, p: SchedParams) -> bool:
    return e.healthy and e.read_q <= p.alpha and e.tok <= p.beta


def _plan_seed(r: Request, pe: EngineSnapshot, de: EngineSnapshot, p: SchedParams,
               i: int) -> ReadPlan:
    if _ok(pe, p):
        return ReadPlan(ReadSide.PE, r.cached, 0)
    if _ok(de, p):
        return ReadPlan(ReadSide.DE, 0, r.cached)
    raise NoAvailableEngine(
        f"request {r.request_id}: neither PE {pe.engine_id} nor DE {de.engine_id} is healthy "
        f"(read_q <= alpha {p.alpha} and tok <= beta {p.beta})")


_BUILTIN: tuple[Policy, ...] = (
    Policy("basic", "PE-side reads, no layerwise prefill (the paper's Basic)", _plan_basic,
           layerwise=False),
    Policy("layerwise", "Basic + layerwise prefill (the ablation's second step)", _plan_basic,
           rule="basic"),
    Policy("round-robin", "alternate PE and DE reads by decision ordinal", _plan_round_robin),
    Policy("dualpath", "read on the side with the shorter read queue (paper 6.4)",
           _plan_dualpath),
    Policy("random", "PE or DE from a seeded hash of the request id", _plan_random),
    Policy("split", "split the blocks so both read queues drain together", _plan_split),
    Policy("seed-select", "the seed's select_loading_path: healthy PE, else healthy DE",
           _plan_seed),
    Policy("oracle", "no I/O cost: unshaped NICs (runtime), no reads modelled (simulator)",
           _plan_basic, shaped=False, rule="basic"),
)

BUILTIN_POLICIES: Mapping[str, Policy] = MappingProxyType({p.name: p for p in _BUILTIN})
"""The built-in rows, in the paper's ablation order (read-only)."""

POLICIES: dict[str, Policy] = dict(BUILTIN_POLICIES)
"""The policy table: the built-in rows plus those plugins registered (:func:`register_policy`)."""

ALIASES: Mapping[str, str] = MappingProxyType({"dual-rr": "round-robin"})
"""Deprecated names still accepted, and the policy each means."""


def get_policy(name: str) -> Policy:
    """The policy called ``name`` (a deprecated alias warns); a :class:`UsageError` naming
    the choices otherwise."""
    if name in ALIASES and name not in POLICIES:
        warnings.warn(f"policy name {name!r} is deprecated; use {ALIASES[name]!r}",
                      DeprecationWarning, stacklevel=2)
        name = ALIASES[name]
    return pick(POLICIES, name, "scheduling policy")


def register_policy(policy: Policy) -> None:
    """Add a plugin's policy to the table (registering the same object again is a no-op).

    Raises:
        UsageError: the name is taken by another policy or is a deprecated alias.
    """
    if not isinstance(policy, Policy):
        raise UsageError(f"a registered policy must be a core Policy, got {policy!r}")
    have = POLICIES.get(policy.name)
    if have is policy:
        return
    if have is not None or policy.name in ALIASES:
        raise UsageError(f"policy {policy.name!r} is already in the policy table")
    POLICIES[policy.name] = policy


def unregister_policy(name: str) -> None:
    """Remove a plugin's policy (built-in rows stay). For tests and plugin reloads."""
    if name not in BUILTIN_POLICIES:
        POLICIES.pop(name, None)


def read_plan(policy: Policy, request: Request, pe: EngineSnapshot, de: EngineSnapshot,
              params: SchedParams, ordinal: int = 0) -> ReadPlan:
    """The read plan ``policy`` gives ``request`` once its PE and DE are known."""
    return policy.plan(request, pe, de, params, ordinal)


def charge_read(engines: Sequence[EngineSnapshot], node: int, tokens: int) -> None:
    """Add ``tokens`` to the read queue of every snapshot on ``node`` (they share its NIC)."""
    if tokens:
        for e in engines:
            if e.node == node:
                e.read_q += tokens


@dataclass(frozen=True, slots=True)
class Decision:
    """One request's full decision with the inputs it was made from, for logging.

    ``pe_read_q``/``de_read_q`` are the read queues the plan saw; ``z`` the DE threshold.
    """

    request_id: int
    pe_engine: int
    de_group: int
    de_engine: int
    plan: ReadPlan
    pe_read_q: int
    de_read_q: int
    z: float

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return by_fields(self)  # a compiled frozen class pickles by its constructor


@dataclass(frozen=True, slots=True)
class DecisionResult:
    """A decision and the state after it (inputs are never modified)."""

    decision: Decision
    pe_engines: tuple[EngineSnapshot, ...]
    de_engines: tuple[EngineSnapshot, ...]
    loads: GroupLoads

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return by_fields(self)  # a compiled frozen class pickles by its constructor


def decide(policy: Policy, request: Request, pe_engines: Sequence[EngineSnapshot],
           de_groups: Mapping[int, Sequence[EngineSnapshot]], loads: GroupLoads,
           params: SchedParams, ordinal: int = 0) -> DecisionResult:
    """Schedule one request end to end: PE fetch, DE phase 1 and 2, read plan, read queues.

    ``pe_engines`` is the fetching PE group; ``de_groups`` maps group id to its DEs and
    ``loads`` holds the groups' phase-1 loads. The chosen nodes' read queues grow by the
    tokens they will read.

    Raises:
        NoAvailableEngine: every PE is overloaded, the chosen DE group has no HBM for it, or
            (``seed-select``) neither side is healthy. The request should stay queued.
    """
    pe_res = pe_fetch((request,), pe_engines, params.alpha, params.beta)
    if not pe_res.assignments:
        raise NoAvailableEngine(f"request {request.request_id}: every PE of the group is "
                                f"overloaded (tok > beta {params.beta}) or unhealthy")
    route = de_route((request,), loads)
    group = route.assignments[0][1]
    de_res = de_place((request,), de_groups[group], params.z_factor)
    if not de_res.assignments:
        raise NoAvailableEngine(f"request {request.request_id}: no DE in group {group} has "
                                f"{request.length} tokens of free HBM")
    pe_id = pe_res.assignments[0][1]
    de_id = de_res.assignments[0][1]
    pe = next(e for e in pe_res.engines if e.engine_id == pe_id)
    de = next(e for e in de_res.engines if e.engine_id == de_id)
    pe_q, de_q = pe.read_q, de.read_q
    plan = policy.plan(request, pe, de, params, ordinal)
    if pe.node == de.node:  # not in a PD-disaggregated layout, but keep the sum right
        charge_read(pe_res.engines, pe.node, plan.pe_tokens + plan.de_tokens)
        charge_read(de_res.engines, de.node, plan.pe_tokens + plan.de_tokens)
    else:
        charge_read(pe_res.engines, pe.node, plan.pe_tokens)
        charge_read(de_res.engines, de.node, plan.de_tokens)
    return DecisionResult(
        Decision(request.request_id, pe_id, group, de_id, plan, pe_q, de_q, de_res.z),
        pe_res.engines, de_res.engines, route.loads)
