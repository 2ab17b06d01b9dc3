"""The cluster simulation: agents' turns through PE fetch, reads, prefill, PD transfer, decode.

Every scheduling decision is a call into core/ (``pe_fetch``, ``de_route``, ``de_place``,
``read_plan``, ``pack_batch``); this module only moves simulated time and bytes. For speed
the fetches use core's in-place forms on the groups' own snapshots (``pe_fetch_in_place``;
``de_place`` as ``z_threshold`` plus ``place_under_z``, with ``|R|`` and its total taken from
running sums), which compute exactly what the copying forms compute. One turn's life
(ARCHITECTURE.md, "data flow of one agent turn"):

1. the agent submits its turn: it joins the global PE FIFO; idle PE groups are woken and
   fetch at their next period tick (pull-based, paper 6.1);
2. the PE group's fetch assigns a PE (core ``pe_fetch``); the turn joins the DE global
   queue, which the next DE fetch drains to the groups (``de_route``); a group's fetch places
   it on a DE under its HBM (``de_place``);
3. with both engines known the read plan comes from the core policy (``read_plan``); each
   part is queued on the reading engine and streamed through its node's storage NIC, whose
   bandwidth is fair-shared by the node's active reads, into the node's DRAM buffer;
4. a read-complete turn joins its PE's ready queue; the PE packs batches under the compute
   quota (``pack_batch``) and runs them (see :mod:`.costs`);
5. after its last chunk the first token exists (TTFT); the KV reaches the DE (streamed per
   layer with layerwise prefill, after the prefill otherwise), is copied into DE HBM and the
   turn joins the DE's decode batch; when its tokens are generated, its new blocks are
   persisted and the agent's next turn starts at once (zero tool latency, paper 8.2).

Simplifications (documented in docs/reproduction.md): compute-NIC KV traffic is a FIFO server
per GPU and direction, not contended across GPUs; persistence writes use the storage NIC's
write direction and never delay a read; the decode batch is a fluid model (step time updated
whenever the batch changes).
"""

from __future__ import annotations

import math
import time
from bisect import bisect_right
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from heapq import heappop, heappush
from itertools import islice
from operator import attrgetter

import numpy as np

from dualpath_cli.core.calibration import SimCalibration
from dualpath_cli.core.controllers import CONTROLLERS, Controllers, ControlStep, ttft_tail
from dualpath_cli.core.costs import CostModel, build_cost_model
from dualpath_cli.core.de_schedule import de_route, place_under_z, z_threshold
from dualpath_cli.core.groups import node_groups
from dualpath_cli.core.pe_fetch import pe_fetch_in_place
from dualpath_cli.core.policies import Policy, SchedParams, read_plan
from dualpath_cli.core.profiles import HardwareProfile, ModelProfile
from dualpath_cli.core.quota import PrefillWork, pack_batch
from dualpath_cli.core.thresholds import tokens_processable, tokens_readable
from dualpath_cli.core.types import Role
from dualpath_cli.errors import ConfigError, NoAvailableEngine, UsageError
from dualpath_cli.sim.events import EventLoop
from dualpath_cli.sim.links import Flow
from dualpath_cli.sim.metrics import SimResult, latency_stats, max_over_avg
from dualpath_cli.sim.online import StopRule, check_online
from dualpath_cli.sim.state import DEngine, Group, Node, PEngine, ReadJob, Req
from dualpath_cli.sim.trace import AgentPlan
from dualpath_cli.workload.stats import shared_chain

__all__ = ["MAX_NODES", "SimSetup", "Simulation", "derive_thresholds"]

_DE_HEAD_MAX = 4096   # bound on the private-queue head offered to one DE fetch
_cum_end = attrgetter("cum_end")


@dataclass(frozen=True)
class SimSetup:
    """Everything that defines a simulated cluster, apart from the workload.

    ``alpha``/``beta`` of None are derived as the paper does (3 s of reads, 5 s of work).
    ``seed`` seeds the ``random`` read rule and the online arrivals (config
    ``scheduler.random_seed``); ``layerwise_prefill`` False turns layerwise prefill off
    whatever the policy; ``controllers`` names the dynamic controllers that run
    (:mod:`dualpath_cli.core.controllers`: ``alpha``, ``beta``, ``quota``), one step every
    ``control_interval_s`` simulated seconds. ``nodes_per_group`` (config
    ``cluster.nodes_per_group``) forms the engine groups as :mod:`dualpath_cli.core.groups`
    says: consecutive nodes of one role, the last group smaller when the count is not a
    multiple.
    """

    model: ModelProfile
    hardware: HardwareProfile
    prefill_nodes: int
    decode_nodes: int
    policy: Policy
    calibration: SimCalibration = field(default_factory=SimCalibration)
    seed: int = 0
    alpha: int | None = None
    beta: int | None = None
    bin_s: float = 5.0
    layerwise_prefill: bool = True
    controllers: tuple[str, ...] = ()
    control_interval_s: float = 2.0
    sub_schedulers: int = 0  # > 0: hierarchical scheduling (sim/hierarchy.py)
    nodes_per_group: int = 1  # engine groups span this many nodes (core/groups.py)

    @property
    def pd(self) -> str:
        """The deployment as ``2P4D``."""
        return f"{self.prefill_nodes}P{self.decode_nodes}D"


