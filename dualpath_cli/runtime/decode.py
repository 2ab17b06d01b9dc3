"""The decode engine (DE): DE buffer, DE read path, decode and block persistence.

The DE buffer (host DRAM) assembles the complete prompt KV: on the PE read path the PE sends
every layer's hit + miss KV; on the DE read path the DE reads the hit Full Blocks from storage
into its buffer, streams them layer by layer over its compute NIC to the PE, and receives
back only the miss-token KV. Once every layer and the first token are in, the DE allocates
HBM, copies the prompt KV in (H2D), releases the buffer and decodes greedily. All active
requests share the decode loop (one token each per round, the DE's "batch"). Each Full Block
is persisted as soon as its last token's KV exists.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dualpath_cli.core.layout import BlockKey, Namespace, block_key
from dualpath_cli.runtime.context import EngineContext
from dualpath_cli.runtime.hbm import HbmExhausted
from dualpath_cli.storage.errors import CorruptBlockError
from dualpath_cli.transfer.base import Message

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
    got: set[int] = field(default_factory=set)
    first: int | None = None
    out: list[int] = field(default_factory=list)
    n_kv: int = 0  # tokens whose KV is in HBM
    persisted: int = 0  # blocks known to be in the store
    last_key: BlockKey | None = None
    rx_from_pe: int = 0
    second_at: float = 0.0
    started: bool = False
    cancelled: bool = False


class DecodeWorker:
    """Runs decode jobs: a storage reader (DE read path) and the decode loop."""

    def __init__(self, ctx: EngineContext, namespace: Namespace) -> None:
        self.ctx = ctx
        self.ns = namespace
        self.jobs: dict[int, DecodeJob] = {}
        self._early: dict[int, list[Message]] = {}
        self._lock = threading.Lock()
        self._reads: queue.Queue[DecodeJob | None] = queue.Queue()
        self._ready: queue.Queue[DecodeJob | None] = queue.Queue()
        for target, name in ((self._read_loop, "read"), (self._decode_loop, "decode")):
            threading.Thread(target=target, daemon=True, name=f"de-{name}").start()

    # -- messages -----------------------------------------------------------------------
    def handle(self, msg: Message) -> None:
        """Dispatch one message from the scheduler or a PE."""
        h = msg.header
        rid = int(h.get("rid", -1))
        if msg.kind == "decode":
            self._on_decode(h)
            return
        if msg.kind == "cancel":
            with self._lock:
                job = self.jobs.pop(rid, None)
                self._early.pop(rid, None)
            if job is not None:
                job.cancelled = True
            return
        with self._lock:
            job = self.jobs.get(rid)
            if job is None or job.att != int(h["att"]):
                self._early.setdefault(rid, []).append(msg)
                return
        if msg.kind == "layer":
            self._on_layer(job, int(h["layer"]), msg.buffers)
        elif msg.kind == "prefill_done":
            job.first = int(h["token"])
            self._maybe_ready(job)

    def _on_decode(self, h: dict[str, Any]) -> None:
        tokens = np.asarray(h["tokens"], dtype=np.int64)
        job = DecodeJob(int(h["rid"]), int(h["att"]), tokens, int(h["gen"]), int(h["cached"]),
                        list(h["keys"]), int(h["pe_tokens"]), str(h["pe"]), bool(h["shaped"]),
                        np.zeros((self.ctx.n_layers, len(tokens), self.ctx.bpl), np.uint8))
        job.persisted = len(job.keys)
        if job.keys:
            job.last_key = BlockKey.from_hex(job.keys[-1])
        with self._lock:
            self.jobs[job.rid] = job
            early = [m for m in self._early.pop(job.rid, []) if m.header["att"] == job.att]
        if job.cached > job.pe_tokens:
            self._reads.put(job)
        for m in early:
            self.handle(m)

    def _on_layer(self, job: DecodeJob, layer: int, parts: list[np.ndarray]) -> None:
        head, miss = parts  # the PE-read hit rows and the miss rows; merged with ours
        job.buffer[layer, :job.pe_tokens] = head
        job.buffer[layer, job.cached:] = miss
        nbytes = head.nbytes + miss.nbytes
        job.rx_from_pe += nbytes
        self.ctx.counters.add(kv_rx_from_pe_bytes=nbytes)
        job.got.add(layer)
        self._maybe_ready(job)

    def _maybe_ready(self, job: DecodeJob) -> None:
        with self._lock:
            if job.started or job.first is None or len(job.got) < self.ctx.n_layers:
                return
            job.started = True
        self._ready.put(job)

    # -- DE read path -------------------------------------------------------------------
    def _read_loop(self) -> None:
        while True:
            job = self._reads.get()
            if job is None:
                return
            if job.cancelled:
                continue
            bt = self.ctx.bt
            ok = True
            first = job.pe_tokens // bt
            i = first
            try:
                for i in range(first, len(job.keys)):
                    key = job.keys[i]
                    block = self.ctx.read_block(BlockKey.from_hex(key), job.shaped)
                    if block is None:
                        raise CorruptBlockError(key, "missing")
                    job.buffer[:, i * bt:(i + 1) * bt] = block
            except CorruptBlockError as err:
                ok = False
                self.ctx.counters.add(corrupt_blocks=1)
                self.ctx.to_ctl({"t": "read_failed", "rid": job.rid, "att": job.att,
                                 "block": i, "why": str(err)})
            self.ctx.to_ctl({"t": "read_done", "rid": job.rid, "att": job.att,
                             "tokens": job.cached - job.pe_tokens})
            if not ok:
                continue
            for layer in range(self.ctx.n_layers):  # stream Layer Blocks to the PE
                self.ctx.send_kv(job.pe, {"t": "layer", "rid": job.rid, "att": job.att,
                                          "layer": layer},
                                 [job.buffer[layer, job.pe_tokens:job.cached]], job.shaped)

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
        blocks = ctx.hbm.blocks_of(job.rid)
        assert ctx.hbm.data is not None
        while job.persisted < full:
            i = job.persisted
            key = block_key(job.last_key, seq[i * bt:(i + 1) * bt].tolist(), self.ns)
            block = ctx.hbm.data[blocks[i]].copy()
            ctx.h2d(block.nbytes, job.shaped)  # D2H through the compute NIC
            ctx.write_block(key, block, job.shaped)
            job.last_key = key
            job.persisted += 1

    def _step(self, job: DecodeJob) -> None:
        ctx, model = self.ctx, self.ctx.model
        hidden = model.embed(np.asarray(job.out[-1:], dtype=np.int64))
        for layer in range(ctx.n_layers):
            past = ctx.hbm_read(job.rid, layer, job.n_kv)
            hidden, kv = model.forward_layer(layer, hidden, past, job.n_kv)
            ctx.hbm_write(job.rid, layer, job.n_kv, kv)
        job.n_kv += 1
        job.out.append(model.next_token(hidden[-1]))
        if len(job.out) == 2:
            job.second_at = time.monotonic()
        self._persist_full_blocks(job)

    def _finish(self, job: DecodeJob) -> None:
        self.ctx.hbm.free(job.rid)
        with self._lock:
            if self.jobs.get(job.rid) is job:
                del self.jobs[job.rid]
        if not job.cancelled:
            self.ctx.to_ctl({"t": "done", "rid": job.rid, "att": job.att, "tokens": job.out,
                             "rx_from_pe": job.rx_from_pe, "at": time.monotonic(),
                             "second_at": job.second_at})

    def _decode_loop(self) -> None:
        active: list[DecodeJob] = []
        waiting: list[DecodeJob] = []
        while True:
            block = not active and not waiting
            try:
                while True:
                    job = self._ready.get(timeout=None if block else 0) if block else (
                        self._ready.get_nowait())
                    if job is None:
                        return
                    waiting.append(job)
                    block = False
            except queue.Empty:
                pass
            for job in list(waiting):
                if job.cancelled:
                    waiting.remove(job)
                elif self._start(job):
                    waiting.remove(job)
                    active.append(job)
                    if job.gen <= 1 or len(job.out) >= job.gen:
                        active.remove(job)
                        self._finish(job)
                else:
                    break
            if not active:
                if waiting:
                    time.sleep(0.001)  # HBM full and nothing decoding: cannot happen long
                continue
            t0 = time.monotonic()
            for job in list(active):
                if job.cancelled:
                    active.remove(job)
                    self.ctx.hbm.free(job.rid)
                    continue
                self._step(job)
                if len(job.out) >= job.gen:
                    active.remove(job)
                    self._finish(job)
            self.ctx.counters.add(busy_s=time.monotonic() - t0)

    def report(self) -> dict[str, Any]:
        """Engine-specific report fields."""
        st = self.ctx.hbm.stats()
        return {"hbm_free_tokens": st.free_blocks * self.ctx.bt, "jobs": len(self.jobs),
                "fragmentation": st.fragmentation}

    def close(self) -> None:
        """Stop worker threads."""
        self._reads.put(None)
        self._ready.put(None)
