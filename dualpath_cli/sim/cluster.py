"""The cluster simulation: agents' turns through PE fetch, reads, prefill, PD transfer, decode.

Every scheduling decision is a call into core/ (``pe_fetch``, ``de_route``, ``de_place``,
``read_plan``, ``pack_batch``); this module only moves simulated time and bytes. One turn's
life (ARCHITECTURE.md, "data flow of one agent turn"):

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

import heapq
import math
import time
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from dualpath_cli.core.de_schedule import de_place, de_route
from dualpath_cli.core.pe_fetch import pe_fetch
from dualpath_cli.core.policies import Policy, SchedParams, get_policy, read_plan
from dualpath_cli.core.profiles import HardwareProfile, ModelProfile
from dualpath_cli.core.quota import PrefillWork, pack_batch
from dualpath_cli.core.thresholds import tokens_processable, tokens_readable
from dualpath_cli.core.types import Request, Role
from dualpath_cli.errors import ConfigError, UsageError
from dualpath_cli.sim.calibration import SimCalibration
from dualpath_cli.sim.costs import CostModel, build_cost_model
from dualpath_cli.sim.events import EventLoop
from dualpath_cli.sim.links import Flow
from dualpath_cli.sim.metrics import SimResult, latency_stats, max_over_avg
from dualpath_cli.sim.policies import SimPolicy
from dualpath_cli.sim.state import DEngine, Group, Node, PEngine, ReadJob, Req
from dualpath_cli.sim.trace import AgentPlan

__all__ = ["SimSetup", "Simulation", "derive_thresholds"]

_DE_HEAD_MAX = 4096   # bound on the private-queue head offered to one DE fetch


@dataclass(frozen=True)
class SimSetup:
    """Everything that defines a simulated cluster, apart from the workload.

    ``alpha``/``beta`` of None are derived as the paper does (3 s of reads, 5 s of work).
    """

    model: ModelProfile
    hardware: HardwareProfile
    prefill_nodes: int
    decode_nodes: int
    policy: SimPolicy
    calibration: SimCalibration = field(default_factory=SimCalibration)
    seed: int = 0
    alpha: int | None = None
    beta: int | None = None
    bin_s: float = 5.0

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


class Simulation:
    """One simulated run. Build, then call :meth:`run_offline` or :meth:`run_online`."""

    def __init__(self, setup: SimSetup, plans: Sequence[AgentPlan]) -> None:
        if setup.prefill_nodes < 1 or setup.decode_nodes < 1:
            raise UsageError(f"invalid deployment {setup.pd}: need at least one prefill and "
                             "one decode node")
        if not plans:
            raise UsageError("the workload has no agents")
        self.setup = setup
        self.plans = list(plans)
        self.policy: SimPolicy = setup.policy
        self.core_policy: Policy | None = (get_policy(setup.policy.read_rule)
                                           if setup.policy.read_rule else None)
        cost = build_cost_model(setup.model, setup.hardware, setup.calibration,
                                setup.prefill_nodes, setup.decode_nodes)
        self.cost = cost
        alpha, beta = derive_thresholds(cost, self.plans)
        self.alpha = setup.alpha if setup.alpha is not None else alpha
        self.beta = setup.beta if setup.beta is not None else beta
        read_rate = cost.snic_rate / cost.kv_bytes_per_token
        cal = setup.calibration
        self.params = SchedParams(self.alpha, self.beta, cal.z_factor, cal.block_tokens,
                                  read_rate, read_rate, setup.seed)
        self.loop = EventLoop()
        ev = self.loop
        self.K_PE_FETCH = ev.register(self._pe_fetch)
        self.K_DE_DRAIN = ev.register(self._de_drain)
        self.K_DE_FETCH = ev.register(self._de_fetch)
        self.K_READ = ev.register(self._read_done)
        self.K_PE_DONE = ev.register(self._pe_done)
        self.K_JOIN = ev.register(self._de_join)
        self.K_STEP = ev.register(self._de_step)
        self.K_AGENT = ev.register(self._agent_arrives)
        self._build()
        # workload state
        n = len(self.plans)
        self.next_turn = [0] * n
        self.context = [0] * n
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
        total = s.prefill_nodes + s.decode_nodes
        for n in range(total):
            role = Role.PREFILL if n < s.prefill_nodes else Role.DECODE
            node = Node(n, role, cost.snic_rate, buf)
            self.nodes.append(node)
            grp = Group(n, role)
            (self.pe_groups if role is Role.PREFILL else self.de_groups).append(grp)
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
        self.pe_idle: set[int] = {grp.idx for grp in self.pe_groups}
        for grp in self.pe_groups:
            grp.idle = True
        self.phase = {grp.idx: (i + 0.5) / len(self.pe_groups)
                      for i, grp in enumerate(self.pe_groups)}
        self.phase.update({grp.idx: (i + 0.5) / len(self.de_groups)
                           for i, grp in enumerate(self.de_groups)})

    # ----------------------------------------------------------------- helpers
    def _tick(self, gidx: int) -> float:
        """The next periodic fetch time of group ``gidx`` at or after now."""
        period = self.setup.calibration.fetch_period_s
        ph = self.phase[gidx] * period
        now = self.loop.now
        return ph + period * math.ceil((now - ph) / period - 1e-12)

    def _wake(self, grp: Group, kind: int) -> None:
        if not grp.pending:
            grp.pending = True
            self.loop.at(self._tick(grp.idx), kind, grp)

    # ----------------------------------------------------------------- agents and turns
    def _agent_arrives(self, agent: int) -> None:
        self.agent_start[agent] = self.loop.now
        self._start_turn(agent)

    def _start_turn(self, agent: int) -> None:
        plan = self.plans[agent]
        k = self.next_turn[agent]
        t = plan.turns[k]
        append, gen = t.append, t.gen
        append = max(1, append)
        gen = max(1, gen)
        self.next_turn[agent] = k + 1
        cached = self.context[agent]
        self.context[agent] = cached + append + gen
        if self.setup.calibration.full_blocks_only:  # only whole blocks hit; the rest is new
            bt = self.setup.calibration.block_tokens
            hit = (cached // bt) * bt
            append += cached - hit
            cached = hit
        self.rid += 1
        req = Req(self.rid, agent, k, cached, append, gen, self.loop.now)
        if req.length + gen > self.cost.de_hbm_tokens:
            raise ConfigError(
                f"agent {agent} turn {k}: {req.length + gen} tokens of KV cannot fit in one "
                f"decode engine's HBM ({self.cost.de_hbm_tokens} tokens)")
        self.reqs[req.rid] = req
        self.pe_queue.append(req)
        if self.pe_idle:
            for gidx in list(self.pe_idle):
                grp = self.pe_groups[gidx]
                grp.idle = False
                self._wake(grp, self.K_PE_FETCH)
            self.pe_idle.clear()

    # ----------------------------------------------------------------- PE fetch
    def _pe_fetch(self, grp: Group) -> None:
        grp.pending = False
        q = self.pe_queue
        if not q:
            grp.idle = True
            self.pe_idle.add(grp.idx)
            return
        for e in grp.engines:
            e.snap.read_q = e.node.read_q
        res = pe_fetch((r.core for r in q), grp.snaps, self.alpha, self.beta)
        grp.snaps = list(res.engines)
        for e, snap in zip(grp.engines, res.engines, strict=True):
            e.snap = snap
        engines = self.engines
        for _rid, eid in res.assignments:
            req = q.popleft()
            req.pe = engines[eid]  # type: ignore[assignment]
            self.de_global.append(req)
        if res.assignments and not self.drain_pending:
            self.drain_pending = True
            self.loop.at(self._tick(self.de_groups[0].idx), self.K_DE_DRAIN, None)
        if res.stop_reason == "queue_empty":
            if q:
                self._wake(grp, self.K_PE_FETCH)
            else:
                grp.idle = True
                self.pe_idle.add(grp.idx)

    # ----------------------------------------------------------------- DE phase 1 and 2
    def _de_drain(self, _: object) -> None:
        self.drain_pending = False
        q = self.de_global
        if not q:
            return
        loads = {grp.idx: sum(s.tok for s in grp.snaps) + grp.private_tokens
                 for grp in self.de_groups}
        res = de_route([r.core for r in q], loads)
        nodes = self.nodes
        for _rid, gidx in res.assignments:
            req = q.popleft()
            grp = self._de_group_of(nodes[gidx])
            grp.private.append(req.core)
            grp.private_tokens += req.length
            self._wake(grp, self.K_DE_FETCH)

    def _de_group_of(self, node: Node) -> Group:
        return self.de_groups[node.idx - self.setup.prefill_nodes]

    def _de_fetch(self, grp: Group) -> None:
        grp.pending = False
        priv = grp.private
        if not priv:
            return
        free = sum(s.hbm_free for s in grp.snaps if s.healthy)
        head: list[Request] = []
        used = 0
        for r in priv:
            head.append(r)
            used += r.length
            if used > free or len(head) >= _DE_HEAD_MAX:
                break
        res = de_place(head, grp.snaps, self.setup.calibration.z_factor)
        grp.snaps = list(res.engines)
        for e, snap in zip(grp.engines, res.engines, strict=True):
            e.snap = snap
        engines, reqs = self.engines, self.reqs
        for rid, eid in res.assignments:
            priv.popleft()
            req = reqs[rid]
            de = engines[eid]
            req.de = de  # type: ignore[assignment]
            de.snap.hbm_free -= req.gen  # generated tokens also live in HBM
            grp.private_tokens -= req.length
            self._start_io(req)
        if res.stop_reason == "queue_empty" and priv:
            self._wake(grp, self.K_DE_FETCH)

    # ----------------------------------------------------------------- reads
    def _start_io(self, req: Req) -> None:
        pe, de = req.pe, req.de
        assert pe is not None and de is not None
        pol = self.core_policy
        if pol is None or req.cached == 0:
            self._pe_ready(req)
            return
        pe.snap.read_q = pe.node.read_q
        de.snap.read_q = de.node.read_q
        plan = read_plan(pol, req.core, pe.snap, de.snap, self.params, self.ordinal)
        self.ordinal += 1
        kvpt = self.cost.kv_bytes_per_token
        jobs = []
        if plan.pe_tokens:
            jobs.append(ReadJob(req, plan.pe_tokens, plan.pe_tokens * kvpt, pe))
            self.read_pe_tokens += plan.pe_tokens
        if plan.de_tokens:
            jobs.append(ReadJob(req, plan.de_tokens, plan.de_tokens * kvpt, de))
            self.read_de_tokens += plan.de_tokens
        req.pending_reads = len(jobs)
        for job in jobs:
            eng = job.engine
            eng.node.read_q += job.tokens
            eng.rq.append(job)
            if eng.reading is None:
                self._try_read(eng)

    def _try_read(self, eng: PEngine | DEngine) -> bool:
        if eng.reading is not None or not eng.rq:
            return False
        job = eng.rq[0]
        node = eng.node
        if node.buffer_free < job.nbytes and node.snic.flows:
            return False  # DRAM buffer full: wait for a release (never blocks an idle NIC)
        eng.rq.popleft()
        node.buffer_free -= job.nbytes
        now = self.loop.now
        job.start = now
        flow = Flow(job.nbytes, now, job, eng.idx)
        eng.reading = flow
        node.snic.add(now, flow)
        self._schedule_node(node)
        return True

    def _schedule_node(self, node: Node) -> None:
        link = node.snic
        link.version += 1
        if link.flows:
            self.loop.at(link.next_finish(), self.K_READ, (node, link.version))

    def _read_done(self, payload: tuple[Node, int]) -> None:
        node, version = payload
        if version != node.snic.version:
            return
        now = self.loop.now
        engines = self.engines
        for flow in node.snic.pop_done(now):
            job: ReadJob = flow.token  # type: ignore[assignment]
            eng = engines[flow.owner]
            eng.reading = None
            node.read_q -= job.tokens
            self._bin(node, job.start, now, job.nbytes)
            req = job.req
            if eng.snap.role is Role.PREFILL:
                req.buf_pe += job.nbytes
            else:
                req.buf_de += job.nbytes
            req.pending_reads -= 1
            if req.pending_reads == 0:
                self._pe_ready(req)
            self._try_read(eng)
        self._schedule_node(node)

    def _bin(self, node: Node, start: float, end: float, nbytes: float) -> None:
        node.read_bytes += nbytes
        w = self.setup.bin_s
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

    def _release(self, node: Node, nbytes: float) -> None:
        if nbytes <= 0:
            return
        node.buffer_free += nbytes
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
        layerwise = self.policy.layerwise
        queue: Iterable[PrefillWork] = ready
        if not layerwise:  # whole-prompt KV must sit in HBM: offer only what fits
            queue = _hbm_prefix(ready, cost.pe_hbm_tokens)
        qb = pack_batch(queue, self.setup.calibration.quota_s, cost.predictor)
        for _ in range(qb.consumed):
            ready.popleft()
        if qb.carry is not None:
            ready.appendleft(qb.carry)
        compute = 0.0
        cached = 0
        for w in qb.items:
            compute += cost.prefill_s(w.cached, w.bsz)
            cached += w.cached
        load = cached * cost.kv_bytes_per_token if self.policy.io else 0.0
        dur = cost.batch_s(compute, load, layerwise)
        pe.cnic_in.bytes += load
        pe.busy = True
        pe.busy_time += dur
        pe.batches += 1
        self.loop.at(self.loop.now + dur, self.K_PE_DONE, (pe, qb.items))

    def _pe_done(self, payload: tuple[PEngine, tuple[PrefillWork, ...]]) -> None:
        pe, items = payload
        pe.busy = False
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
        req.t_first = now
        pe, de = req.pe, req.de
        assert pe is not None and de is not None
        snap = pe.snap
        snap.tok -= req.length
        snap.seq -= 1
        grp = pe.group
        if self.pe_queue and not grp.pending:
            self._wake(grp, self.K_PE_FETCH)
        self._release(pe.node, req.buf_pe)
        req.buf_pe = 0.0
        t = now
        if self.policy.io:
            kvpt = self.cost.kv_bytes_per_token
            full = req.length * kvpt
            if self.policy.layerwise:  # streamed per layer during the prefill
                pe.cnic_out.bytes += (req.length if req.buf_de == 0 else req.new) * kvpt
            else:
                t = pe.cnic_out.send(now, full)
            t = de.cnic_in.send(t, full)  # H2D into DE HBM through the CNIC loopback
        self.loop.at(t, self.K_JOIN, req)

    # ----------------------------------------------------------------- decode
    def _advance(self, de: DEngine) -> None:
        now = self.loop.now
        if de.step_s > 0:
            de.steps += (now - de.last) / de.step_s
            de.busy_time += now - de.last
        de.last = now

    def _reschedule(self, de: DEngine) -> None:
        de.version += 1
        n = len(de.heap)
        if n == 0:
            de.step_s = 0.0
            return
        de.step_s = self.cost.decode_step_s(n, de.attended)
        wait = max(0.0, de.heap[0][0] - de.steps) * de.step_s
        self.loop.at(self.loop.now + wait, self.K_STEP, (de, de.version))

    def _de_join(self, req: Req) -> None:
        de = req.de
        assert de is not None
        now = self.loop.now
        self._release(de.node, req.buf_de)
        req.buf_de = 0.0
        self._advance(de)
        att = self.cost.attended(req.length + req.gen // 2)
        req.finish_s = att
        de.attended += att
        heapq.heappush(de.heap, (de.steps + (req.gen - 1), req.rid, req))
        req.t_join = now
        self._reschedule(de)
        req.t_second = now + de.step_s

    def _de_step(self, payload: tuple[DEngine, int]) -> None:
        de, version = payload
        if version != de.version:
            return
        self._advance(de)
        heap = de.heap
        limit = de.steps + 1e-9
        while heap and heap[0][0] <= limit:
            _, _, req = heapq.heappop(heap)
            de.attended -= int(req.finish_s)
            self._finish(req, de)
        self._reschedule(de)

    def _finish(self, req: Req, de: DEngine) -> None:
        now = self.loop.now
        snap = de.snap
        snap.tok -= req.length
        snap.seq -= 1
        snap.hbm_free += req.length + req.gen
        if de.group.private:
            self._wake(de.group, self.K_DE_FETCH)
        if self.policy.io:  # persist the turn's new full blocks (never delays a read)
            nbytes = (req.new + req.gen) * self.cost.kv_bytes_per_token
            de.node.write.send(now, nbytes)
            de.cnic_out.bytes += nbytes
        if self.record:
            tpot = (now - req.t_second) / (req.gen - 2) if req.gen > 2 else math.nan
            ttst = req.t_second - req.t_first if req.gen > 1 else math.nan
            self.samples.append((req.t_arrive, req.t_first - req.t_arrive, ttst, tpot))
        del self.reqs[req.rid]
        self.turns_done += 1
        agent = req.agent
        if self.next_turn[agent] < self.plans[agent].num_turns:
            self._start_turn(agent)
        else:
            self.agent_end[agent] = now

    # ----------------------------------------------------------------- runs
    def run_offline(self) -> SimResult:
        """All agents start at t = 0; the job ends when the last one finishes (JCT)."""
        wall = time.perf_counter()
        for agent in range(len(self.plans)):
            self.agent_start[agent] = 0.0
            self._start_turn(agent)
        self.loop.run()
        end = max(self.agent_end) if self.plans else 0.0
        if any(math.isnan(x) for x in self.agent_end):
            raise RuntimeError("simulation stalled: some agents never finished")
        return self._result("offline", end, end, time.perf_counter() - wall)

    def run_online(self, aps: float, horizon: float, warmup: float = 0.0) -> SimResult:
        """Agents arrive as a Poisson process of rate ``aps`` until ``horizon`` seconds.

        Latencies count turns that arrive after ``warmup``; the run stops at ``horizon``.
        """
        if not aps > 0:
            raise UsageError(f"arrival rate must be > 0 agents/s, got {aps}")
        if not horizon > 0:
            raise UsageError(f"horizon must be > 0 s, got {horizon}")
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
        self.loop.run(until=horizon)
        res = self._result("online", horizon, math.nan, time.perf_counter() - wall)
        res.aps = aps
        samples = [s for s in self.samples if s[0] >= warmup]
        ttft = [s[1] for s in samples]
        res.ttft = latency_stats(ttft)
        res.ttst = latency_stats([s[2] for s in samples if not math.isnan(s[2])])
        res.tpot = latency_stats([s[3] for s in samples if not math.isnan(s[3])])
        done = [e - s for s, e in zip(self.agent_start, self.agent_end, strict=True)
                if not math.isnan(e)]
        res.jct = float(np.mean(done)) if done else math.nan
        # a turn still waiting at the horizon has a TTFT of at least its age
        waiting = [horizon - r.t_arrive for r in self.reqs.values()
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
        return SimResult(
            mode=mode, policy=self.policy.name, model=s.model.name, pd=s.pd,
            agents=len(self.plans), turns=self.turns_done, sim_time=sim_time, jct=jct,
            events=self.loop.events, wall_s=wall, snic_max_avg=snic, snic_util=snic_util,
            pe_util=min(1.0, pe_util), de_util=min(1.0, de_util),
            read_tokens_pe_side=self.read_pe_tokens, read_tokens_de_side=self.read_de_tokens,
            extra={"alpha_tokens": float(self.alpha), "beta_tokens": float(self.beta),
                   "snic_max_avg_bins": float(snic_bins)},
            snic_series=snic_series([(n.role, n.bins) for n in self.nodes], s.bin_s,
                                    sim_time, self.cost.snic_rate))
