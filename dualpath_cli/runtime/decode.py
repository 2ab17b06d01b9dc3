"""The decode engine (DE): DE buffer, DE read path, batched decode and block persistence.

The DE buffer (host DRAM) assembles the complete prompt KV: on the PE read path the PE sends
every layer's hit + miss KV; on the DE read path the DE's node loader reads the hit Full
Blocks from storage into its buffer, the DE streams them layer by layer over its compute NIC
to the PE, and receives back only the miss-token KV (chunk by chunk when the PE chunks the
prefill). Once every layer and the first token are in, the DE allocates HBM, copies the
prompt KV in (H2D), releases the buffer and decodes greedily. All active requests form one
batch per decode step (paper 6.5: DEs always batch everything); the reference model's batched
layer is bit-identical to single runs. Each Full Block is persisted as soon as its last
token's KV exists.
"""

from __future__ import annotations

import functools
import queue
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from dualpath_cli.core.layout import BlockKey, block_key
from dualpath_cli.runtime.attempts import EndedAttempts
from dualpath_cli.runtime.context import EngineContext
from dualpath_cli.runtime.fabric_loss import FABRIC_MISSING
from dualpath_cli.runtime.hbm import HbmExhausted
from dualpath_cli.runtime.wire import (
    Cancel,
    Decode,
    Done,
    Layer,
    PrefillDone,
    ReadFailed,
    Tokens,
    WireMessage,
)
from dualpath_cli.storage import LoadResult

__all__ = ["DecodeJob", "DecodeWorker"]


@dataclass
class DecodeJob:
    """One decode attempt of one request on this DE."""

    rid: int
    att: int
    tokens: np.ndarray
    gen: int
    cached: int
    keys: list[str]  # every hit block's key (the DE reads those past pe_tokens)
    pe_tokens: int  # hit tokens the PE reads; the DE reads [pe_tokens, cached)
    pe: str
    shaped: bool
    buffer: np.ndarray  # DE buffer [L, prompt, bytes]
    filled: list[int] = field(default_factory=list)  # miss rows received per layer
    heads: set[int] = field(default_factory=set)  # layers whose PE-read hit rows arrived
    own_loaded: bool = True  # the DE-read part of the hit is in the buffer
    first: int | None = None
    out: list[int] = field(default_factory=list)
    n_kv: int = 0  # tokens whose KV is in HBM
    persisted: int = 0  # blocks known to be in the store
    stored: int = 0  # of those, the leading ones no write failed before (Done.stored)
    last_key: BlockKey | None = None
    rx_from_pe: int = 0
    second_at: float = 0.0
    started: bool = False
    facts: dict[str, object] = field(default_factory=dict)  # Done.facts: the DE's reads
    cancelled: bool = False
    stream: bool = False  # report each step's tokens (Tokens)
    reported: int = 0  # of ``out``, the tokens reported so far


