"""Fault injection on the engine side: :class:`FaultInjector` applies fault records.

Why: a :class:`~dualpath_cli.faultspec.Fault` (parsed from ``--inject`` or ``PATCH
/api/v1/faults``) reaches each engine it targets as a wire message; the engine applies it to
its own plumbing here (a throttled storage NIC, slow or failing reads, a full store, hot
blocks, a fragmented HBM pool, slow compute, a cut fabric) and undoes it when told ``on=False``.
"""

from __future__ import annotations

import errno
import logging
import os
import random
import threading
import time
from typing import TYPE_CHECKING, Any

from dualpath_cli.core.layout import BlockKey
from dualpath_cli.faultspec import Fault
from dualpath_cli.storage.errors import WriteRefused

if TYPE_CHECKING:
    from dualpath_cli.runtime.context import EngineContext
    from dualpath_cli.storage.store import ReadOp

__all__ = ["FaultInjector", "HBM_FAULT_OWNER"]

log = logging.getLogger(__name__)

#: The HBM owner id that holds a fragmentation fault's pinned blocks (requests are >= 0).
HBM_FAULT_OWNER = -1


class _SlowModel:
    """A model whose forward passes take ``factor`` times as long (sleeps the difference)."""

    def __init__(self, base: Any, factor: float) -> None:
        self.base = base
        self.factor = factor

    def forward_layer_batch(self, *args: Any, **kw: Any) -> Any:
        t0 = time.monotonic()
        out = self.base.forward_layer_batch(*args, **kw)
        extra = (self.factor - 1.0) * (time.monotonic() - t0)
        if extra > 0:
            time.sleep(extra)
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.base, name)


def _refuse_full(store: object, key: BlockKey) -> None:
    """A ``store_full`` fault's write: refused with ENOSPC, the error a store on a full file
    system raises (storage/posix.py), so the engine counts and logs it as that."""
    where = getattr(store, "root", None) or type(store).__name__
    raise WriteRefused(f"{where}/{key.hex}", errno.ENOSPC, os.strerror(errno.ENOSPC))


class FaultInjector:
    """Applies :class:`Fault` records to one engine's plumbing, and undoes them.

    Storage faults wrap the loader's delivery step (every read path ends there), so the
    loader's threads themselves stall or fail and the node's read queue backs up as it would
    on a slow or failing disk.
    """

    def __init__(self, ctx: EngineContext) -> None:
        self.ctx = ctx
        self.active: dict[str, Fault] = {}
        self._base_model = ctx.model
        self._reads_hooked = False
        self._hot_stop: threading.Event | None = None
        self._rng = random.Random(ctx.spec.engine_id)

    def apply(self, fault: Fault) -> None:
        """Turn ``fault`` on (replacing one of its kind) or off (``fault.on`` False)."""
        self._undo(fault.kind)
        if fault.on:
            self._do(fault)
            self.active[fault.kind] = fault
        log.info("engine %d: fault %s %s", self.ctx.spec.engine_id, fault.spec(),
                 "on" if fault.on else "off")

    def clear(self) -> None:
        """Undo every active fault (the engine is closing)."""
        for kind in list(self.active):
            self._undo(kind)

    def _do(self, f: Fault) -> None:
        ctx = self.ctx
        if f.kind == "snic_throttle":
            ctx.loader.shaper.throttle(f.fraction)  # the node's bucket (spec.snic_read)
        elif f.kind in ("read_latency", "read_errors"):
            self._wrap_reads()
        elif f.kind == "hot_blocks":
            self._hot_stop = threading.Event()
            threading.Thread(target=self._hot_loop, args=(f, self._hot_stop), daemon=True,
                             name=f"fault-hot-{ctx.spec.engine_id}").start()
        elif f.kind == "hbm_frag":
            ctx.hbm.pin_stride(HBM_FAULT_OWNER, f.stride)
        elif f.kind == "slow_compute":
            ctx.model = _SlowModel(self._base_model, f.factor)
        elif f.kind == "fabric_drop":
            ctx.fabric_cut(True)
        elif f.kind == "store_full":
            ctx.write_hook = _refuse_full

    def _undo(self, kind: str) -> None:
        ctx = self.ctx
        if self.active.pop(kind, None) is None:
            return
        if kind == "snic_throttle":
            ctx.loader.shaper.unthrottle()
        elif kind in ("read_latency", "read_errors"):
            if not any(k in self.active for k in ("read_latency", "read_errors")) \
                    and self._reads_hooked:
                ctx.loader.set_read_hook(None)
                self._reads_hooked = False
        elif kind == "hot_blocks" and self._hot_stop is not None:
            self._hot_stop.set()
            self._hot_stop = None
        elif kind == "hbm_frag":
            ctx.hbm.free(HBM_FAULT_OWNER)
        elif kind == "slow_compute":
            ctx.model = self._base_model
        elif kind == "fabric_drop":
            ctx.fabric_cut(False)
        elif kind == "store_full":
            ctx.write_hook = None

    def _wrap_reads(self) -> None:
        if self._reads_hooked:
            return
        loader = self.ctx.loader

        def faulty(ops: list[ReadOp], started: float) -> float:
            lat = self.active.get("read_latency")
            if lat is not None:  # the store read ends later; the NIC carries it after that
                time.sleep(lat.latency_s)
                started = max(started, loader.clock())
            err = self.active.get("read_errors")
            if err is not None:
                for op in ops:
                    if op.header is not None and self._rng.random() < err.rate:
                        if op.buffer is not None:
                            op.buffer.release()
                            op.buffer = None
                        op.header, op.missing = None, True
                        op.io_error = f"{os.strerror(errno.EIO)} (injected read error)"
            return started

        loader.set_read_hook(faulty)
        self._reads_hooked = True

    def _hot_loop(self, f: Fault, stop: threading.Event) -> None:
        """Read the hot blocks ``f.rate`` times a second through the engine's storage path
        (the node's loader and storage NIC, counted like a turn's reads)."""
        ctx = self.ctx
        keys = list(f.blocks)
        period = 1.0 / f.rate
        while not stop.is_set() and not ctx.stopped.is_set():
            if not keys:  # the first stored blocks, once there are some
                it = iter(ctx.store.keys())
                keys = [k.hex for _, k in zip(range(f.count), it, strict=False)]
                if not keys:
                    stop.wait(0.2)
                    continue
            t0 = time.monotonic()
            for key in keys:  # a cached copy would not touch the store: each read must
                ctx.loader.cache.discard(BlockKey.from_hex(key))
            landed = threading.Event()

            def done(result: Any, landed: threading.Event = landed) -> None:
                result.release()
                landed.set()

            try:
                ctx.read_blocks(keys, done)
            except (RuntimeError, ValueError) as err:  # loader closed, or a bad key: ends quietly
                log.debug("hot_blocks fault stopped: %s", err)
                return
            landed.wait(30.0)
            stop.wait(max(0.0, period - (time.monotonic() - t0)))
