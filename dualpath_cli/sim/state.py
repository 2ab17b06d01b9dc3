"""Mutable simulation state: requests (turns), nodes and engines.

Plain ``__slots__`` classes rather than dataclasses with validation: these objects are
touched millions of times per run and only by :mod:`dualpath_cli.sim.cluster`.
"""

from __future__ import annotations

from collections import deque

from dualpath_cli.core.quota import PrefillWork
from dualpath_cli.core.types import EngineSnapshot, Request, Role
from dualpath_cli.sim.links import FifoLink, Flow, SharedLink

__all__ = ["Req", "ReadJob", "Node", "PEngine", "DEngine", "Group"]


class Req:
    """One agent turn in flight."""

    __slots__ = ("rid", "agent", "turn", "length", "cached", "new", "gen", "core", "pe", "de",
                 "pending_reads", "t_arrive", "t_first", "t_join", "t_second", "done_new",
                 "buf_pe", "buf_de", "finish_s")

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
        self.finish_s = 0.0


class ReadJob:
    """Part (or all) of a request's cached KV read by one node's storage NIC."""

    __slots__ = ("req", "tokens", "nbytes", "engine", "start")

    def __init__(self, req: Req, tokens: int, nbytes: float, engine: PEngine | DEngine) -> None:
        self.req = req
        self.tokens = tokens
        self.nbytes = nbytes
        self.engine = engine
        self.start = 0.0


class Node:
    """A machine: one storage NIC (read side fair-shared), a DRAM buffer, its engines."""

    __slots__ = ("idx", "role", "snic", "write", "read_q", "buffer_free", "engines", "bins",
                 "read_bytes")

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


class _Engine:
    __slots__ = ("idx", "node", "group", "snap", "rq", "reading", "cnic_in", "cnic_out")

    def __init__(self, idx: int, node: Node, group: Group, role: Role, hbm_tokens: int,
                 cnic_rate: float) -> None:
        self.idx = idx
        self.node = node
        self.group = group
        self.snap = EngineSnapshot(idx, node.idx, group.idx, role, hbm_free=hbm_tokens)
        self.rq: deque[ReadJob] = deque()
        self.reading: Flow | None = None
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
                 "hbm_cap")

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


class Group:
    """An engine group (one node's engines): fetches together through its leader."""

    __slots__ = ("idx", "role", "engines", "snaps", "pending", "private", "private_tokens",
                 "idle")

    def __init__(self, idx: int, role: Role) -> None:
        self.idx = idx
        self.role = role
        self.engines: list = []
        self.snaps: list[EngineSnapshot] = []
        self.pending = False
        self.private: deque[Request] = deque()
        self.private_tokens = 0
        self.idle = False