def derive_thresholds(cost: CostModel, plans: Sequence[AgentPlan]) -> tuple[int, int]:
    """The paper's alpha (tokens the SNIC reads in 3 s) and beta (tokens a PE processes in 5 s).

    core's PE fetch charges a request's full length to ``tok``, so beta is counted in the
    same unit: core's ``HardwareProfile.prompt_tokens_per_s`` (the formula config and
    ``tune beta`` use) at the workload's mean context and append (the paper's "profiling").
    The cost model's FLOP/s is the hardware profile's peak x MFU, so both agree.
    """
    cal = cost.calibration
    alpha = tokens_readable(cost.snic_rate, cost.kv_bytes_per_token, cal.alpha_window_s)
    ctx_sum = app_sum = n = 0
    for p in plans[:500]:
        ctx = 0
        for t in p.turns:
            ctx_sum += ctx
            app_sum += t.append
            ctx += t.append + t.gen
            n += 1
    if n == 0:
        raise UsageError("the workload has no turns")
    c, a = ctx_sum // n, max(1, app_sum // n)
    rate = cost.hardware.prompt_tokens_per_s(cost.model, c, a)
    return alpha, tokens_processable(rate, cal.beta_window_s)


def _hbm_prefix(ready: Iterable[PrefillWork], hbm_tokens: int) -> Iterator[PrefillWork]:
    """The head of ``ready`` whose whole prompts fit in ``hbm_tokens`` (always the first)."""
    used = 0
    for i, w in enumerate(ready):
        used += w.cached + w.bsz
        if used > hbm_tokens and i > 0:
            return
        yield w


STOP_CHECK_S = 10.0
"""How often (simulated seconds) an online run applies its stop rule."""

MAX_NODES = 10_000
"""Most machines one run builds (70x the paper's 144); beyond it, building alone takes long."""


def _check_fits_decode_hbm(plans: Sequence[AgentPlan], de_hbm_tokens: int,
                           setup: SimSetup) -> None:
    """Fail before the run when an agent's whole context cannot sit in one DE's HBM.

    Why up front: a decode engine holds a turn's prompt and generated tokens, so the agent
    whose context grows largest would otherwise stop the run when it gets there, which in an
    online probe can be deep into a long simulation.
    """
    longest, agent = 0, -1
    for i, plan in enumerate(plans):
        total = 0
        for t in plan.turns:
            total += (t.append if t.append > 1 else 1) + (t.gen if t.gen > 1 else 1)
        if total > longest:
            longest, agent = total, i
    if longest > de_hbm_tokens:
        raise ConfigError(
            f"agent {agent} reaches {longest} tokens of context, more than one decode "
            f"engine's HBM holds for {setup.model.name} on {setup.hardware.name} "
            f"({de_hbm_tokens} tokens after weights): use a shorter --max-len, more decode "
            "nodes (expert-parallel models) or a hardware profile with more HBM")


