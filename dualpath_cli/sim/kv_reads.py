"""KV reads: each part of a turn's read plan streams through its node's storage NIC into the
node's DRAM buffer.

The read plan comes from the core policy (``read_plan``, whose one line the handler runs
itself). A node's storage-NIC bandwidth is fair-shared by its engines' active reads (one per
engine at a time, FIFO behind it); a read waits while the node's DRAM buffer is full unless
the NIC is idle. Read bytes are binned per node for the SNIC series, and DRAM traffic is
counted (not queued on) for the results' ``dram_util``/``dram_peak``.
"""

from __future__ import annotations

from heapq import heappush

from dualpath_cli.core.quota import PrefillWork
from dualpath_cli.errors import NoAvailableEngine
from dualpath_cli.sim.base import SimBase
from dualpath_cli.sim.links import Flow
from dualpath_cli.sim.state import DEngine, Node, PEngine, ReadJob, Req

__all__ = ["ReadStage"]


class ReadStage(SimBase):
    """The read handlers of :class:`~dualpath_cli.sim.cluster.Simulation`."""

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
            plan = pol.plan(req.core, pe_snap, de_snap, self.params, self.ordinal)  # read_plan
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
        engines, bin_s, bins, dram_bins = self.engines, self._bin_s, node.bins, node.dram_bins
        now_bin = int(now // bin_s)
        for flow in link.pop_done(now):
            job: ReadJob = flow.token  # type: ignore[assignment]
            eng = engines[flow.owner]
            eng.reading = None
            node.read_q -= job.tokens
            nbytes, start = job.nbytes, job.start
            b0 = int(start // bin_s)
            if b0 == now_bin or now <= start:  # _bin's single-bin case, inlined
                node.read_bytes += nbytes
                bins[b0] = bins.get(b0, 0.0) + nbytes
            else:
                self._bin(node, start, now, nbytes)
            node.dram_bytes += nbytes  # written into the node's buffer (_dram, inlined)
            dram_bins[now_bin] = dram_bins.get(now_bin, 0.0) + nbytes
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
        node.dram_bytes += nbytes  # _dram, inlined
        b = int(self.loop.now // self._bin_s)
        bins = node.dram_bins
        bins[b] = bins.get(b, 0.0) + nbytes
        node.buffer_free += nbytes
        if node.blocked:  # else every engine of the node is reading or has nothing queued
            for eng in node.engines:
                if eng.reading is None and eng.rq:
                    self._try_read(eng)
