"""The prefill engine (PE): layerwise prefill on either read path (paper section 4), batched.

PE read path: storage -> PE buffer (Full Blocks read by the node's StorageLoader through its
storage NIC) -> per layer, the Layer Blocks are copied into PE HBM (compute-NIC loopback)
just before that layer runs -> the layer's full prompt KV (hit + miss) goes to the DE buffer.
DE read path: the DE streams hit Layer Blocks over its compute NIC into PE HBM, one per
layer; after each layer only the miss-token KV goes back to the DE.
Split read: the PE reads the first ``pe_tokens`` of the hit, the DE the rest; a layer is
ready when both parts are in HBM, and the PE returns exactly what the DE lacks.

Layerwise: layer l+1's blocks load while layer l computes; the time compute waits for a
layer is the attention bubble. ``layerwise=False`` (basic) loads every layer before compute.
A job is queued for compute only once its PE-read Full Blocks are all in the PE buffer (and
the DE's first layer is here), so a slow store read delays the whole prefill rather than
one layer: that wait, from the prefill's arrival to its queueing, is counted as
``kv_wait_s`` (the per-layer slack, measured after it, cannot see it).

Intra-engine batching (paper 6.5): ready requests wait in a FIFO of ``(cached, bsz)`` work;
each forward batch is :func:`dualpath_cli.core.quota.pack_batch` under the compute quota with
a predictor from the model profile's FLOPs at a calibrated rate. A request cut by the quota
is chunked: its remainder stays at the head with ``cached`` advanced (chunked prefill), and
every chunk's new KV goes to the DE as it is computed.
"""

from __future__ import annotations

import functools
import itertools
import queue
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from dualpath_cli.core.quota import PrefillWork, pack_batch
from dualpath_cli.core.reference_model import model_config
from dualpath_cli.runtime.attempts import EndedAttempts
from dualpath_cli.runtime.context import EngineContext
from dualpath_cli.runtime.hbm import HbmExhausted
from dualpath_cli.runtime.wire import (
    Cancel,
    First,
    Layer,
    Prefill,
    PrefillDone,
    ReadFailed,
    WireMessage,
)
from dualpath_cli.storage import LoadedBlock, LoadResult

__all__ = ["PrefillJob", "PrefillWorker"]

_serial = itertools.count()


@dataclass
class PrefillJob:
    """One prefill attempt of one request on this PE."""

    rid: int
    att: int = -1
    serial: int = field(default_factory=lambda: next(_serial))
    tokens: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    cached: int = 0
    keys: list[str] = field(default_factory=list)  # the blocks this PE reads
    pe_tokens: int = 0  # hit tokens read on the PE side (a block-aligned prefix)
    de: str = ""
    layerwise: bool = True
    shaped: bool = True
    known: bool = False
    known_at: float = 0.0  # when the prefill message arrived
    queued: bool = False
    loaded: bool = False  # PE-side blocks are in the PE buffer
    blocks: list[LoadedBlock] = field(default_factory=list)  # PE buffer (loader buffers)
    hit: dict[int, np.ndarray] = field(default_factory=dict)  # DE path layer rows
    ready: list[threading.Event] = field(default_factory=list)
    parts: list[int] = field(default_factory=list)  # parts each layer still waits for
    ready_at: dict[int, float] = field(default_factory=dict)  # layer -> when it became ready
    started: bool = False  # HBM allocated, H2D running
    h2d_running: bool = False
    cancelled: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)
    # the request's story for the scheduler (First.facts): monotonic times, reads, slack
    arrived_at: float = 0.0
    compute_at: float = 0.0
    kv_bubble_s: float = 0.0
    slack: list[float | None] = field(default_factory=list)
    reads: dict[str, int] = field(default_factory=dict)
    dram_misses: dict[str, int] = field(default_factory=dict)

    def facts(self) -> dict[str, object]:
        """What this PE saw of the request: arrival, KV ready (layer 0, or every layer
        without layerwise), compute start, compute's waits for KV, reads and slack."""
        ready = list(self.ready_at.values()) if not self.layerwise else [
            self.ready_at.get(0, self.arrived_at)]
        return {"arrived": self.arrived_at, "kv_ready": max(ready or [self.arrived_at]),
                "compute": self.compute_at, "kv_bubble_s": self.kv_bubble_s,
                "slack_s": list(self.slack) if self.cached else [], "pe_tokens": self.pe_tokens,
                "de_tokens": self.de_tokens, "pe_dram_misses": dict(self.dram_misses),
                **self.reads}

    @property
    def de_tokens(self) -> int:
        """Hit tokens the DE reads and streams here."""
        return self.cached - self.pe_tokens

    def part_done(self, layer: int) -> None:
        """One source (PE buffer or DE) of ``layer`` has landed."""
        with self.lock:
            self.parts[layer] -= 1
            if self.parts[layer] <= 0:
                self.ready_at[layer] = time.monotonic()
                self.ready[layer].set()

    def release(self) -> None:
        """Give the PE buffer back to the loader's pool."""
        for b in self.blocks:
            b.release()
        self.blocks = []


