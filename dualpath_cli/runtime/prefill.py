"""The prefill engine (PE): layerwise prefill on either read path (paper section 4).

PE read path: storage -> PE buffer (Full Blocks through the node's storage NIC) -> per layer,
the Layer Block is copied into PE HBM (compute-NIC loopback) just before that layer runs ->
the layer's full prompt KV (hit + miss) goes to the DE buffer.
DE read path: the DE streams hit Layer Blocks over its compute NIC into PE HBM, one per
layer; after each layer only the miss-token KV goes back to the DE.
Split read: the PE reads the first ``pe_tokens`` of the hit, the DE the rest; a layer is
ready when both parts are in HBM, and the PE returns exactly what the DE lacks.

Layerwise: layer l+1's blocks load while layer l computes; the time compute waits for a
layer is the attention bubble. ``layerwise=False`` (basic) loads every layer before compute.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dualpath_cli.core.layout import BlockKey
from dualpath_cli.runtime.context import EngineContext
from dualpath_cli.runtime.hbm import HbmExhausted
from dualpath_cli.storage.errors import CorruptBlockError
from dualpath_cli.transfer.base import Message

__all__ = ["PrefillJob", "PrefillWorker"]


@dataclass
class PrefillJob:
    """One prefill attempt of one request on this PE."""

    rid: int
    att: int = -1
    tokens: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    cached: int = 0
    keys: list[str] = field(default_factory=list)  # the blocks this PE reads
    pe_tokens: int = 0  # hit tokens read on the PE side (a block-aligned prefix)
    de: str = ""
    layerwise: bool = True
    shaped: bool = True
    known: bool = False
    queued: bool = False
    buffer: np.ndarray | None = None  # PE buffer (PE read path) [L, cached, bytes]
    hit: dict[int, np.ndarray] = field(default_factory=dict)  # DE path layer blocks
    ready: list[threading.Event] = field(default_factory=list)
    parts: list[int] = field(default_factory=list)  # parts each layer still waits for
    cancelled: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def de_tokens(self) -> int:
        """Hit tokens the DE reads and streams here."""
        return self.cached - self.pe_tokens

    def part_done(self, layer: int) -> None:
        """One source (PE buffer or DE) of ``layer`` has landed."""
        with self.lock:
            self.parts[layer] -= 1
            if self.parts[layer] <= 0:
                self.ready[layer].set()


class PrefillWorker:
    """Runs prefill jobs: one reader (storage), one compute thread, H2D copier per job."""

    def __init__(self, ctx: EngineContext) -> None:
        self.ctx = ctx
        self.jobs: dict[int, PrefillJob] = {}
        self._lock = threading.Lock()
        self._reads: queue.Queue[PrefillJob | None] = queue.Queue()
        self._compute: queue.Queue[PrefillJob | None] = queue.Queue()
        for target, name in ((self._read_loop, "read"), (self._compute_loop, "compute")):
            threading.Thread(target=target, daemon=True, name=f"pe-{name}").start()

    # -- messages -----------------------------------------------------------------------
    def handle(self, msg: Message) -> None:
        """Dispatch one message from the scheduler or a DE."""
        h = msg.header
        if msg.kind == "prefill":
            self._on_prefill(h)
        elif msg.kind == "layer":
            self._on_layer(h, msg.buffers[0])
        elif msg.kind == "cancel":
            with self._lock:
                job = self.jobs.pop(int(h["rid"]), None)
            if job is not None:
                job.cancelled = True
                for ev in job.ready:
                    ev.set()

    def _job(self, rid: int, att: int) -> PrefillJob:
        with self._lock:
            job = self.jobs.get(rid)
            if job is None or job.att != att:
                job = PrefillJob(rid, att,
                                 ready=[threading.Event() for _ in range(self.ctx.n_layers)],
                                 parts=[0] * self.ctx.n_layers)
                self.jobs[rid] = job
            return job

    def _on_prefill(self, h: dict[str, Any]) -> None:
        job = self._job(int(h["rid"]), int(h["att"]))
        job.tokens = np.asarray(h["tokens"], dtype=np.int64)
        job.cached = int(h["cached"])
        job.keys = list(h["keys"])
        job.pe_tokens = int(h["pe_tokens"])
        job.de = str(h["de"])
        job.layerwise = bool(h["layerwise"])
        job.shaped = bool(h["shaped"])
        with job.lock:
            sources = int(job.pe_tokens > 0) + int(job.de_tokens > 0)
            for layer in range(self.ctx.n_layers):
                job.parts[layer] += sources
                if job.parts[layer] <= 0:
                    job.ready[layer].set()
                else:
                    job.ready[layer].clear()
        job.known = True
        if job.pe_tokens:
            self._reads.put(job)
        elif job.cached == 0 or job.hit:  # nothing to read, or DE blocks already arriving
            self._enqueue(job)

    def _on_layer(self, h: dict[str, Any], kv: np.ndarray) -> None:
        job = self._job(int(h["rid"]), int(h["att"]))
        layer = int(h["layer"])
        job.hit[layer] = kv
        self.ctx.counters.add(kv_rx_from_de_bytes=kv.nbytes)
        job.part_done(layer)
        if job.known and not job.pe_tokens:
            self._enqueue(job)

    def _enqueue(self, job: PrefillJob) -> None:
        with self._lock:
            if job.queued:
                return
            job.queued = True
        self._compute.put(job)

    # -- storage reader (PE read path) --------------------------------------------------
    def _read_loop(self) -> None:
        while True:
            job = self._reads.get()
            if job is None:
                return
            if job.cancelled:
                continue
            buf = np.empty((self.ctx.n_layers, job.pe_tokens, self.ctx.bpl), dtype=np.uint8)
            bt = self.ctx.bt
            try:
                for i, key in enumerate(job.keys):
                    block = self.ctx.read_block(BlockKey.from_hex(key), job.shaped)
                    if block is None:
                        raise CorruptBlockError(key, "missing")
                    buf[:, i * bt:(i + 1) * bt] = block
            except CorruptBlockError as err:
                self.ctx.counters.add(corrupt_blocks=1)
                self.ctx.to_ctl({"t": "read_failed", "rid": job.rid, "att": job.att,
                                 "block": i, "why": str(err)})
                continue
            finally:
                self.ctx.to_ctl({"t": "read_done", "rid": job.rid, "att": job.att,
                                 "tokens": job.pe_tokens})
            job.buffer = buf
            self._enqueue(job)

    def _h2d_loop(self, job: PrefillJob) -> None:
        """Copy PE-buffer Layer Blocks into HBM, one layer at a time (runs ahead of compute)."""
        assert job.buffer is not None
        for layer in range(self.ctx.n_layers):
            if job.cancelled:
                return
            lb = job.buffer[layer]
            self.ctx.h2d(lb.nbytes, job.shaped)
            self.ctx.hbm_write(job.rid, layer, 0, lb)
            job.part_done(layer)

    # -- compute ------------------------------------------------------------------------
    def _compute_loop(self) -> None:
        while True:
            job = self._compute.get()
            if job is None:
                return
            if job.cancelled:
                continue
            try:
                self._prefill(job)
            except HbmExhausted as err:
                self.ctx.to_ctl({"t": "read_failed", "rid": job.rid, "att": job.att,
                                 "block": -1, "why": str(err)})
            finally:
                self.ctx.hbm.free(job.rid)
                with self._lock:
                    if self.jobs.get(job.rid) is job:
                        del self.jobs[job.rid]

    def _wait_layer(self, job: PrefillJob, layer: int) -> float:
        t0 = time.monotonic()
        job.ready[layer].wait()
        return time.monotonic() - t0

    def _prefill(self, job: PrefillJob) -> None:
        ctx, model = self.ctx, self.ctx.model
        n_total = len(job.tokens)
        try:
            ctx.hbm.allocate(job.rid, ctx.hbm.blocks_for_tokens(n_total))
        except HbmExhausted:
            ctx.hbm.compact()
            ctx.hbm.allocate(job.rid, ctx.hbm.blocks_for_tokens(n_total))
        if job.pe_tokens:  # PE buffer -> HBM, running ahead of compute
            threading.Thread(target=self._h2d_loop, args=(job,), daemon=True).start()
        bubble = wait = 0.0
        if not job.layerwise:
            for layer in range(ctx.n_layers):
                wait += self._wait_layer(job, layer)
        t_start = time.monotonic()
        hidden = model.embed(job.tokens[job.cached:])
        pending: list[tuple[int, list[np.ndarray]]] = []
        for layer in range(ctx.n_layers):
            waited = self._wait_layer(job, layer)
            if job.cancelled:
                return
            bubble += waited
            if job.de_tokens:
                ctx.hbm_write(job.rid, layer, job.pe_tokens, job.hit.pop(layer))
            past = ctx.hbm_read(job.rid, layer, job.cached)
            hidden, new_kv = model.forward_layer(layer, hidden, past, job.cached)
            ctx.hbm_write(job.rid, layer, job.cached, new_kv)
            # the DE lacks the PE-read part of the hit and the miss tokens: send just those
            out = [np.ascontiguousarray(past[:job.pe_tokens]), new_kv]
            if job.layerwise:
                ctx.send_kv(job.de, {"t": "layer", "rid": job.rid, "att": job.att,
                                     "layer": layer}, out, job.shaped)
            else:
                pending.append((layer, out))
        first = model.next_token(hidden[-1])
        t_end = time.monotonic()
        ctx.counters.add(busy_s=t_end - t_start - bubble, bubble_s=bubble, load_wait_s=wait)
        for layer, out in pending:
            ctx.send_kv(job.de, {"t": "layer", "rid": job.rid, "att": job.att,
                                 "layer": layer}, out, job.shaped)
        ctx.to_ctl({"t": "first", "rid": job.rid, "att": job.att, "token": first,
                    "at": t_end})
        ctx.send_kv(job.de, {"t": "prefill_done", "rid": job.rid, "att": job.att,
                             "token": first}, [], False)

    def report(self) -> dict[str, Any]:
        """Engine-specific report fields."""
        st = self.ctx.hbm.stats()
        return {"hbm_free_tokens": st.free_blocks * self.ctx.bt, "jobs": len(self.jobs)}

    def close(self) -> None:
        """Stop worker threads."""
        self._reads.put(None)
        self._compute.put(None)
