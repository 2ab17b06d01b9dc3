"""Mutable simulation state: requests (turns), nodes and engines.

Plain ``__slots__`` classes rather than dataclasses with validation: these objects are
touched millions of times per run and only by the simulation (:mod:`dualpath_cli.sim.cluster`
and its stages).
"""

from __future__ import annotations

from collections import deque
from typing import Any

from dualpath_cli.core.quota import PrefillWork
from dualpath_cli.core.types import EngineSnapshot, Request, Role
from dualpath_cli.sim.links import FifoLink, Flow, SharedLink

__all__ = ["Req", "ReadJob", "Node", "PEngine", "DEngine", "Group"]


class Req:
    """One agent turn in flight."""

    __slots__ = ("rid", "agent", "turn", "length", "cached", "new", "gen", "core", "pe", "de",
                 "pending_reads", "t_arrive", "t_first", "t_join", "t_second", "done_new",
                 "buf_pe", "buf_de", "attended", "cum_end")

    def __init__(self, rid: int, agent: int, turn: int, cached: int, new: int, gen: int,
                 now: float) -> None:
        self.rid = rid
        self.agent = agent
        self.turn = turn
        self.cached = cached
        self.new = new
        self.gen = gen
        self.length = cached + new
        self.core = Request(rid, self.length, cached)
        self.pe: PEngine | None = None
        self.de: DEngine | None = None
        self.pending_reads = 0
        self.t_arrive = now
        self.t_first = 0.0
        self.t_join = 0.0
        self.t_second = 0.0
        self.done_new = 0
        self.buf_pe = 0.0   # bytes held in the PE node's DRAM buffer
        self.buf_de = 0.0   # bytes held in the DE node's DRAM buffer
        self.attended = 0   # tokens it attends per decode step (set when it joins a DE)
        self.cum_end = 0    # its DE group's routed tokens up to and including this request


class ReadJob:
    """Part (or all) of a request's cached KV read by one node's storage NIC."""

    __slots__ = ("req", "tokens", "nbytes", "engine", "start", "owned")

    def __init__(self, req: Req, tokens: int, nbytes: float, engine: PEngine | DEngine,
                 owned: tuple[int, ...] = ()) -> None:
        self.req = req
        self.tokens = tokens      # tokens this job reads itself (not those it joined)
        self.nbytes = nbytes
        self.engine = engine
        self.start = 0.0
        self.owned = owned        # chain ids whose reads this job carries (others may join)


class Node:
    """A machine: one storage NIC (read side fair-shared), a DRAM buffer, its engines."""

    __slots__ = ("idx", "role", "snic", "write", "read_q", "buffer_free", "engines", "bins",
                 "read_bytes", "blocked", "dram_bytes", "dram_bins")

    def __init__(self, idx: int, role: Role, snic_rate: float, buffer_bytes: float) -> None:
        self.idx = idx
        self.role = role
        self.snic = SharedLink(snic_rate)
        self.write = FifoLink(snic_rate)
        self.read_q = 0                  # tokens queued or in flight on this node's reads
        self.buffer_free = buffer_bytes
        self.engines: list[PEngine | DEngine] = []
        self.bins: dict[int, float] = {}  # time bin -> bytes read
        self.read_bytes = 0.0
        self.blocked = 0                 # engines whose next read waits for buffer space
        self.dram_bytes = 0.0            # bytes through its DRAM, written and read (KV only)
        self.dram_bins: dict[int, float] = {}  # time bin -> those bytes, at the event's time


class _Engine:
    __slots__ = ("idx", "node", "group", "snap", "rq", "reading", "cnic_in", "cnic_out",
                 "prefill", "blocked", "in_flight")

    def __init__(self, idx: int, node: Node, group: Group, role: Role, hbm_tokens: int,
                 cnic_rate: float) -> None:
        self.idx = idx
        self.node = node
        self.group = group
        self.prefill = role is Role.PREFILL
        self.blocked = False   # idle with a read queued that the DRAM buffer cannot take yet
        self.snap = EngineSnapshot(idx, node.idx, group.idx, role, hbm_free=hbm_tokens)
        self.rq: deque[ReadJob] = deque()
        self.reading: Flow | None = None
        # chain id -> [jobs reading it, first, last token it covers, the job reading it now,
        # that job's own tokens up to its end]: the blocks queued or in flight on this
        # engine's loader, which a later request joins instead of reading them again
        self.in_flight: dict[int, list[Any]] = {}
        self.cnic_in = FifoLink(cnic_rate)
        self.cnic_out = FifoLink(cnic_rate)


class PEngine(_Engine):
    """A prefill engine: its ready queue of prefill work and whether a batch runs."""

    __slots__ = ("ready", "busy", "busy_time", "batches")

    def __init__(self, idx: int, node: Node, group: Group, hbm_tokens: int,
                 cnic_rate: float) -> None:
        super().__init__(idx, node, group, Role.PREFILL, hbm_tokens, cnic_rate)
        self.ready: deque[PrefillWork] = deque()
        self.busy = False
        self.busy_time = 0.0
        self.batches = 0


class DEngine(_Engine):
    """A decode engine: a fluid decode batch advanced in virtual steps."""

    __slots__ = ("steps", "last", "step_s", "heap", "attended", "version", "busy_time",
                 "hbm_cap", "active")

    def __init__(self, idx: int, node: Node, group: Group, hbm_tokens: int,
                 cnic_rate: float) -> None:
        super().__init__(idx, node, group, Role.DECODE, hbm_tokens, cnic_rate)
        self.steps = 0.0          # decode steps completed so far (fractional)
        self.last = 0.0           # time ``steps`` was last brought up to date
        self.step_s = 0.0         # current step time (0 when idle)
        self.heap: list[tuple[float, int, Req]] = []   # (finish step, rid, req)
        self.attended = 0         # tokens attended per step over the batch
        self.version = 0
        self.busy_time = 0.0
        self.hbm_cap = hbm_tokens
        self.active = False       # has a batch (counted in the host-core contention model)


class Group:
    """An engine group (the engines of ``nodes``: one node, or several consecutive nodes of
    one role with ``cluster.nodes_per_group`` > 1): fetches together through its leader.

    ``snaps`` are the engines' own snapshots (core's in-place fetches update them), and
    ``tok``/``hbm_free`` are running totals over them (``hbm_free`` over healthy engines),
    kept up to date on every change so a DE drain or fetch never re-sums the group.
    ``routed`` counts every token ever routed to the private queue; each queued request keeps
    the count up to itself (``Req.cum_end``), so any head's total is one subtraction.
    ``node`` is the leader's (first) node; ``nodes`` pairs each node with its engines'
    snapshots, so a PE fetch gives every engine its own node's read queue (paper 6.2).
    """

    __slots__ = ("idx", "role", "node", "nodes", "engines", "snaps", "pending", "private",
                 "private_tokens", "idle", "tick_ph", "tok", "hbm_free", "routed")

    def __init__(self, idx: int, role: Role, node: Node) -> None:
        self.idx = idx
        self.role = role
        self.node = node
        self.nodes: list[tuple[Node, list[EngineSnapshot]]] = []
        self.engines: list = []
        self.snaps: list[EngineSnapshot] = []
        self.pending = False
        self.private: deque[Req] = deque()   # routed by phase 1, not yet placed
        self.private_tokens = 0
        self.idle = False
        self.tick_ph = 0.0      # the group's fetch phase within the period, in seconds
        self.tok = 0            # sum of the snapshots' tok
        self.hbm_free = 0       # sum of the healthy snapshots' hbm_free
        self.routed = 0         # tokens ever appended to ``private``
