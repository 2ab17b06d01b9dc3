"""Named scheduling policies, and one full decision for a request, shared by runtime and sim.

Every policy selects engines the same way (PE: paper Algorithm 1 in :mod:`.pe_fetch`; DE: the
two phases in :mod:`.de_schedule`) and differs only in how the cached KV is read, so a
comparison between policies isolates the read path:

=============  ==============================================================================
``dualpath``   the side with the shorter read queue (paper 6.4)
``basic``      always the PE side (PE-only reads, the paper's Basic)
``round-robin`` alternates PE, DE, PE, ... by the decision's ordinal (the ablation's path rule)
``random``     PE or DE from a hash of (seed, request_id): reproducible and order-independent
``split``      both sides, blocks divided so both queues drain together (paper's future work)
``seed-select`` the seed's ``select_loading_path``: PE if the PE is healthy (read_q <= alpha,
               tok <= beta), else DE if the DE is, else :class:`NoAvailableEngine`
=============  ==============================================================================

A runtime or simulator calls the fetch-level functions (:func:`pe_fetch`, :func:`de_route`,
:func:`de_place`) when groups fetch and :func:`read_plan` once a request has both engines;
:func:`decide` chains all of them for one request.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from dualpath_cli.core.de_schedule import DEFAULT_Z_FACTOR, GroupLoads, de_place, de_route
from dualpath_cli.core.pe_fetch import pe_fetch
from dualpath_cli.core.read_side import (
    DEFAULT_BLOCK_TOKENS,
    SplitRead,
    choose_read_side,
    split_read,
)
from dualpath_cli.core.types import EngineSnapshot, ReadSide, Request
from dualpath_cli.errors import NoAvailableEngine, pick

__all__ = [
    "SchedParams",
    "ReadPlan",
    "Policy",
    "POLICIES",
    "get_policy",
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


@dataclass(frozen=True, slots=True)
class ReadPlan:
    """How a request's cached tokens are read: by one side, or split (``side`` is None)."""

    side: ReadSide | None
    pe_tokens: int
    de_tokens: int
    split: SplitRead | None = None


PlanFn = Callable[[Request, EngineSnapshot, EngineSnapshot, SchedParams, int], ReadPlan]


@dataclass(frozen=True, slots=True)
class Policy:
    """A named read-path rule; ``plan(request, pe, de, params, ordinal)`` gives the plan."""

    name: str
    description: str
    plan: PlanFn


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


POLICIES: dict[str, Policy] = {p.name: p for p in (
    Policy("dualpath", "read on the side with the shorter read queue (paper 6.4)",
           _plan_dualpath),
    Policy("basic", "always read on the PE side (PE-only loading)", _plan_basic),
    Policy("round-robin", "alternate PE and DE reads by decision ordinal", _plan_round_robin),
    Policy("random", "PE or DE from a seeded hash of the request id", _plan_random),
    Policy("split", "split the blocks so both read queues drain together", _plan_split),
    Policy("seed-select", "the seed's select_loading_path: healthy PE, else healthy DE",
           _plan_seed),
)}


def get_policy(name: str) -> Policy:
    """The policy called ``name``; a :class:`UsageError` naming the choices otherwise."""
    return pick(POLICIES, name, "scheduling policy")


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


@dataclass(frozen=True, slots=True)
class DecisionResult:
    """A decision and the state after it (inputs are never modified)."""

    decision: Decision
    pe_engines: tuple[EngineSnapshot, ...]
    de_engines: tuple[EngineSnapshot, ...]
    loads: GroupLoads


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