class PrefillWorker:
    """Runs prefill jobs: storage reads on the loader, H2D copies, one batched compute thread."""

    def __init__(self, ctx: EngineContext) -> None:
        self.ctx = ctx
        self.jobs: dict[int, PrefillJob] = {}
        self._ended = EndedAttempts()
        self._lock = threading.Lock()
        self._compute: queue.Queue[PrefillJob | None] = queue.Queue()
        profile = model_config(ctx.spec.model).to_profile()
        rate = ctx.spec.flops_rate
        self.predict = lambda cached, bsz: profile.prefill_flops(cached, bsz) / rate
        self.flops = profile.prefill_flops
        threading.Thread(target=self._compute_loop, daemon=True, name="pe-compute").start()

    # -- messages -----------------------------------------------------------------------
    def handle(self, msg: WireMessage) -> None:
        """Dispatch one message from the scheduler or a DE."""
        if isinstance(msg, Prefill):
            self._on_prefill(msg)
        elif isinstance(msg, Layer):
            self._on_layer(msg)
        elif isinstance(msg, Cancel):
            with self._lock:
                held = self.jobs.get(msg.rid)
                job = (self.jobs.pop(msg.rid) if self._ended.cancel(
                    msg.rid, msg.att, held.att if held is not None else -1) else None)
            if job is not None:
                job.cancelled = True
                for ev in job.ready:
                    ev.set()

    def _job(self, rid: int, att: int) -> PrefillJob | None:
        """Attempt ``att``'s job, made by its first message (the Prefill, or a DE's Layer
        that overtook it); ``None`` for a late message of an attempt that was replaced or
        cancelled. Why: a DE's Layers travel on another socket than the scheduler's
        messages, so a dead DE's last Layer can land after the next attempt's Prefill;
        taking it would replace that attempt's job and strand the turn."""
        with self._lock:
            job = self.jobs.get(rid)
            if self._ended.stale(rid, att, job.att if job is not None else -1):
                return None
            if job is None or job.att != att:
                job = PrefillJob(rid, att,
                                 ready=[threading.Event() for _ in range(self.ctx.n_layers)],
                                 parts=[0] * self.ctx.n_layers)
                self.jobs[rid] = job
            return job

    def _on_prefill(self, m: Prefill) -> None:
        job = self._job(m.rid, m.att)
        if job is None:
            return
        forward = m.decode(self.ctx.ep.address)
        if forward is not None:  # the DE's part, ahead of this turn's KV on the same link
            self.ctx.send_kv(m.de, forward, False)
        job.tokens = m.prompt()
        job.cached = m.cached
        job.keys = list(m.pe_keys(self.ctx.bt))
        job.pe_tokens = m.pe_tokens
        job.de = m.de
        job.layerwise = m.layerwise
        job.shaped = m.shaped
        with job.lock:
            sources = int(job.pe_tokens > 0) + int(job.de_tokens > 0)
            for layer in range(self.ctx.n_layers):
                job.parts[layer] += sources
                if job.parts[layer] <= 0:
                    job.ready_at.setdefault(layer, time.monotonic())
                    job.ready[layer].set()
                else:
                    job.ready[layer].clear()
        job.known_at = time.monotonic()
        job.known = True
        job.arrived_at = time.monotonic()
        self.ctx.dispatched(m.seq, functools.partial(
            self.ctx.read_blocks, job.keys, functools.partial(self._loaded, job))
            if job.pe_tokens else None)
        self._maybe_enqueue(job)

    def _loaded(self, job: PrefillJob, result: LoadResult) -> None:
        """Loader callback: the PE buffer is full, or a block was missing/corrupt."""
        self.ctx.report_queue()
        good = result.hit_prefix
        if good < len(job.keys) or job.cancelled:
            result.release()
            if not job.cancelled:
                self.ctx.counters.add(corrupt_blocks=result.corrupt)
                self.ctx.to_ctl(ReadFailed(self.ctx.spec.engine_id, job.rid, job.att, good,
                                           f"{result.why(good)}: missing or corrupt block"))
            return
        job.blocks = [b for b in result.blocks if b is not None]
        job.dram_misses = dict(result.dram_misses)
        job.reads = {"pe_dram_blocks": result.dram_hits, "pe_store_blocks": result.store_hits,
                     "pe_snic_bytes": sum(b.nbytes for b in job.blocks if b.tier == "store")}
        job.loaded = True
        self._maybe_enqueue(job)

    def _on_layer(self, m: Layer) -> None:
        job = self._job(m.rid, m.att)
        if job is None:
            return
        layer = m.layer
        kv = m.frames[0]
        job.hit[layer] = kv
        self.ctx.counters.add(kv_rx_from_de_bytes=kv.nbytes)
        job.reads["peer_bytes"] = job.reads.get("peer_bytes", 0) + kv.nbytes
        self.ctx.m_nic["cnic", "rx"].inc(kv.nbytes)
        job.part_done(layer)
        self._maybe_enqueue(job)

    def _maybe_enqueue(self, job: PrefillJob) -> None:
        """Queue for compute once the PE buffer is loaded and the DE's first layer is here."""
        if not job.known or (job.pe_tokens and not job.loaded):
            return
        if job.de_tokens and 0 not in job.hit and not job.ready[0].is_set():
            return
        with self._lock:
            if job.queued:
                return
            job.queued = True
        if job.cached:  # the whole hit loads before compute: this wait is the bubble
            self.ctx.counters.add(kv_wait_s=time.monotonic() - job.known_at, kv_waits=1)
        self._compute.put(job)

    # -- H2D (PE read path) -------------------------------------------------------------
    def _h2d_loop(self, job: PrefillJob) -> None:
        """Copy PE-buffer Layer Blocks into HBM, one layer at a time (runs ahead of compute)."""
        ctx, bt = self.ctx, self.ctx.bt
        try:
            tiers: dict[str, int] = {}
            for b in job.blocks:
                tiers[b.tier] = tiers.get(b.tier, 0) + 1
            for layer in range(ctx.n_layers):
                if job.cancelled:
                    return
                for i, block in enumerate(job.blocks):
                    rows = ctx.block_rows(block, layer)
                    ctx.h2d(rows.nbytes, job.shaped)
                    try:
                        ctx.hbm_write(job.rid, layer, i * bt, rows)
                    except IndexError:  # cancelled meanwhile: its HBM is already freed
                        return
                for tier, n in tiers.items():
                    ctx.layer_hits(layer, tier, n)
                job.part_done(layer)
        finally:
            job.release()

    # -- compute ------------------------------------------------------------------------
    def _compute_loop(self) -> None:
        works: list[PrefillWork] = []
        live: dict[int, PrefillJob] = {}
        while True:
            try:
                while True:
                    job = self._compute.get() if not works else self._compute.get_nowait()
                    if job is None:
                        return
                    live[job.serial] = job
                    works.append(PrefillWork(job.serial, job.cached, len(job.tokens) - job.cached))
            except queue.Empty:
                pass
            for w in works:
                job = live[w.request_id]
                if job.cancelled:
                    self._drop(job)
            works = [w for w in works if not live[w.request_id].cancelled]
            if not works:
                continue
            batch = pack_batch(works, self.ctx.spec.quota_s, self.predict)
            self._run_batch([(live[w.request_id], w.cached, w.bsz) for w in batch.items])
            works = list(batch.remaining)
            # forget jobs with no chunk left; a cancelled job with a chunk left stays until
            # the top of the loop drops it (deleting it here killed this thread: KeyError)
            for serial in [s for s in live if not any(w.request_id == s for w in works)]:
                del live[serial]

    def _drop(self, job: PrefillJob) -> None:
        """Forget a cancelled job (its H2D copier, if any, releases the PE buffer)."""
        if job.started:
            self.ctx.hbm.free(job.rid)
        if not job.h2d_running:
            job.release()

    def _start(self, job: PrefillJob) -> bool:
        """Allocate HBM for the whole prompt and start the H2D copier (first chunk)."""
        ctx = self.ctx
        need = ctx.hbm.blocks_for_tokens(len(job.tokens))
        try:
            ctx.hbm.allocate(job.rid, need)
        except HbmExhausted:
            ctx.hbm.compact()
            try:
                ctx.hbm.allocate(job.rid, need)
            except HbmExhausted as err:
                ctx.to_ctl(ReadFailed(ctx.spec.engine_id, job.rid, job.att, -1, str(err)))
                job.cancelled = True
                job.release()
                return False
        job.started = True
        if job.pe_tokens:
            job.h2d_running = True
            threading.Thread(target=self._h2d_loop, args=(job,), daemon=True).start()
        return True

    def _run_batch(self, items: list[tuple[PrefillJob, int, int]]) -> None:
        ctx, model = self.ctx, self.ctx.model
        wait = 0.0
        run: list[tuple[PrefillJob, int, int]] = []
        for job, start, n in items:
            first = start == job.cached
            if first and not self._start(job):
                continue
            if first and not job.layerwise:  # basic: every layer loaded before compute
                t0 = time.monotonic()
                for ev in job.ready:
                    ev.wait()
                wait += time.monotonic() - t0
            run.append((job, start, n))
        if not run:
            return
        t_start = time.monotonic()
        bubble = 0.0
        for job, start, _ in run:
            if start == job.cached:
                job.compute_at = t_start
        hiddens = [model.embed(job.tokens[start:start + n]) for job, start, n in run]
        pending: list[list[Layer]] = [[] for _ in run]
        for layer in range(ctx.n_layers):
            pasts = []
            for job, start, _ in run:
                if start == job.cached:
                    t0 = time.monotonic()
                    job.ready[layer].wait()
                    waited = time.monotonic() - t0
                    bubble += waited
                    ctx.m_bubble[layer].inc(waited)
                    ready_at = job.ready_at.get(layer)
                    if job.cached and ready_at is not None:  # negative: a bubble
                        ctx.layer_slack(layer, t0 - ready_at)
                    job.kv_bubble_s += waited
                    job.slack.append(t0 - ready_at if ready_at is not None else None)
                    rows = job.hit.pop(layer, None)
                    if job.de_tokens and rows is not None:
                        ctx.hbm_write(job.rid, layer, job.pe_tokens, rows)
                        ctx.layer_hits(layer, "peer", job.de_tokens // ctx.bt)
                pasts.append(ctx.hbm_read(job.rid, layer, start))
            hiddens, kvs = model.forward_layer_batch(layer, hiddens, pasts)
            for i, (job, start, _) in enumerate(run):
                new_kv = kvs[i].pack()
                ctx.hbm_write(job.rid, layer, start, new_kv)
                # the DE lacks the PE-read part of the hit and the miss tokens: send just those
                head = pasts[i][:job.pe_tokens] if start == job.cached else pasts[i][:0]
                msg = Layer(job.rid, job.att, layer, start,
                            (np.ascontiguousarray(head), new_kv))
                if job.layerwise and not job.cancelled:
                    ctx.send_kv(job.de, msg, job.shaped)
                else:
                    pending[i].append(msg)
        t_end = time.monotonic()
        busy = t_end - t_start - bubble
        flops = sum(self.flops(start, n) for _, start, n in run)
        if busy > 0:
            ctx.m_flops.set(flops / busy)
        ctx.counters.add(busy_s=busy, bubble_s=bubble, load_wait_s=wait, batches=1,
                         batched_items=len(run),
                         chunks=sum(1 for j, s, n in run if s + n < len(j.tokens)))
        for i, (job, start, n) in enumerate(run):
            if job.cancelled:
                continue
            for msg in pending[i]:
                ctx.send_kv(job.de, msg, job.shaped)
            if start + n < len(job.tokens):
                continue  # a chunk: the remainder stays queued
            token = model.next_token(hiddens[i][-1])
            ctx.to_ctl(First(ctx.spec.engine_id, job.rid, job.att, token, t_end, job.facts()))
            ctx.send_kv(job.de, PrefillDone(job.rid, job.att, token), False)
            ctx.hbm.free(job.rid)
            with self._lock:
                if self.jobs.get(job.rid) is job:
                    del self.jobs[job.rid]
        for job, _, _ in run:
            if job.cancelled:
                ctx.hbm.free(job.rid)

    def jobs_in_hand(self) -> int:
        """Requests this PE holds (for the heartbeat)."""
        return len(self.jobs)

    def close(self) -> None:
        """Stop the compute thread."""
        self._compute.put(None)
