"""Prefill: a PE packs its loaded turns into batches under the compute quota (core
``pack_batch``) and runs them; after a turn's last chunk its first token exists (TTFT) and
its KV goes to its DE (streamed per layer with layerwise prefill, after the prefill
otherwise) through the compute NICs, a FIFO server per GPU and direction.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from heapq import heappush

from mypy_extensions import mypyc_attr

from dualpath_cli.core.quota import PrefillWork, pack_batch
from dualpath_cli.sim.kv_reads import ReadStage
from dualpath_cli.sim.state import PEngine, Req

__all__ = ["PrefillStage"]


def _hbm_prefix(ready: Iterable[PrefillWork], hbm_tokens: int) -> Iterator[PrefillWork]:
    """The head of ``ready`` whose whole prompts fit in ``hbm_tokens`` (always the first)."""
    used = 0
    for i, w in enumerate(ready):
        used += w.cached + w.bsz
        if used > hbm_tokens and i > 0:
            return
        yield w


@mypyc_attr(allow_interpreted_subclasses=True)
class PrefillStage(ReadStage):
    """The prefill handlers of :class:`~dualpath_cli.sim.cluster.Simulation`."""

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
        if self._prefix_store is not None:  # ... and so are the prompt's blocks
            blocks = self.plans[req.agent].blocks
            if blocks:
                self._prefix_store.store(blocks[req.turn])
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
            node = de.node  # into the DE buffer, then out to HBM (_dram, inlined)
            node.dram_bytes += sent + full
            b = int(now // self._bin_s)
            bins = node.dram_bins
            bins[b] = bins.get(b, 0.0) + (sent + full)
        heappush(self._heap, (t, self._ticket(), self.K_JOIN, req))  # t >= now
