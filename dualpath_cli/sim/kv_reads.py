"""KV reads: each part of a turn's read plan streams through its node's storage NIC into the
node's DRAM buffer.

The read plan comes from the core policy (``read_plan``, whose one line the handler runs
itself). A node's storage-NIC bandwidth is fair-shared by its engines' active reads (one per
engine at a time, FIFO behind it); a read waits while the node's DRAM buffer is full unless
the NIC is idle. Read bytes are binned per node for the SNIC series, and DRAM traffic is
counted (not queued on) for the results' ``dram_util``/``dram_peak``.

Shared reads: an engine's loader (``storage.loader``) reads a block once for every request
that asks for it while its read is queued or in flight (the later ones join it). With a
request log's block chains the simulator does the same: a job charges only the tokens of
blocks that no earlier job on its engine is still reading, and finishes behind them (the
engine's reads are FIFO). Without chains there is no block identity, and nothing is joined.
"""

from __future__ import annotations

from heapq import heappush

from mypy_extensions import mypyc_attr

from dualpath_cli.core.quota import PrefillWork
from dualpath_cli.errors import NoAvailableEngine
from dualpath_cli.sim.fetch import FetchStage
from dualpath_cli.sim.links import Flow
from dualpath_cli.sim.state import DEngine, Node, PEngine, ReadJob, Req

__all__ = ["ReadStage"]


@mypyc_attr(allow_interpreted_subclasses=True)
class ReadStage(FetchStage):
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
        pe_tokens, de_tokens = plan.pe_tokens, plan.de_tokens
        pe_job = de_job = None
        if pe_tokens:  # the PE reads the hit's first pe_tokens, the DE the rest
            pe_job = self._job(req, pe, 0, pe_tokens)
            self.read_pe_tokens += pe_tokens
        if de_tokens:
            de_job = self._job(req, de, pe_tokens, pe_tokens + de_tokens)
            self.read_de_tokens += de_tokens
        req.pending_reads = (pe_job is not None) + (de_job is not None)
        if pe_job is not None:
            pe.node.read_q += pe_job.tokens
            pe.rq.append(pe_job)
            if pe.reading is None:
                self._try_read(pe)
        if de_job is not None:
            de.node.read_q += de_job.tokens
            de.rq.append(de_job)
            if de.reading is None:
                self._try_read(de)

    def _job(self, req: Req, eng: PEngine | DEngine, lo: int, hi: int) -> ReadJob:
        """The read of hit tokens ``[lo, hi)`` of ``req``'s prompt on ``eng``: the tokens of
        chain blocks another job on ``eng`` still has to read are joined, not charged
        (module docstring); the rest are this job's own, and later jobs may join them."""
        kvpt = self._kvpt
        store = self._prefix_store
        blocks = self.plans[req.agent].blocks if store is not None else ()
        if not blocks:
            return ReadJob(req, hi - lo, (hi - lo) * kvpt, eng)
        assert store is not None
        bt = store.block_tokens
        chain = blocks[req.turn]
        pending = eng.in_flight
        job = ReadJob(req, 0, 0.0, eng)
        read = self._read_so_far(eng)
        own = 0
        owned: list[int] = []
        for j in range(lo // bt, min(len(chain), -(-hi // bt))):
            a, b = max(lo, j * bt), min(hi, (j + 1) * bt)
            key = chain[j]
            got = pending.get(key)
            joined = 0
            if got is not None and not (read is not None and got[3] is read[0]
                                        and read[1] >= got[4]):  # else delivered already
                joined = max(0, min(b, got[2]) - max(a, got[1]))
            if joined == b - a:
                continue
            own += b - a - joined
            owned.append(key)
            if got is None:
                pending[key] = [1, a, b, job, own]
            else:  # this job reads (the rest of) it now: later jobs join this read
                got[0] += 1
                got[1], got[2] = min(a, got[1]), max(b, got[2])
                got[3], got[4] = job, own
        own += max(0, hi - max(lo, len(chain) * bt))  # past the chain: never joined
        self.joined_read_tokens += hi - lo - own
        job.tokens, job.nbytes, job.owned = own, float(own * kvpt), tuple(owned)
        return job

    def _read_so_far(self, eng: PEngine | DEngine) -> tuple[ReadJob, float] | None:
        """The job ``eng`` is reading and how many of its own tokens have landed (its blocks
        are read in order; a landed block is no longer pending, and a later request that
        wants it reads it again, as the runtime's loader does); None when idle."""
        flow = eng.reading
        if flow is None:
            return None
        eng.node.snic.advance(self.loop.now)
        job: ReadJob = flow.token  # type: ignore[assignment]
        return job, (flow.size - flow.remaining) / self._kvpt

    def _try_read(self, eng: PEngine | DEngine) -> bool:
        rq = eng.rq
        if eng.reading is not None or not rq:
            return False
        job = rq[0]
        node = eng.node
        if job.nbytes <= 0:  # every block joined a read ahead of it, now landed
            rq.popleft()
            if eng.blocked:
                eng.blocked = False
                node.blocked -= 1
            self._job_done(eng, job, self.loop.now)
            return True
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
        engines = self.engines
        for flow in link.pop_done(now):
            job: ReadJob = flow.token  # type: ignore[assignment]
            eng = engines[flow.owner]
            eng.reading = None
            self._job_done(eng, job, now)
        version = link.version = link.version + 1
        if link.flows:  # next_finish() >= now: the link was just advanced to now
            heappush(self._heap, (link.next_finish(), self._ticket(), self.K_READ,
                                  (node, version)))

    def _job_done(self, eng: PEngine | DEngine, job: ReadJob, now: float) -> None:
        """``job``'s blocks landed in its node's buffer: count them, free the blocks it read
        for joining, and start the turn's prefill once its last read is done."""
        node = eng.node
        node.read_q -= job.tokens
        nbytes, start = job.nbytes, job.start
        if nbytes:  # a job that joined every block read nothing itself
            bin_s, bins = self._bin_s, node.bins
            b0, now_bin = int(start // bin_s), int(now // bin_s)
            if b0 == now_bin or now <= start:  # _bin's single-bin case, inlined
                node.read_bytes += nbytes
                bins[b0] = bins.get(b0, 0.0) + nbytes
            else:
                self._bin(node, start, now, nbytes)
            node.dram_bytes += nbytes  # written into the node's buffer (_dram, inlined)
            dram_bins = node.dram_bins
            dram_bins[now_bin] = dram_bins.get(now_bin, 0.0) + nbytes
        if job.owned:
            pending = eng.in_flight
            for key in job.owned:
                got = pending[key]
                got[0] -= 1
                if not got[0]:
                    del pending[key]
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