class DecodeWorker:
    """Runs decode jobs: DE-path reads on the node loader and the batched decode loop."""

    def __init__(self, ctx: EngineContext) -> None:
        self.ctx = ctx
        self.ns = ctx.namespace
        self.jobs: dict[int, DecodeJob] = {}
        self._early: dict[int, list[Layer | PrefillDone]] = {}
        self._ended = EndedAttempts()
        self._lock = threading.Lock()
        self._ready: queue.Queue[DecodeJob | None] = queue.Queue()
        threading.Thread(target=self._decode_loop, daemon=True, name="de-decode").start()

    # -- messages -----------------------------------------------------------------------
    def handle(self, msg: WireMessage) -> None:
        """Dispatch one message from the scheduler or a PE."""
        if isinstance(msg, Decode):
            self._on_decode(msg)
            return
        if isinstance(msg, Cancel):
            with self._lock:
                held = self.jobs.get(msg.rid)
                job = (self.jobs.pop(msg.rid) if self._ended.cancel(
                    msg.rid, msg.att, held.att if held is not None else -1) else None)
                if held is None or job is not None:  # (a newer job held: its early stay)
                    self._early.pop(msg.rid, None)
            if job is not None:
                job.cancelled = True
            return
        if not isinstance(msg, Layer | PrefillDone):
            return
        with self._lock:
            job = self.jobs.get(msg.rid)
            if job is None or job.att != msg.att:
                # a cancelled or replaced attempt's late message is dropped; a newer
                # attempt's that overtook its Decode waits for it
                if not self._ended.stale(msg.rid, msg.att,
                                         job.att if job is not None else -1):
                    self._early.setdefault(msg.rid, []).append(msg)
                return
        if isinstance(msg, Layer):
            self._on_layer(job, msg.layer, msg.start, msg.frames)
        else:
            job.first = msg.token
            if self._pe_rows_missing(job):
                return
            self._maybe_ready(job)

    def _on_decode(self, m: Decode) -> None:
        ctx = self.ctx
        with self._lock:
            held = self.jobs.get(m.rid)
            if self._ended.stale(m.rid, m.att, held.att if held is not None else -1):
                stale = True  # cancelled before it came, or a newer attempt is here
            else:
                stale = False
                if held is not None and held.att < m.att:  # its Cancel is still on the way
                    held.cancelled = True
                    self._ended.end(m.rid, held.att)
        if stale:
            ctx.dispatched(m.seq)
            return
        tokens = m.prompt()
        job = DecodeJob(m.rid, m.att, tokens, m.gen, m.cached, list(m.keys), m.pe_tokens,
                        m.pe, m.shaped, np.zeros((ctx.n_layers, len(tokens), ctx.bpl), np.uint8),
                        filled=[0] * ctx.n_layers, stream=m.stream)
        job.persisted = job.stored = len(job.keys)
        if job.keys:
            job.last_key = BlockKey.from_hex(job.keys[-1])
        with self._lock:
            self.jobs[job.rid] = job
            early = [e for e in self._early.pop(job.rid, []) if e.att == job.att]
        submit = None
        if job.cached > job.pe_tokens:
            job.own_loaded = False
            first = job.pe_tokens // ctx.bt
            submit = functools.partial(ctx.read_blocks, job.keys[first:],
                                       functools.partial(self._loaded, job, first))
        ctx.dispatched(m.seq, submit)
        for e in early:
            self.handle(e)

    def _loaded(self, job: DecodeJob, first: int, result: LoadResult) -> None:
        """Loader callback (DE read path): fill the DE buffer, stream Layer Blocks to the PE."""
        ctx, bt = self.ctx, self.ctx.bt
        ctx.report_queue()
        good = result.hit_prefix
        if good < len(result.keys) or job.cancelled:
            result.release()
            if not job.cancelled:
                ctx.counters.add(corrupt_blocks=result.corrupt)
                ctx.to_ctl(ReadFailed(ctx.spec.engine_id, job.rid, job.att, first + good,
                                      f"{result.why(good)}: missing or corrupt block"))
            return
        job.facts = {"de_dram_blocks": result.dram_hits, "de_store_blocks": result.store_hits,
                     "de_dram_misses": dict(result.dram_misses),
                     "de_snic_bytes": sum(b.nbytes for b in result.blocks
                                          if b is not None and b.tier == "store")}
        for i, block in enumerate(result.blocks):
            assert block is not None
            b = first + i
            job.buffer[:, b * bt:(b + 1) * bt] = block.array().view(np.uint8)
        result.release()
        job.own_loaded = True
        for layer in range(ctx.n_layers):  # stream Layer Blocks to the PE
            ctx.send_kv(job.pe, Layer(job.rid, job.att, layer, 0,
                                      (job.buffer[layer, job.pe_tokens:job.cached],)),
                        job.shaped)
        self._maybe_ready(job)

    def _on_layer(self, job: DecodeJob, layer: int, start: int,
                  parts: tuple[np.ndarray, ...]) -> None:
        head, miss = parts  # the PE-read hit rows (first chunk only) and new KV rows
        if head.shape[0]:
            job.buffer[layer, :head.shape[0]] = head
        if job.pe_tokens == 0 or head.shape[0]:
            job.heads.add(layer)
        job.buffer[layer, start:start + miss.shape[0]] = miss
        job.filled[layer] += miss.shape[0]
        nbytes = head.nbytes + miss.nbytes
        job.rx_from_pe += nbytes
        self.ctx.counters.add(kv_rx_from_pe_bytes=nbytes)
        self.ctx.m_nic["cnic", "rx"].inc(nbytes)
        self._maybe_ready(job)

    def _pe_rows_missing(self, job: DecodeJob) -> bool:
        """After the PE's PrefillDone, which it sends after every Layer of the attempt over
        the same ordered link: rows still missing were lost on the fabric (a link that
        dropped what it queued). Tell the scheduler, which runs the turn again."""
        want = len(job.tokens) - job.cached
        with self._lock:
            complete = len(job.heads) >= self.ctx.n_layers and all(
                f >= want for f in job.filled)
            if complete or job.started:
                return False
            self.jobs.pop(job.rid, None)
        job.cancelled = True
        self.ctx.to_ctl(ReadFailed(self.ctx.spec.engine_id, job.rid, job.att, -1,
                                   f"{FABRIC_MISSING} {job.pe} missing after its "
                                   "prefill finished"))
        return True

    def _maybe_ready(self, job: DecodeJob) -> None:
        want = len(job.tokens) - job.cached
        with self._lock:
            if job.started or job.first is None or not job.own_loaded:
                return
            if len(job.heads) < self.ctx.n_layers or any(f < want for f in job.filled):
                return
            job.started = True
        self._ready.put(job)

    # -- decode -------------------------------------------------------------------------
    def _start(self, job: DecodeJob) -> bool:
        ctx = self.ctx
        need = ctx.hbm.blocks_for_tokens(len(job.tokens) + job.gen)
        try:
            ctx.hbm.allocate(job.rid, need)
        except HbmExhausted:
            if ctx.hbm.stats().free_blocks < need:
                return False
            ctx.hbm.compact()
            ctx.hbm.allocate(job.rid, need)
        ctx.h2d(job.buffer.nbytes, job.shaped)
        for layer in range(ctx.n_layers):
            ctx.hbm_write(job.rid, layer, 0, job.buffer[layer])
        job.buffer = np.zeros((0, 0, 0), np.uint8)  # release the DE buffer
        job.n_kv = len(job.tokens)
        job.out = [int(job.first or 0)]
        self._persist_full_blocks(job)
        return True

    def _seq(self, job: DecodeJob) -> np.ndarray:
        return np.concatenate([job.tokens, np.asarray(job.out, dtype=np.int64)])

    def _persist_full_blocks(self, job: DecodeJob) -> None:
        """Write every newly completed Full Block (GPU -> DRAM -> storage)."""
        ctx, bt = self.ctx, self.ctx.bt
        full = job.n_kv // bt
        if full <= job.persisted:
            return
        seq = self._seq(job)
        while job.persisted < full:
            i = job.persisted
            key = block_key(job.last_key, seq[i * bt:(i + 1) * bt].tolist(), self.ns)
            block = ctx.hbm.copy_block(job.rid, i)
            ctx.h2d(block.nbytes, job.shaped)  # D2H through the compute NIC
            if ctx.write_block(key, block, job.shaped) and job.stored == i:
                job.stored = i + 1
            job.last_key = key
            job.persisted += 1

    def _step(self, jobs: list[DecodeJob]) -> None:
        """One decode step of every active request, as one batch."""
        ctx, model = self.ctx, self.ctx.model
        hiddens = [model.embed(np.asarray(job.out[-1:], dtype=np.int64)) for job in jobs]
        for layer in range(ctx.n_layers):
            pasts = [ctx.hbm_read(job.rid, layer, job.n_kv) for job in jobs]
            hiddens, kvs = model.forward_layer_batch(layer, hiddens, pasts)
            for job, kv in zip(jobs, kvs, strict=True):
                ctx.hbm_write(job.rid, layer, job.n_kv, kv.pack())
        now = time.monotonic()
        for job, hidden in zip(jobs, hiddens, strict=True):
            job.n_kv += 1
            job.out.append(model.next_token(hidden[-1]))
            if len(job.out) == 2:
                job.second_at = now
            self._persist_full_blocks(job)

    def _report(self, jobs: list[DecodeJob]) -> None:
        """The streamed turns' new tokens, in one message for the step (none streamed: no
        message, so a turn that did not ask costs nothing)."""
        fresh = [job for job in jobs if job.stream and len(job.out) > job.reported]
        if not fresh:
            return
        ctx = self.ctx
        ctx.to_ctl(Tokens(ctx.spec.engine_id, tuple(j.rid for j in fresh),
                          tuple(j.att for j in fresh), tuple(j.reported for j in fresh),
                          tuple(tuple(j.out[j.reported:]) for j in fresh)))
        for job in fresh:
            job.reported = len(job.out)

    def _finish(self, job: DecodeJob) -> None:
        self.ctx.hbm.free(job.rid)
        with self._lock:
            if self.jobs.get(job.rid) is job:
                del self.jobs[job.rid]
        if not job.cancelled:
            self.ctx.to_ctl(Done(self.ctx.spec.engine_id, job.rid, job.att, tuple(job.out),
                                 job.rx_from_pe, time.monotonic(), job.second_at, job.facts,
                                 job.stored))

    def _decode_loop(self) -> None:
        active: list[DecodeJob] = []
        waiting: list[DecodeJob] = []
        while True:
            try:
                if not active:  # idle (or HBM-blocked): wait for news
                    item = self._ready.get(timeout=None if not waiting else 0.01)
                    if item is None:
                        return
                    waiting.append(item)
                while True:
                    item = self._ready.get_nowait()
                    if item is None:
                        return
                    waiting.append(item)
            except queue.Empty:
                pass
            for job in list(waiting):
                if job.cancelled:
                    waiting.remove(job)
                elif self._start(job):
                    waiting.remove(job)
                    if job.gen <= 1:
                        self._finish(job)
                    else:
                        active.append(job)
                else:
                    break
            for job in [j for j in active if j.cancelled]:
                active.remove(job)
                self.ctx.hbm.free(job.rid)
            if not active:
                continue
            t0 = time.monotonic()
            batch = len(active)
            self._step(active)
            self._report(active)
            for job in [j for j in active if len(j.out) >= j.gen]:
                active.remove(job)
                self._finish(job)
            self.ctx.counters.add(busy_s=time.monotonic() - t0, batches=1,
                                  batched_items=batch)

    def jobs_in_hand(self) -> int:
        """Requests this DE holds (for the heartbeat)."""
        return len(self.jobs)

    def close(self) -> None:
        """Stop the decode thread."""
        self._ready.put(None)