class Simulation:
    """One simulated run. Build, then call :meth:`run_offline` or :meth:`run_online`.

    Why the handlers look flat: a 48P96D run is about 7.5M turns and 50M events, so the hot
    paths read attributes into locals, inline their one-line helpers, keep per-group totals
    (``Group.tok``/``hbm_free``) as running sums instead of re-summing snapshots, and call
    core's in-place fetch functions on the groups' own snapshots instead of copying them.
    Every float is still computed by the same operations in the same order, so a run is bit
    for bit what the plain version computed (pinned in tests/test_sim_determinism.py).
    """

    def __init__(self, setup: SimSetup, plans: Sequence[AgentPlan]) -> None:
        if setup.prefill_nodes < 1 or setup.decode_nodes < 1:
            raise UsageError(f"invalid deployment {setup.pd}: need at least one prefill and "
                             "one decode node")
        if setup.prefill_nodes + setup.decode_nodes > MAX_NODES:
            raise UsageError(f"deployment {setup.pd} has more than the {MAX_NODES:,} nodes one "
                             "run simulates (the paper's largest, 48P96D, has 144)")
        if not plans:
            raise UsageError("the workload has no agents")
        self.setup = setup
        self.plans = list(plans)
        self.policy: Policy = setup.policy
        # an unshaped policy (the oracle) moves no KV at all: no reads are planned
        self.core_policy: Policy | None = setup.policy if setup.policy.shaped else None
        cost = build_cost_model(setup.model, setup.hardware, setup.calibration,
                                setup.prefill_nodes, setup.decode_nodes)
        self.cost = cost
        _check_fits_decode_hbm(self.plans, cost.de_hbm_tokens, setup)
        alpha, beta = derive_thresholds(cost, self.plans)
        self.alpha = setup.alpha if setup.alpha is not None else alpha
        self.beta = setup.beta if setup.beta is not None else beta
        read_rate = cost.snic_rate / cost.kv_bytes_per_token
        cal = setup.calibration
        self.params = SchedParams(self.alpha, self.beta, cal.z_factor, cal.block_tokens,
                                  read_rate, read_rate, setup.seed)
        # constants the hot paths read (attribute chains resolved once)
        self._io = setup.policy.shaped
        self._layerwise = setup.policy.layerwise and setup.layerwise_prefill
        self._period = cal.fetch_period_s
        self._quota = cal.quota_s
        self._host_cores = cal.host_cores   # None: no CPU contention between engines
        # the fixed cost of a forward again for each further request of a batch (embedded)
        self._overhead_each = cal.prefill_overhead_s if cal.overhead_per_request else 0.0
        self._computing = 0                 # busy PEs + DEs with a batch (host_cores only)
        self._z_factor = cal.z_factor
        self._full_blocks = cal.full_blocks_only
        self._block_tokens = cal.block_tokens
        self._kvpt = cost.kv_bytes_per_token
        self._bin_s = setup.bin_s
        self.loop = EventLoop()
        ev = self.loop
        self._at = ev.at
        self._heap = ev.heap          # direct pushes where the time cannot be in the past
        self._ticket = ev.ticket
        self.K_PE_FETCH = ev.register(self._pe_fetch)
        self.K_DE_DRAIN = ev.register(self._de_drain)
        self.K_DE_FETCH = ev.register(self._de_fetch)
        self.K_READ = ev.register(self._read_done)
        self.K_PE_DONE = ev.register(self._pe_done)
        self.K_JOIN = ev.register(self._de_join)
        self.K_STEP = ev.register(self._de_step)
        self.K_AGENT = ev.register(self._agent_arrives)
        self.K_CHECK = ev.register(self._check_stop)
        self.K_IO_RETRY = ev.register(self._start_io)
        self.K_CONTROL = ev.register(self._control)
        unknown = sorted(set(setup.controllers) - set(CONTROLLERS))
        if unknown:
            raise UsageError(f"unknown controller {unknown[0]!r}; choose from "
                             f"{', '.join(CONTROLLERS)}")
        if setup.controllers and not setup.control_interval_s > 0:
            raise UsageError(f"control interval {setup.control_interval_s!r}: must be > 0 s")
        self.controllers = Controllers(
            on={name: name in setup.controllers for name in CONTROLLERS},
            bases={"alpha": float(self.alpha), "beta": float(self.beta),
                   "quota": float(cal.quota_s)},
            minimum={"alpha": 0.0, "beta": float(cal.block_tokens)})
        self.control_steps: list[ControlStep] = []
        self._ctl_values = {"alpha": float(self.alpha), "beta": float(self.beta),
                            "quota": float(cal.quota_s)}
        self._ctl_bytes: list[float] = []
        self._ctl_busy: list[float] = []
        self._ttfts: list[float] | None = [] if self.controllers.any_on else None
        self._build()
        # workload state
        n = len(self.plans)
        self.num_turns = [p.num_turns for p in self.plans]
        self.next_turn = [0] * n
        self.context = [0] * n
        # a global KV store's view of shared prefixes (issue 14): each agent's chained
        # shared-prefix keys, the keys some first turn has stored, and the hits counted
        self._shared_chains = [shared_chain(p.shared) if p.shared else None
                               for p in self.plans]
        self._stored_shared: set[int] = set()
        self.hit_tokens = 0
        self.shared_hit_tokens = 0
        self.agent_start = [math.nan] * n
        self.agent_end = [math.nan] * n
        self.reqs: dict[int, Req] = {}
        self.pe_queue: deque[Req] = deque()
        self.de_global: deque[Req] = deque()
        self.drain_pending = False
        self.rid = 0
        self.turns_done = 0
        self.ordinal = 0
        self.read_pe_tokens = 0
        self.read_de_tokens = 0
        self.record = False
        self.samples: list[tuple[float, float, float, float]] = []
        self.stop_rule: StopRule | None = None  # online runs: the paper's end of a run
        self.stopped: str | None = None
        self._total_turns = sum(self.num_turns)

    # ----------------------------------------------------------------- construction
    def _build(self) -> None:
        s, cost = self.setup, self.cost
        hw = s.hardware
        g = hw.gpus_per_node
        buf = float(hw.dram_buffer_bytes)
        self.nodes: list[Node] = []
        self.pe_groups: list[Group] = []
        self.de_groups: list[Group] = []
        self.pes: list[PEngine] = []
        self.des: list[DEngine] = []
        self.engines: list[PEngine | DEngine] = []
        # groups are numbered in order, PE groups first (one node per group: the node's
        # index); a group's engines are its nodes' engines, node by node
        for role, first, count in ((Role.PREFILL, 0, s.prefill_nodes),
                                   (Role.DECODE, s.prefill_nodes, s.decode_nodes)):
            for run in node_groups(count, s.nodes_per_group):
                grp: Group | None = None
                for pos in run:
                    node = Node(first + pos, role, cost.snic_rate, buf)
                    self.nodes.append(node)
                    if grp is None:
                        grp = Group(len(self.pe_groups) + len(self.de_groups), role, node)
                        (self.pe_groups if role is Role.PREFILL else self.de_groups).append(
                            grp)
                    node_snaps = []
                    for _ in range(g):
                        idx = len(self.engines)
                        e: PEngine | DEngine
                        if role is Role.PREFILL:
                            e = PEngine(idx, node, grp, cost.pe_hbm_tokens, cost.cnic_kv_rate)
                            self.pes.append(e)
                        else:
                            e = DEngine(idx, node, grp, cost.de_hbm_tokens, cost.cnic_kv_rate)
                            self.des.append(e)
                        self.engines.append(e)
                        node.engines.append(e)
                        grp.engines.append(e)
                        grp.snaps.append(e.snap)
                        node_snaps.append(e.snap)
                    grp.nodes.append((node, node_snaps))
                assert grp is not None
                grp.tok = sum(sn.tok for sn in grp.snaps)
                grp.hbm_free = sum(sn.hbm_free for sn in grp.snaps if sn.healthy)
        self.pe_idle: set[int] = {grp.idx for grp in self.pe_groups}
        for grp in self.pe_groups:
            grp.idle = True
        self.phase = {grp.idx: (i + 0.5) / len(self.pe_groups)
                      for i, grp in enumerate(self.pe_groups)}
        self.phase.update({grp.idx: (i + 0.5) / len(self.de_groups)
                           for i, grp in enumerate(self.de_groups)})
        period = s.calibration.fetch_period_s
        for grp in (*self.pe_groups, *self.de_groups):
            grp.tick_ph = self.phase[grp.idx] * period

    # ----------------------------------------------------------------- helpers
    def _tick(self, grp: Group) -> float:
        """The next periodic fetch time of ``grp`` at or after now."""
        period = self._period
        ph = grp.tick_ph
        return ph + period * math.ceil((self.loop.now - ph) / period - 1e-12)

    def _wake(self, grp: Group, kind: int) -> None:
        if not grp.pending:
            grp.pending = True
            period = self._period
            ph = grp.tick_ph
            self._at(ph + period * math.ceil((self.loop.now - ph) / period - 1e-12), kind, grp)

    # ----------------------------------------------------------------- agents and turns
    def _agent_arrives(self, agent: int) -> None:
        self.agent_start[agent] = self.loop.now
        self._start_turn(agent)

    def _start_turn(self, agent: int) -> None:
        k = self.next_turn[agent]
        t = self.plans[agent].turns[k]
        append, gen = t.append, t.gen
        if append < 1:
            append = 1
        if gen < 1:
            gen = 1
        self.next_turn[agent] = k + 1
        cached = self.context[agent]
        self.context[agent] = cached + append + gen
        if self._full_blocks:  # only whole blocks hit; the rest is new
            bt = self._block_tokens
            hit = (cached // bt) * bt
            append += cached - hit
            cached = hit
        if k == 0 and self._shared_chains[agent] is not None:
            shared = self._shared_hit(agent, append)
            cached, append = shared, append - shared
            self.shared_hit_tokens += shared
        self.hit_tokens += cached
        rid = self.rid = self.rid + 1
        req = Req(rid, agent, k, cached, append, gen, self.loop.now)
        self.reqs[rid] = req
        self.pe_queue.append(req)
        pe_idle = self.pe_idle
        if pe_idle:
            groups, kind = self.pe_groups, self.K_PE_FETCH
            for gidx in list(pe_idle):
                grp = groups[gidx]
                grp.idle = False
                self._wake(grp, kind)
            pe_idle.clear()

    def _shared_hit(self, agent: int, append: int) -> int:
        """First-turn tokens of ``agent``'s shared prefix that an earlier conversation has
        stored (whole blocks when only whole blocks hit; one token is always computed)."""
        chain = self._shared_chains[agent]
        assert chain is not None
        hit = 0
        for key, (_, n) in zip(chain, self.plans[agent].shared, strict=True):
            if key not in self._stored_shared:
                break
            hit += n
        hit = min(hit, append - 1)
        if self._full_blocks:
            hit = (hit // self._block_tokens) * self._block_tokens
        return max(0, hit)

    # ----------------------------------------------------------------- PE fetch
    def _pe_fetch(self, grp: Group) -> None:
        grp.pending = False
        self._fetch_from(grp, self.pe_queue, self.de_global, self.pe_idle)

    def _fetch_from(self, grp: Group, q: deque[Req], de_global: deque[Req],
                    idle: set[int]) -> None:
        """One PE group fetch from queue ``q`` into ``de_global``; the hierarchical
        scheduler calls it per sub-scheduler with that sub's queues and idle set."""
        if not q:
            grp.idle = True
            idle.add(grp.idx)
            return
        snaps = grp.snaps
        for node, node_snaps in grp.nodes:  # each engine reports its own node's queue
            read_q = node.read_q
            for sn in node_snaps:
                sn.read_q = read_q
        assignments, stop = pe_fetch_in_place((r.core for r in q), snaps, self.alpha, self.beta)
        if assignments:
            engines = self.engines
            for _rid, eid in assignments:
                req = q.popleft()
                req.pe = engines[eid]  # type: ignore[assignment]
                de_global.append(req)
            if not self.drain_pending:
                self.drain_pending = True
                self._at(self._tick(self.de_groups[0]), self.K_DE_DRAIN, None)
        if stop == "queue_empty":
            if q:
                self._wake(grp, self.K_PE_FETCH)
            else:
                grp.idle = True
                idle.add(grp.idx)

    # ----------------------------------------------------------------- DE phase 1 and 2
    def _de_drain(self, _: object) -> None:
        self.drain_pending = False
        q = self.de_global
        if not q:
            return
        loads = {grp.idx: grp.tok + grp.private_tokens for grp in self.de_groups}
        res = de_route([r.core for r in q], loads)
        groups, first, kind = self.de_groups, len(self.pe_groups), self.K_DE_FETCH
        for _rid, gidx in res.assignments:
            req = q.popleft()
            grp = groups[gidx - first]  # DE groups are numbered in order, after the PE groups
            grp.private.append(req)
            grp.private_tokens += req.length
            req.cum_end = grp.routed = grp.routed + req.length
            if not grp.pending:
                self._wake(grp, kind)

    def _de_fetch(self, grp: Group) -> None:
        grp.pending = False
        priv = grp.private
        if not priv:
            return
        snaps = grp.snaps
        first = priv[0].length
        for sn in snaps:
            if sn.healthy and sn.hbm_free >= first:
                break
        else:  # no DE has room for the head: core's placement would stop at once, empty
            return
        # core's de_place on the head R + 1 of the queue (R: the longest head whose total
        # fits the group's free HBM, at most _DE_HEAD_MAX requests offered), without walking
        # it: |R| by bisection over the running totals, sum(R) by one subtraction, then Z by
        # core's z_threshold and the placement loop by core's place_under_z, as de_place does
        free = grp.hbm_free
        base = priv[0].cum_end - first
        fit = bisect_right(priv, base + free, key=_cum_end)
        offered = min(fit + 1, len(priv), _DE_HEAD_MAX)
        r_count = fit if fit < offered else offered
        r_tokens = priv[r_count - 1].cum_end - base if r_count else 0
        live = [sn for sn in snaps if sn.healthy]
        z = z_threshold(r_tokens, live, self._z_factor)
        assignments, stop = place_under_z((r.core for r in islice(priv, offered)), live, z)
        engines = self.engines
        for _rid, eid in assignments:
            req = priv.popleft()
            de = engines[eid]
            req.de = de  # type: ignore[assignment]
            length, gen = req.length, req.gen
            de.snap.hbm_free -= gen  # generated tokens also live in HBM
            grp.private_tokens -= length
            grp.tok += length
            grp.hbm_free -= length + gen
            self._start_io(req)
        if stop == "queue_empty" and priv:
            self._wake(grp, self.K_DE_FETCH)

    # ----------------------------------------------------------------- reads
    def _start_io(self, req: Req) -> None:
        pe, de = req.pe, req.de
        assert pe is not None and de is not None
        pol = self.core_policy
        if pol is None or req.cached == 0:
            self._pe_ready(req)
            return
        pe_snap, de_snap = pe.snap, de.snap
        pe_snap.read_q = pe.node.read_q
        de_snap.read_q = de.node.read_q
        try:
            plan = read_plan(pol, req.core, pe_snap, de_snap, self.params, self.ordinal)
        except NoAvailableEngine:  # seed-select: neither side healthy; try at the next tick
            self._at(self.loop.now + self._period, self.K_IO_RETRY, req)
            return
        self.ordinal += 1
        kvpt = self._kvpt
        pe_tokens, de_tokens = plan.pe_tokens, plan.de_tokens
        pe_job = de_job = None
        if pe_tokens:
            pe_job = ReadJob(req, pe_tokens, pe_tokens * kvpt, pe)
            self.read_pe_tokens += pe_tokens
        if de_tokens:
            de_job = ReadJob(req, de_tokens, de_tokens * kvpt, de)
            self.read_de_tokens += de_tokens
        req.pending_reads = (pe_job is not None) + (de_job is not None)
        if pe_job is not None:
            pe.node.read_q += pe_tokens
            pe.rq.append(pe_job)
            if pe.reading is None:
                self._try_read(pe)
        if de_job is not None:
            de.node.read_q += de_tokens
            de.rq.append(de_job)
            if de.reading is None:
                self._try_read(de)

    def _try_read(self, eng: PEngine | DEngine) -> bool:
        rq = eng.rq
        if eng.reading is not None or not rq:
            return False
        job = rq[0]
        node = eng.node
        link = node.snic
        nbytes = job.nbytes
        if node.buffer_free < nbytes and link.flows:
            if not eng.blocked:
                eng.blocked = True
                node.blocked += 1
            return False  # DRAM buffer full: wait for a release (never blocks an idle NIC)
        if eng.blocked:
            eng.blocked = False
            node.blocked -= 1
        rq.popleft()
        node.buffer_free -= nbytes
        now = self.loop.now
        job.start = now
        flow = Flow(nbytes, now, job, eng.idx)
        eng.reading = flow
        link.add(now, flow)
        version = link.version = link.version + 1  # reschedule the next completion
        heappush(self._heap, (link.next_finish(), self._ticket(), self.K_READ, (node, version)))
        return True

    def _read_done(self, payload: tuple[Node, int]) -> None:
        node, version = payload
        link = node.snic
        if version != link.version:
            return
        now = self.loop.now
        engines, bin_s, bins = self.engines, self._bin_s, node.bins
        for flow in link.pop_done(now):
            job: ReadJob = flow.token  # type: ignore[assignment]
            eng = engines[flow.owner]
            eng.reading = None
            node.read_q -= job.tokens
            nbytes, start = job.nbytes, job.start
            b0 = int(start // bin_s)
            if b0 == int(now // bin_s) or now <= start:  # _bin's single-bin case, inlined
                node.read_bytes += nbytes
                bins[b0] = bins.get(b0, 0.0) + nbytes
            else:
                self._bin(node, start, now, nbytes)
            self._dram(node, nbytes)  # written into the node's buffer
            req = job.req
            if eng.prefill:
                req.buf_pe += nbytes
            else:
                req.buf_de += nbytes
            req.pending_reads -= 1
            if req.pending_reads == 0:  # _pe_ready, inlined
                pe = req.pe
                assert pe is not None
                pe.ready.append(PrefillWork(req.rid, req.cached, req.new))
                if not pe.busy:
                    self._start_batch(pe)
            if eng.rq:
                self._try_read(eng)
        version = link.version = link.version + 1
        if link.flows:  # next_finish() >= now: the link was just advanced to now
            heappush(self._heap, (link.next_finish(), self._ticket(), self.K_READ,
                                  (node, version)))

    def _bin(self, node: Node, start: float, end: float, nbytes: float) -> None:
        node.read_bytes += nbytes
        w = self._bin_s
        b0, b1 = int(start // w), int(end // w)
        bins = node.bins
        if b0 == b1 or end <= start:
            bins[b0] = bins.get(b0, 0.0) + nbytes
            return
        rate = nbytes / (end - start)
        for b in range(b0, b1 + 1):
            lo, hi = max(start, b * w), min(end, (b + 1) * w)
            if hi > lo:
                bins[b] = bins.get(b, 0.0) + rate * (hi - lo)

    def _dram(self, node: Node, nbytes: float) -> None:
        """Count KV bytes through ``node``'s DRAM now (accounting only: DRAM bandwidth is
        checked by the results' ``dram_util``/``dram_peak``, not queued on)."""
        node.dram_bytes += nbytes
        b = int(self.loop.now // self._bin_s)
        bins = node.dram_bins
        bins[b] = bins.get(b, 0.0) + nbytes

    def _release(self, node: Node, nbytes: float) -> None:
        """Free ``nbytes`` of ``node``'s buffer, which were read out of it (to HBM or a PE)."""
        if nbytes <= 0:
            return
        self._dram(node, nbytes)
        node.buffer_free += nbytes
        if node.blocked:  # else every engine of the node is reading or has nothing queued
            for eng in node.engines:
                if eng.reading is None and eng.rq:
                    self._try_read(eng)

    # ----------------------------------------------------------------- prefill
    def _pe_ready(self, req: Req) -> None:
        pe = req.pe
        assert pe is not None
        pe.ready.append(PrefillWork(req.rid, req.cached, req.new))
        if not pe.busy:
            self._start_batch(pe)

    def _start_batch(self, pe: PEngine) -> None:
        cost = self.cost
        ready = pe.ready
        layerwise = self._layerwise
        queue: Iterable[PrefillWork] = ready
        if not layerwise:  # whole-prompt KV must sit in HBM: offer only what fits
            queue = _hbm_prefix(ready, cost.pe_hbm_tokens)
        qb = pack_batch(queue, self._quota, cost.predictor)
        for _ in range(qb.consumed):
            ready.popleft()
        if qb.carry is not None:
            ready.appendleft(qb.carry)
        compute = 0.0
        cached = 0
        prefill_s = cost.prefill_s
        items = qb.items
        for w in items:
            compute += prefill_s(w.cached, w.bsz)
            cached += w.cached
        if self._overhead_each and len(items) > 1:  # batch_s adds the first one
            compute += self._overhead_each * (len(items) - 1)
        load = cached * self._kvpt if self._io else 0.0
        if self._host_cores is not None:
            self._computing += 1
            self._retime_decode(self.loop.now, None)
            compute *= self._slowdown()
        dur = cost.batch_s(compute, load, layerwise)
        pe.cnic_in.bytes += load
        pe.busy = True
        pe.busy_time += dur
        pe.batches += 1
        heappush(self._heap, (self.loop.now + dur, self._ticket(), self.K_PE_DONE, (pe, items)))

    def _pe_done(self, payload: tuple[PEngine, tuple[PrefillWork, ...]]) -> None:
        pe, items = payload
        pe.busy = False
        if self._host_cores is not None:
            self._computing -= 1
            self._retime_decode(self.loop.now, None)
        reqs = self.reqs
        for w in items:
            req = reqs[w.request_id]
            req.done_new += w.bsz
            if req.done_new >= req.new:
                self._prefill_finished(req)
        if pe.ready:
            self._start_batch(pe)

    def _prefill_finished(self, req: Req) -> None:
        now = self.loop.now
        if req.turn == 0:  # its KV exists now: the shared prefix is in the store
            chain = self._shared_chains[req.agent]
            if chain is not None:
                self._stored_shared.update(chain)
        req.t_first = now
        if self._ttfts is not None:
            self._ttfts.append(now - req.t_arrive)
        if self.stop_rule is not None:
            self.stop_rule.add(now, now - req.t_arrive)
        pe, de = req.pe, req.de
        assert pe is not None and de is not None
        snap = pe.snap
        snap.tok -= req.length
        snap.seq -= 1
        grp = pe.group
        if self.pe_queue and not grp.pending:
            self._wake(grp, self.K_PE_FETCH)
        buf = req.buf_pe
        if buf > 0:
            self._release(pe.node, buf)
        req.buf_pe = 0.0
        t = now
        if self._io:
            kvpt = self._kvpt
            full = req.length * kvpt
            if self._layerwise:  # streamed per layer during the prefill
                sent = (req.length if req.buf_de == 0 else req.new) * kvpt
                pe.cnic_out.bytes += sent
            else:
                sent = full
                t = pe.cnic_out.send(now, full)
            t = de.cnic_in.send(t, full)  # H2D into DE HBM through the CNIC loopback
            self._dram(de.node, sent + full)  # into the DE buffer, then out to HBM
        heappush(self._heap, (t, self._ticket(), self.K_JOIN, req))  # t >= now

    # ----------------------------------------------------------------- decode
    def _reschedule(self, de: DEngine, now: float) -> None:
        """Set the step time for the batch as it now is and schedule its next completion."""
        version = de.version = de.version + 1
        heap = de.heap
        if self._host_cores is not None and bool(heap) != de.active:
            de.active = bool(heap)
            self._computing += 1 if de.active else -1
            self._retime_decode(now, de)
        if not heap:
            de.step_s = 0.0
            return
        step_s = self.cost.decode_step_s(len(heap), de.attended)
        if self._host_cores is not None:
            step_s *= self._slowdown()
        de.step_s = step_s
        wait = max(0.0, heap[0][0] - de.steps) * step_s
        heappush(self._heap, (now + wait, self._ticket(), self.K_STEP, (de, version)))

    def _slowdown(self) -> float:
        """How much slower an engine computes now that ``_computing`` share the host cores."""
        cores = self._host_cores
        return max(1.0, self._computing / cores) if cores else 1.0

    def _retime_decode(self, now: float, skip: DEngine | None) -> None:
        """Re-time every decoding DE (but ``skip``) after the number of computing engines
        changed: advance its steps at the old rate, then reschedule at the new one."""
        for de in self.des:
            if de is skip or not de.heap:
                continue
            if de.step_s > 0:
                de.steps += (now - de.last) / de.step_s
                de.busy_time += now - de.last
            de.last = now
            self._reschedule(de, now)

    def _de_join(self, req: Req) -> None:
        de = req.de
        assert de is not None
        now = self.loop.now
        buf = req.buf_de
        if buf > 0:
            self._release(de.node, buf)
        req.buf_de = 0.0
        step_s = de.step_s  # advance the batch's step count to now
        if step_s > 0:
            de.steps += (now - de.last) / step_s
            de.busy_time += now - de.last
        de.last = now
        att = self.cost.attended(req.length + req.gen // 2)
        req.finish_s = att
        de.attended += att
        heappush(de.heap, (de.steps + (req.gen - 1), req.rid, req))
        req.t_join = now
        self._reschedule(de, now)
        req.t_second = now + de.step_s

    def _de_step(self, payload: tuple[DEngine, int]) -> None:
        de, version = payload
        if version != de.version:
            return
        now = self.loop.now
        step_s = de.step_s  # advance the batch's step count to now
        if step_s > 0:
            de.steps += (now - de.last) / step_s
            de.busy_time += now - de.last
        de.last = now
        heap = de.heap
        limit = de.steps + 1e-9
        while heap and heap[0][0] <= limit:
            req = heappop(heap)[2]
            de.attended -= int(req.finish_s)
            self._finish(req, de)
        self._reschedule(de, now)

    def _finish(self, req: Req, de: DEngine) -> None:
        now = self.loop.now
        snap = de.snap
        length, gen = req.length, req.gen
        snap.tok -= length
        snap.seq -= 1
        snap.hbm_free += length + gen
        grp = de.group
        grp.tok -= length
        grp.hbm_free += length + gen
        if grp.private and not grp.pending:
            self._wake(grp, self.K_DE_FETCH)
        if self._io:  # persist the turn's new full blocks (never delays a read)
            nbytes = (req.new + gen) * self._kvpt
            self._dram(de.node, 2 * nbytes)  # GPU -> DRAM -> storage
            de.node.write.send(now, nbytes)
            de.cnic_out.bytes += nbytes
        if self.record:
            tpot = (now - req.t_second) / (gen - 2) if gen > 2 else math.nan
            ttst = req.t_second - req.t_first if gen > 1 else math.nan
            self.samples.append((req.t_arrive, req.t_first - req.t_arrive, ttst, tpot))
        del self.reqs[req.rid]
        self.turns_done += 1
        agent = req.agent
        if self.next_turn[agent] < self.num_turns[agent]:
            self._start_turn(agent)
        else:
            self.agent_end[agent] = now

    # ----------------------------------------------------------------- controllers
    def _start_control(self) -> None:
        if not self.controllers.any_on:
            return
        self._ctl_bytes = [n.read_bytes for n in self.nodes]
        self._ctl_busy = [p.busy_time for p in self.pes]
        self.loop.at(self.loop.now + self.setup.control_interval_s, self.K_CONTROL, None)

    def _control(self, _: object) -> None:
        """One controller interval: measure, step core's controllers, apply, log."""
        dt = self.setup.control_interval_s
        rate = self.cost.snic_rate * dt
        read = [n.read_bytes for n in self.nodes]
        busy = [p.busy_time for p in self.pes]
        snic = max((b - a) / rate for a, b in zip(self._ctl_bytes, read, strict=True))
        gpu = sum(min(1.0, (b - a) / dt) for a, b in zip(self._ctl_busy, busy, strict=True))
        self._ctl_bytes, self._ctl_busy = read, busy
        ttfts = self._ttfts or []
        self._ttfts = []
        signals = {"snic_util": snic if self._io else None, "gpu_util": gpu / len(busy),
                   "ttft_tail": ttft_tail(ttfts)}
        for step in self.controllers.step(self._ctl_values, signals):
            if not step.moved:
                continue
            self._ctl_values[step.name] = step.new
            self.control_steps.append(step)
        beta = self.beta
        self.alpha = int(round(self._ctl_values["alpha"]))
        self.beta = int(round(self._ctl_values["beta"]))
        self._quota = self._ctl_values["quota"]
        self.params = replace(self.params, alpha=self.alpha, beta=self.beta)
        if self.beta > beta and self.pe_queue:  # PEs that were full may take more now
            for grp in self.pe_groups:
                if not grp.idle:
                    self._wake(grp, self.K_PE_FETCH)
        if self.record or self.turns_done < self._total_turns:
            self.loop.at(self.loop.now + dt, self.K_CONTROL, None)

    # ----------------------------------------------------------------- runs
    def run_offline(self) -> SimResult:
        """All agents start at t = 0; the job ends when the last one finishes (JCT)."""
        wall = time.perf_counter()
        for agent in range(len(self.plans)):
            self.agent_start[agent] = 0.0
            self._start_turn(agent)
        self._start_control()
        self.loop.run()
        end = max(self.agent_end) if self.plans else 0.0
        if any(math.isnan(x) for x in self.agent_end):
            raise RuntimeError("simulation stalled: some agents never finished")
        res = self._result("offline", end, end, time.perf_counter() - wall)
        # the JCT is the slowest trajectory's critical path; the mean says how the typical
        # one fared (docs/reproduction.md: the two speedups over basic differ)
        res.extra["mean_trajectory_s"] = float(np.mean(self.agent_end))
        return res

    def _check_stop(self, _: object) -> None:
        rule = self.stop_rule
        assert rule is not None
        verdict = rule.verdict(self.loop.now)
        if verdict is None:
            self.loop.at(self.loop.now + STOP_CHECK_S, self.K_CHECK, None)
        else:
            self.stopped = verdict

    def run_online(self, aps: float, horizon: float, warmup: float = 0.0,
                   stop_rule: StopRule | None = None) -> SimResult:
        """Agents arrive as a Poisson process of rate ``aps`` until ``horizon`` seconds.

        Latencies count turns that arrive after ``warmup``. The run ends at ``horizon``, or
        earlier by ``stop_rule`` (checked every ``STOP_CHECK_S`` simulated seconds): the
        paper's rule, TTFT over the last 150 s above the SLO or steady state. The result's
        ``stop_reason`` says which.
        """
        check_online(aps, horizon)
        wall = time.perf_counter()
        rng = np.random.default_rng(self.setup.seed + 7)
        t = 0.0
        agent = 0
        n = len(self.plans)
        while True:
            t += float(rng.exponential(1.0 / aps))
            if t >= horizon:
                break
            self.loop.at(t, self.K_AGENT, agent % n if agent >= n else agent)
            agent += 1
        if agent > n:
            raise UsageError(f"online run needs {agent} agents but the workload has {n}; "
                             "pass more agents")
        self.record = True
        self.stop_rule = stop_rule
        self._start_control()
        if stop_rule is None:
            self.loop.run(until=horizon)
        else:
            self.loop.at(STOP_CHECK_S, self.K_CHECK, None)
            self.loop.run(until=horizon, stop=lambda: self.stopped is not None)
        end = self.loop.now if self.stopped is not None else horizon
        res = self._result("online", end, math.nan, time.perf_counter() - wall)
        res.stop_reason = self.stopped or "horizon"
        res.aps = aps
        samples = [s for s in self.samples if s[0] >= warmup]
        ttft = [s[1] for s in samples]
        res.ttft = latency_stats(ttft)
        res.ttst = latency_stats([s[2] for s in samples if not math.isnan(s[2])])
        res.tpot = latency_stats([s[3] for s in samples if not math.isnan(s[3])])
        done = [e - s for s, e in zip(self.agent_start, self.agent_end, strict=True)
                if not math.isnan(e)]
        res.jct = float(np.mean(done)) if done else math.nan
        # a turn still waiting at the end has a TTFT of at least its age
        waiting = [end - r.t_arrive for r in self.reqs.values()
                   if r.t_first == 0.0 and r.t_arrive >= warmup]
        res.extra["unfinished_turns"] = float(len(self.reqs))
        res.extra["oldest_waiting_s"] = max(waiting) if waiting else 0.0
        return res

    def _result(self, mode: str, sim_time: float, jct: float, wall: float) -> SimResult:
        from dualpath_cli.sim.metrics import snic_series

        s = self.setup
        span = sim_time if sim_time > 0 else 1.0
        snic, snic_bins = max_over_avg([n.bins for n in self.nodes],
                                       len(self.nodes) * self.cost.snic_rate * s.bin_s)
        snic_util = (sum(n.read_bytes for n in self.nodes)
                     / (len(self.nodes) * self.cost.snic_rate * span))
        pe_util = sum(p.busy_time for p in self.pes) / (len(self.pes) * span)
        de_util = sum(d.busy_time for d in self.des) / (len(self.des) * span)
        dram_bw = self.cost.dram_bandwidth
        dram_util = max(n.dram_bytes for n in self.nodes) / (dram_bw * span)
        dram_peak = max((max(n.dram_bins.values(), default=0.0) for n in self.nodes),
                        default=0.0) / (dram_bw * s.bin_s)
        return SimResult(
            mode=mode, policy=self.policy.name, model=s.model.name, pd=s.pd,
            agents=len(self.plans), turns=self.turns_done, sim_time=sim_time, jct=jct,
            events=self.loop.events, wall_s=wall, snic_max_avg=snic, snic_util=snic_util,
            pe_util=min(1.0, pe_util), de_util=min(1.0, de_util), dram_util=dram_util,
            dram_peak=dram_peak,
            read_tokens_pe_side=self.read_pe_tokens, read_tokens_de_side=self.read_de_tokens,
            hit_tokens=self.hit_tokens, shared_hit_tokens=self.shared_hit_tokens,
            extra={"alpha_tokens": float(self.alpha), "beta_tokens": float(self.beta),
                   "snic_max_avg_bins": float(snic_bins),
                   **({"quota_s": float(self._quota),
                       "controller_moves": float(len(self.control_steps))}
                      if self.controllers.any_on else {})},
            snic_series=snic_series([(n.role, n.bins) for n in self.nodes], s.bin_s,
                                    sim_time, self.cost.snic_rate))
