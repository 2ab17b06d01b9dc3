"""Decode: a DE's batch as a fluid model (the step time is updated whenever the batch
changes); a finished turn persists its new blocks and its agent's next turn starts at once
(zero tool latency, paper 8.2).

With ``host_cores`` calibrated, engines that compute at once share the host's cores: every
decode batch is re-timed when the number of computing engines changes.
"""

from __future__ import annotations

import math
from heapq import heappop, heappush

from mypy_extensions import mypyc_attr

from dualpath_cli.sim.prefill import PrefillStage
from dualpath_cli.sim.state import DEngine, Req

__all__ = ["DecodeStage"]


@mypyc_attr(allow_interpreted_subclasses=True)
class DecodeStage(PrefillStage):
    """The decode handlers of :class:`~dualpath_cli.sim.cluster.Simulation`."""

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
        step_s = self._step_s(len(heap), de.attended)
        if self._host_cores is not None:
            step_s *= self._slowdown()
        self._push_step(de, now, step_s, version)

    def _push_step(self, de: DEngine, now: float, step_s: float, version: int) -> None:
        """Run the batch at ``step_s`` a step and schedule its next completion (as
        ``version``); the hot handlers call it directly where no host-core contention
        applies (``_reschedule``'s common case)."""
        de.step_s = step_s
        wait = de.heap[0][0] - de.steps
        wait = wait * step_s if wait > 0.0 else 0.0  # max(0.0, wait) * step_s
        heappush(self._heap, (now + wait, self._ticket(), self.K_STEP, (de, version)))

    def _step_s(self, batch: int, attended: int) -> float:
        """Core's ``CostModel.decode_step_s``, its linear part looked up per batch size
        (the same floats: the same operations in the same order, computed once per size)."""
        fixed = self._fixed_step_s
        if fixed is not None:
            return fixed
        kv = attended * self._kvpt / self._hbm_bw
        linear = self._linear_s.get(batch)
        if linear is None:
            linear = self._linear_s[batch] = self.cost.model.linear_flops(batch) / self.cost.flops
        return self._decode_base_s + (linear if linear > kv else kv)

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
        context = req.length + req.gen // 2  # core's CostModel.attended, inlined
        topk = self._topk
        att = (topk if topk < context else context) if topk > 0 else context
        req.attended = att
        de.attended += att
        heappush(de.heap, (de.steps + (req.gen - 1), req.rid, req))
        req.t_join = now
        if self._host_cores is None:  # _reschedule without host-core contention
            de.version += 1
            self._push_step(de, now, self._step_s(len(de.heap), de.attended), de.version)
        else:
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
            de.attended -= req.attended
            self._finish(req, de)
        if self._host_cores is None and heap:  # _reschedule's common case
            de.version += 1
            self._push_step(de, now, self._step_s(len(heap), de.attended), de.version)
        else:
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
            node = de.node
            node.dram_bytes += 2 * nbytes  # GPU -> DRAM -> storage (_dram, inlined)
            b = int(now // self._bin_s)
            bins = node.dram_bins
            bins[b] = bins.get(b, 0.0) + 2 * nbytes
            node.write.send(now, nbytes)
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
