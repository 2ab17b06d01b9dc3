"""The cluster simulation: agents' turns through PE fetch, reads, prefill, PD transfer, decode.

Every scheduling decision is a call into core/ (``pe_fetch``, ``de_route``, ``de_place``,
``read_plan``, ``pack_batch``); the simulation only moves simulated time and bytes. This
module builds a run and drives it (agents, turns, offline and online runs, the result); the
stages of a turn's life are its base classes (:mod:`.base` says why): :mod:`.fetch`,
:mod:`.kv_reads`, :mod:`.prefill`, :mod:`.decode` and :mod:`.control`; the machines come
from :mod:`.topology`. One turn's life (ARCHITECTURE.md, "data flow of one agent turn"):

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
from collections import deque
from collections.abc import Sequence

import numpy as np
from mypy_extensions import mypyc_attr

from dualpath_cli.core.costs import build_cost_model
from dualpath_cli.core.policies import SchedParams
from dualpath_cli.errors import UsageError
from dualpath_cli.limits import check
from dualpath_cli.sim.control import ControlStage
from dualpath_cli.sim.events import EventLoop
from dualpath_cli.sim.metrics import SimResult, latency_stats, max_over_avg, snic_series
from dualpath_cli.sim.online import StopRule, check_online
from dualpath_cli.sim.progress import PROGRESS_TICK_S, ProgressFn, RunProgress
from dualpath_cli.sim.setup import SimSetup, check_fits_decode_hbm, derive_thresholds
from dualpath_cli.sim.state import Req
from dualpath_cli.sim.topology import build_topology
from dualpath_cli.sim.trace import AgentPlan
from dualpath_cli.workload.prefix_store import GlobalPrefixStore
from dualpath_cli.workload.stats import shared_chain

__all__ = ["STOP_CHECK_S", "Simulation"]

STOP_CHECK_S = 10.0
"""How often (simulated seconds) an online run applies its stop rule."""


@mypyc_attr(allow_interpreted_subclasses=True)
class Simulation(ControlStage):
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
        check("nodes", setup.prefill_nodes + setup.decode_nodes, f"deployment {setup.pd}")
        if not plans:
            raise UsageError("the workload has no agents")
        self.setup = setup
        self.plans = list(plans)
        self.policy = setup.policy
        # an unshaped policy (the oracle) moves no KV at all: no reads are planned
        self.core_policy = setup.policy if setup.policy.shaped else None
        cost = build_cost_model(setup.model, setup.hardware, setup.calibration,
                                setup.prefill_nodes, setup.decode_nodes)
        self.cost = cost
        check_fits_decode_hbm(self.plans, cost.de_hbm_tokens, setup)
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
        self._topk = cost.topk
        self._fixed_step_s = cal.decode_step_s
        self._hbm_bw = cost.hbm_bandwidth
        self._decode_base_s = cost.decode_base_s
        self._linear_s: dict[int, float] = {}  # decode batch size -> its linear layers' time
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
        self.K_PROGRESS = ev.register(self._report_progress)
        #: called every PROGRESS_TICK_S simulated seconds while a run goes (sim/progress.py)
        self.progress: ProgressFn | None = None
        self._init_control()
        topo = build_topology(setup, cost)
        self.nodes, self.pe_groups, self.de_groups = topo.nodes, topo.pe_groups, topo.de_groups
        self.pes, self.des, self.engines = topo.pes, topo.des, topo.engines
        self.pe_idle = topo.pe_idle
        # workload state
        n = len(self.plans)
        self.num_turns = [p.num_turns for p in self.plans]
        self.next_turn = [0] * n
        self.context = [0] * n
        # a global KV store's view of shared prefixes (issue 14): each agent's chained
        # shared-prefix keys, the keys some first turn has stored, and the hits counted
        self._shared_chains = [shared_chain(p.shared) if p.shared else None
                               for p in self.plans]
        self._stored_shared = set()
        # a trace with block chains (a request log's hash ids): one global store of them
        chained = next((p for p in self.plans if p.blocks), None)
        self._prefix_store = (GlobalPrefixStore(chained.block_tokens) if chained is not None
                              else None)
        self.prompt_tokens = 0
        self.hit_tokens = 0
        self.shared_hit_tokens = 0
        self.agent_start = [math.nan] * n
        self.agent_end = [math.nan] * n
        self.reqs = {}
        self.pe_queue = deque()
        self.de_global = deque()
        self.drain_pending = False
        self.rid = 0
        self.turns_done = 0
        self.ordinal = 0
        self.read_pe_tokens = 0
        self.read_de_tokens = 0
        self.joined_read_tokens = 0
        self.record = False
        self.samples = []
        self.stop_rule = None  # online runs: the paper's end of a run
        self.stopped = None
        self._total_turns = sum(self.num_turns)

    # ----------------------------------------------------------------- agents and turns
    def _agent_arrives(self, agent: int) -> None:
        self.agent_start[agent] = self.loop.now
        self._start_turn(agent)

    def _start_turn(self, agent: int) -> None:
        k = self.next_turn[agent]
        plan = self.plans[agent]
        t = plan.turns[k]
        append, gen = t.append, t.gen
        if append < 1:
            append = 1
        if gen < 1:
            gen = 1
        self.next_turn[agent] = k + 1
        cached = self.context[agent]
        self.context[agent] = cached + append + gen
        if plan.blocks:  # a request log's chain: what the global store holds hits
            cached, append = self._chain_hit(plan, k, cached, cached + append)
        elif self._full_blocks:  # only whole blocks hit; the rest is new
            bt = self._block_tokens
            hit = (cached // bt) * bt
            append += cached - hit
            cached = hit
        if k == 0 and self._shared_chains[agent] is not None and not plan.blocks:
            shared = self._shared_hit(agent, append)
            cached, append = shared, append - shared
            self.shared_hit_tokens += shared
        self.hit_tokens += cached
        self.prompt_tokens += cached + append
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

    def _chain_hit(self, plan: AgentPlan, k: int, context: int, prompt: int
                   ) -> tuple[int, int]:
        """(hit, new) tokens of turn ``k``'s prompt by its block chain in the global store
        (``workload.prefix_store``; whole engine blocks when only whole blocks hit; one token
        is always computed); counts the cross-conversation part. ``context``: the previous
        turns' tokens (their generated blocks are stored first where the plan says so)."""
        store = self._prefix_store
        assert store is not None
        found = store.replay_hit(plan.blocks[k], prompt, plan.blocks[k - 1] if k else (),
                                 context if k and plan.outputs_stored else None)
        hit = found.tokens
        if self._full_blocks:
            hit = (hit // self._block_tokens) * self._block_tokens
        self.shared_hit_tokens += min(found.cross, hit)
        return hit, prompt - hit

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

    # ----------------------------------------------------------------- runs
    def run_offline(self) -> SimResult:
        """All agents start at t = 0 (or at their plan's ``start_s``, a recording's
        arrivals); the job ends when the last one finishes (JCT)."""
        wall = time.perf_counter()
        timed = any(p.start_s for p in self.plans)
        for agent, plan in enumerate(self.plans):
            if plan.start_s:  # a recorded arrival: the agent arrives then
                self.loop.at(plan.start_s, self.K_AGENT, agent)
                continue
            self.agent_start[agent] = 0.0
            self._start_turn(agent)
        self._start_control()
        self._start_progress(None)
        self.loop.run()
        end = max(self.agent_end) if self.plans else 0.0
        if any(math.isnan(x) for x in self.agent_end):
            raise RuntimeError("simulation stalled: some agents never finished")
        res = self._result("offline", end, end, time.perf_counter() - wall)
        # the JCT is the slowest trajectory's critical path; the mean says how the typical
        # one fared (docs/reproduction.md: the two speedups over basic differ)
        res.extra["mean_trajectory_s"] = float(np.mean(
            [e - s for e, s in zip(self.agent_end, self.agent_start, strict=True)]
            if timed else self.agent_end))
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
        self._start_progress(horizon)
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

    def _start_progress(self, horizon: float | None) -> None:
        """The first progress tick, when a run was given a callback (none otherwise)."""
        if self.progress is not None:
            self.loop.at(self.loop.now + PROGRESS_TICK_S, self.K_PROGRESS, horizon)

    def _report_progress(self, horizon: float | None) -> None:
        """Report, then tick again while the run has other events (sim/progress.py)."""
        loop = self.loop
        loop.events -= 1  # the tick is not one of the simulation's events
        assert self.progress is not None
        self.progress(RunProgress(loop.now, self.turns_done,
                                  None if horizon else self._total_turns, horizon))
        if loop.heap:
            loop.at(loop.now + PROGRESS_TICK_S, self.K_PROGRESS, horizon)

    def _result(self, mode: str, sim_time: float, jct: float, wall: float) -> SimResult:
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
            prompt_tokens=self.prompt_tokens,
            extra={"alpha_tokens": float(self.alpha), "beta_tokens": float(self.beta),
                   "snic_max_avg_bins": float(snic_bins),
                   **({"joined_read_tokens": float(self.joined_read_tokens)}
                      if self.joined_read_tokens else {}),
                   **({"quota_s": float(self._quota),
                       "controller_moves": float(len(self.control_steps))}
                      if self.controllers.any_on else {})},
            snic_series=snic_series([(n.role, n.bins) for n in self.nodes], s.bin_s,
                                    sim_time, self.cost.snic_rate))
