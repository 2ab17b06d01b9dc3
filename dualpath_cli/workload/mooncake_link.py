"""Link a Mooncake request log into agent trajectories (``dualpath trace convert``).

Why: operators have request logs (Mooncake's format: timestamp, lengths, block hash ids), not
agent trajectories; the simulator and the bench replay trajectories. A request that carries
another request's whole context forward is that conversation's next turn.

The linking rule, exactly:

1. Requests are taken in arrival order (``timestamp``, ties in file order).
2. A request's *context key* is the id of its last **full** 512-token block
   (``hash_ids[input_length // 512 - 1]``; a request shorter than one block has none). Ids
   are chained, so equal ids mean equal prefixes: the key names the request's whole
   full-block prefix.
3. Request ``R`` continues the open trajectory whose last request ``P`` has a context key
   equal to ``R.hash_ids[k]`` for the largest such ``k`` (``R`` starts with every full block
   of ``P``), provided ``R.input_length > P.input_length``. Ties (two trajectories ending
   with the same key: two conversations forked from one prompt) go to the most recent.
   Otherwise ``R`` starts a new trajectory. A shared system prompt therefore links nothing
   by itself: ``R`` must extend the previous request's *whole* prefix.
4. Every turn keeps its request's ``hash_ids`` as its ``blocks`` chain, and each trajectory
   its first request's arrival (``start_s``, seconds after the log's first request): a replay
   derives each block's token ids from its id, so a global store hits what the log's store
   held, within a conversation and across conversations at any depth
   (``workload.prefix_store``). The counts still say how many trajectories open with a
   prefix (leading full blocks) that another trajectory's first request opens with too.
5. Turn ``i`` of a trajectory appends ``input_length_i - (input_length_{i-1} +
   output_length_{i-1})`` tokens (at least 1: a request that dropped some of the previous
   answer is counted as appending one token) and generates ``output_length_i``
   (at least 1, as a turn must).

Counts say what happened (requests linked, trajectories, single-turn ones, clamped appends).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from dualpath_cli.workload.mooncake import MOONCAKE_BLOCK_TOKENS, MooncakeRequest
from dualpath_cli.workload.tokens import MAX_SEED
from dualpath_cli.workload.trace_format import Trace, TraceHeader
from dualpath_cli.workload.trajectory import Trajectory, Turn

__all__ = ["LinkCounts", "link_requests", "read_agent_trace", "hit_split", "arrival_turns",
           "LINK_RULE"]

LINK_RULE = ("a request continues the conversation whose last request's full-block prefix "
             "(its last full 512-token block id) it starts with and whose input it extends; "
             "ties to the most recent; otherwise it starts a new one")


@dataclass(frozen=True, slots=True)
class LinkCounts:
    """What linking did."""

    requests: int
    trajectories: int
    linked: int            # requests that continued a trajectory
    single_turn: int       # trajectories of one request
    max_turns: int
    clamped_appends: int   # turns whose computed append was < 1
    zero_outputs: int      # requests with output_length 0 (generate 1)
    max_len: int
    shared_prefix_trajectories: int = 0  # trajectories opening with a shared prefix
    shared_prefix_tokens: int = 0        # tokens of those prefixes, summed

    def to_dict(self) -> dict[str, int]:
        """Plain form (``--json``)."""
        return asdict(self)


def link_requests(requests: Sequence[MooncakeRequest], source: str = "mooncake"
                  ) -> tuple[Trace, LinkCounts]:
    """Agent trajectories from Mooncake requests by the module's linking rule."""
    chains, linked = _chains(requests)
    trajectories = []
    clamped = zero = 0
    longest = 1
    opening: dict[int, int] = {}  # full-block id -> first requests it opens
    for c in chains:
        for h in set(_full_ids(c[0])):
            opening[h] = opening.get(h, 0) + 1
    with_shared = shared_tokens = 0
    t0 = min((r.timestamp_ms for r in requests), default=0.0)
    for agent, requests_of in enumerate(chains):
        turns = []
        ctx = 0
        for r in requests_of:
            append = r.input_length - ctx
            if append < 1:
                clamped += 1
                append = 1
            gen = r.output_length
            if gen < 1:
                zero += 1
                gen = 1
            turns.append(Turn(append, gen))
            ctx += append + gen
        longest = max(longest, ctx)
        opens = 0
        for h in _full_ids(requests_of[0]):
            if opening.get(h, 0) < 2:
                break
            opens += 1
        if opens:
            with_shared += 1
            shared_tokens += opens * MOONCAKE_BLOCK_TOKENS
        start_s = round((requests_of[0].timestamp_ms - t0) / 1000.0, 6)
        trajectories.append(Trajectory(
            agent_id=agent, turns=tuple(turns), token_seed=agent, start_s=start_s,
            blocks=tuple(tuple(h % (MAX_SEED + 1) for h in r.hash_ids) for r in requests_of)))
    header = TraceHeader(max_len=longest, generator={
        "from": f"dualpath trace convert {source}", "rule": LINK_RULE})
    counts = LinkCounts(len(requests), len(chains), linked,
                        sum(1 for c in chains if len(c) == 1),
                        max((len(c) for c in chains), default=0), clamped, zero, longest,
                        with_shared, shared_tokens)
    return Trace(header, tuple(trajectories)), counts


