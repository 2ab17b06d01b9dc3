"""The runtime's own global prefix hits on a request log, fast (issue 36 part 1).

Why: ``workload.mooncake.prefix_hits`` counts the hits of a log against one global store of
its hash ids, each request's ids stored the moment it arrives. The runtime must see the same
hits, and the only faithful witness is its scheduler's store-lookup counters
(``dualpath_kv_{requested,hit}_tokens_total{tier="store"}``,
``dualpath_kv_cross_conversation_hit_tokens_total``). Real engines compute every missed
token (91M of the public trace's 145M: hours here), and a replay in real time waits out the
log's hour; neither is needed to count hits.

What is real and what is emulated: the scheduler, its prefix hashing (the prompt's chained
block keys), its store lookups (``stat`` of the key's file in a real ``PosixStore``), its
ledger that counts them, the wire protocol and the sockets are the runtime's own. The engines
are emulated (``RuntimeOptions.engines = "emulated"``, ``runtime/emulated.py``): they take
their time from the cost model (``emulated_speed`` times faster than real time) and
persist a finished turn's full blocks as empty marker files at the paths the scheduler looks
up, keyed by the same chain (``core.layout.chain_keys`` under the system's namespace). A hit
is decided by the scheduler finding a key's file, never by the file's bytes or by how long
a turn took, so emulating the engines changes the timing, not the count.

The method: link the log (``trace convert``'s rule: each request is a turn of its
conversation, so the ledger tells hits within the conversation from hits across), then send
its requests one at a time in arrival order, each prompt the token ids its block chain names
(``workload.tokens.chain_token_ids``), each finished (its blocks stored) before the next is
sent: the independent count's store, in which a request sees every earlier one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from dualpath_cli.cluster.system import RuntimeSystem
from dualpath_cli.core.layout import token_ids
from dualpath_cli.runtime.options import RuntimeOptions
from dualpath_cli.runtime.turns import TurnRequest
from dualpath_cli.workload.mooncake import MooncakeRequest
from dualpath_cli.workload.mooncake_link import arrival_turns, link_requests
from dualpath_cli.workload.tokens import chain_token_ids

__all__ = ["StoreHits", "hits_options", "replay_store_hits", "runtime_store_hits"]

#: Token ids of the replayed prompts (the reference model's byte vocabulary).
VOCAB = 256


@dataclass(frozen=True)
class StoreHits:
    """The scheduler's store-lookup counters after a replay.

    Attributes:
        requests: requests sent (the log's first ones in arrival order).
        looked_tokens: prompt tokens looked up (``requested_tokens_total{tier="store"}``).
        hit_tokens: of those, found in the store (``hit_tokens_total{tier="store"}``).
        cross_tokens: hits beyond the conversation's own last stored chain.
        wall_s: seconds the replay took.
    """

    requests: int
    looked_tokens: int
    hit_tokens: int
    cross_tokens: int
    wall_s: float

    def to_dict(self) -> dict[str, float]:
        """Plain form (JSON)."""
        return asdict(self)


def hits_options(store_dir: Path, block_tokens: int = 64, speed: float = 1e4) -> RuntimeOptions:
    """A small emulated system for counting hits: one PE and one DE in one host process,
    a store under ``store_dir``; ``speed`` emulated seconds per real second."""
    return RuntimeOptions(prefill_nodes=1, decode_nodes=1, gpus_per_node=1,
                          block_tokens=block_tokens, engines="emulated",
                          emulated_model="ds27b", emulated_hosts=1, emulated_speed=speed,
                          store_dir=store_dir)


def replay_store_hits(system: RuntimeSystem, requests: Sequence[MooncakeRequest], *,
                      limit: int | None = None, timeout: float = 120.0,
                      on_request: Callable[[int], None] | None = None) -> StoreHits:
    """Send the log's requests (the first ``limit`` in arrival order) one at a time to a
    started ``system`` and read its scheduler's lookup counters (see the module).

    Raises:
        TimeoutError: a request did not finish within ``timeout`` seconds.
    """
    trace, _ = link_requests(requests)
    trajs = trace.trajectories
    bt = trace.header.block_tokens
    order = arrival_turns(requests)[:limit]
    t0 = time.monotonic()
    for n, (agent, turn) in enumerate(order):
        traj = trajs[agent]
        prompt = token_ids(chain_token_ids(traj, turn, bt, VOCAB))
        system.submit(TurnRequest(agent, turn, prompt, traj.turns[turn].gen)).wait(timeout)
        if on_request:
            on_request(n + 1)
    reg = system.scheduler.registry
    return StoreHits(len(order),
                     int(reg.value("dualpath_kv_requested_tokens_total", tier="store")),
                     int(reg.value("dualpath_kv_hit_tokens_total", tier="store")),
                     int(reg.value("dualpath_kv_cross_conversation_hit_tokens_total")),
                     round(time.monotonic() - t0, 1))


def runtime_store_hits(requests: Sequence[MooncakeRequest], store_dir: Path, *,
                       limit: int | None = None, block_tokens: int = 64,
                       on_request: Callable[[int], None] | None = None) -> StoreHits:
    """:func:`replay_store_hits` on a fresh emulated system over an empty ``store_dir``."""
    with RuntimeSystem(hits_options(store_dir, block_tokens)) as system:
        return replay_store_hits(system, requests, limit=limit, on_request=on_request)