def _chains(requests: Sequence[MooncakeRequest]) -> tuple[list[list[MooncakeRequest]], int]:
    """The conversations (requests in order) by the linking rule, and how many requests
    continued one."""
    order = sorted(range(len(requests)), key=lambda i: requests[i].timestamp_ms)
    chains: list[list[MooncakeRequest]] = []
    open_by_key: dict[int, int] = {}  # context key -> index of the chain ending with it
    linked = 0
    for i in order:
        r = requests[i]
        chain = None
        for k in range(len(r.hash_ids) - 1, -1, -1):
            c = open_by_key.get(r.hash_ids[k])
            if c is not None and r.input_length > chains[c][-1].input_length \
                    and _key(chains[c][-1]) == r.hash_ids[k]:
                chain = c
                break
        if chain is None:
            chains.append([r])
            chain = len(chains) - 1
        else:
            old = _key(chains[chain][-1])
            if old is not None and open_by_key.get(old) == chain:
                del open_by_key[old]
            chains[chain].append(r)
            linked += 1
        key = _key(r)
        if key is not None:
            open_by_key[key] = chain  # the most recent wins a tie
    return chains, linked


def hit_split(requests: Sequence[MooncakeRequest]) -> tuple[int, int]:
    """Hit tokens of an unbounded prefix cache (``mooncake.prefix_hits``) and how many of
    them are cross-conversation: beyond the full blocks of the previous request of the
    request's own conversation (a shared system prompt, a fork of another one)."""
    from dualpath_cli.workload.mooncake import prefix_hits

    hits = prefix_hits(requests)
    hit_of = {id(r): h for r, h in zip(requests, hits, strict=True)}
    cross = 0
    for chain in _chains(requests)[0]:
        own = 0
        for r in chain:
            h = hit_of[id(r)]
            cross += max(0, h - own)
            own = len(_full_ids(r)) * MOONCAKE_BLOCK_TOKENS
    return sum(hits), cross


def arrival_turns(requests: Sequence[MooncakeRequest]) -> list[tuple[int, int]]:
    """``(agent, turn)`` of each request in arrival order: where :func:`link_requests` put
    it (agent ids are trajectory indices).

    Why: a replay that sends the log's requests one at a time in arrival order (the global
    store of ``mooncake.prefix_hits``) needs each one's turn of the linked trace.
    """
    chains, _ = _chains(requests)
    where = {id(r): (agent, turn) for agent, chain in enumerate(chains)
             for turn, r in enumerate(chain)}
    order = sorted(range(len(requests)), key=lambda i: requests[i].timestamp_ms)
    return [where[id(requests[i])] for i in order]


def _full_ids(r: MooncakeRequest) -> tuple[int, ...]:
    """The ids of the request's full 512-token blocks."""
    return r.hash_ids[:min(r.input_length // MOONCAKE_BLOCK_TOKENS, len(r.hash_ids))]


def _key(r: MooncakeRequest) -> int | None:
    full = min(r.input_length // MOONCAKE_BLOCK_TOKENS, len(r.hash_ids))
    return r.hash_ids[full - 1] if full >= 1 else None


def read_agent_trace(path: str | os.PathLike[str]) -> tuple[Trace, LinkCounts | None]:
    """A trace of agent trajectories from a dualpath trace file, or from a Mooncake request
    log linked by the module's rule (its counts; ``None`` for a dualpath trace).

    Why here: ``sim``, ``bench --trace`` and the twin take either file as operators have it.

    Raises:
        TraceError: an unreadable or invalid file (``FILE:LINE: reason``).
    """
    from dualpath_cli.workload.trace_io import detect_format, read_mooncake, read_trace

    if detect_format(path) == "mooncake":
        return link_requests(read_mooncake(path), os.fspath(path))
    return read_trace(path), None
