"""What one engine process holds: endpoint, model, store, NICs, HBM, counters, sender.

Why one object: the prefill and decode workers share the plumbing (an ordered sender that
pays the compute NIC before each send, the storage reader that pays the node's storage NIC,
HBM reads/writes of per-layer token ranges) and differ only in the data path they run.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dualpath_cli.core.layout import BlockKey
from dualpath_cli.runtime.hbm import HbmPool
from dualpath_cli.runtime.nic import Link
from dualpath_cli.runtime.ports import ModelPort, StorePort
from dualpath_cli.transfer.base import Endpoint

__all__ = ["EngineSpec", "Counters", "EngineContext"]


@dataclass
class EngineSpec:
    """Everything needed to start one engine (picklable for a child process).

    Args:
        engine_id: global engine id.
        role: "prefill" or "decode".
        node: node index (engines of a node share ``snic_read``/``snic_write``).
        group: engine group (all engines of a node are in one group).
        leader: whether this engine is its group's leader (it sends fetches).
        ctl: the control endpoint's address.
        snic_read / snic_write: the node's storage NIC, read and write directions.
        cnic: this engine's compute NIC.
        hbm_blocks: HBM capacity in KV blocks.
        block_tokens: tokens per KV block.
        model: model name for the model factory.
        store: store description for the store factory (e.g. ``{"kind": "dir", "root": ...}``).
        heartbeat_s: heartbeat period.
        fetch_s: leader fetch period.
    """

    engine_id: int
    role: str
    node: int
    group: int
    leader: bool
    ctl: str
    snic_read: Link
    snic_write: Link
    cnic: Link
    hbm_blocks: int
    block_tokens: int
    model: str = "tiny"
    store: dict[str, Any] = field(default_factory=dict)
    heartbeat_s: float = 0.05
    fetch_s: float = 0.005


@dataclass
class Counters:
    """Engine-local counters, reported with every heartbeat."""

    busy_s: float = 0.0
    bubble_s: float = 0.0
    load_wait_s: float = 0.0
    snic_read_bytes: int = 0
    snic_write_bytes: int = 0
    cnic_tx_bytes: int = 0
    kv_rx_from_pe_bytes: int = 0
    kv_rx_from_de_bytes: int = 0
    blocks_persisted: int = 0
    corrupt_blocks: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, **deltas: float) -> None:
        """Add to named counters atomically."""
        with self.lock:
            for name, value in deltas.items():
                setattr(self, name, getattr(self, name) + value)

    def snapshot(self) -> dict[str, float]:
        """Plain copy for a heartbeat."""
        with self.lock:
            return {k: v for k, v in self.__dict__.items() if k != "lock"}


class EngineContext:
    """Shared plumbing of one engine."""

    def __init__(self, spec: EngineSpec, endpoint: Endpoint, model: ModelPort,
                 store: StorePort) -> None:
        self.spec = spec
        self.ep = endpoint
        self.model = model
        self.store = store
        self.bpl = model.kv_bytes_per_token_layer
        self.n_layers = model.n_layers
        self.bt = spec.block_tokens
        self.hbm = HbmPool(spec.hbm_blocks, spec.block_tokens, model.n_layers, self.bpl)
        self.counters = Counters()
        self.stopped = threading.Event()
        self._out: queue.Queue[tuple[str, dict[str, Any], list[np.ndarray], bool] | None] = (
            queue.Queue())
        self._sender = threading.Thread(target=self._send_loop, daemon=True,
                                        name=f"send-{spec.engine_id}")
        self._sender.start()

    # -- network ------------------------------------------------------------------------
    def to_ctl(self, header: dict[str, Any]) -> None:
        """Control message to the scheduler (not shaped: control traffic is tiny)."""
        header.setdefault("eid", self.spec.engine_id)
        self.ep.send(self.spec.ctl, header)

    def send_kv(self, to: str, header: dict[str, Any], buffers: list[np.ndarray],
                shaped: bool) -> None:
        """Queue a message on the compute NIC (ordered; the NIC is paid before sending)."""
        self._out.put((to, header, buffers, shaped))

    def _send_loop(self) -> None:
        while True:
            item = self._out.get()
            if item is None:
                return
            to, header, buffers, shaped = item
            nbytes = sum(b.nbytes for b in buffers)
            if shaped:
                self.spec.cnic.transfer(nbytes)
            self.counters.add(cnic_tx_bytes=nbytes)
            self.ep.send(to, header, buffers)

    def h2d(self, nbytes: int, shaped: bool) -> None:
        """A host<->device copy through this engine's compute NIC (loopback RDMA write)."""
        if shaped:
            self.spec.cnic.transfer(nbytes)

    # -- storage ------------------------------------------------------------------------
    def read_block(self, key: BlockKey, shaped: bool) -> np.ndarray | None:
        """Read one Full Block through the node's storage NIC (raises on corruption)."""
        block = self.store.get(key)
        if block is None:
            return None
        if shaped:  # the oracle skips the read: its bytes never cross a storage NIC
            self.spec.snic_read.transfer(block.nbytes)
            self.counters.add(snic_read_bytes=block.nbytes)
        return block

    def write_block(self, key: BlockKey, block: np.ndarray, shaped: bool) -> None:
        """Persist one Full Block through the node's storage NIC."""
        if shaped:
            self.spec.snic_write.transfer(block.nbytes)
        self.store.put(key, np.ascontiguousarray(block))
        self.counters.add(snic_write_bytes=block.nbytes, blocks_persisted=1)

    # -- HBM ----------------------------------------------------------------------------
    def hbm_write(self, owner: int, layer: int, start: int, kv: np.ndarray) -> None:
        """Write packed KV rows for tokens ``start..`` of ``owner`` into its HBM blocks."""
        assert self.hbm.data is not None
        blocks = self.hbm.blocks_of(owner)
        pos, row = start, 0
        while row < kv.shape[0]:
            b, off = divmod(pos, self.bt)
            n = min(self.bt - off, kv.shape[0] - row)
            self.hbm.data[blocks[b], layer, off:off + n] = kv[row:row + n]
            pos += n
            row += n

    def hbm_read(self, owner: int, layer: int, n_tokens: int) -> np.ndarray:
        """Packed KV ``[n_tokens, bytes]`` of ``owner``'s first tokens for ``layer``."""
        assert self.hbm.data is not None
        if n_tokens <= 0:
            return np.zeros((0, self.bpl), dtype=np.uint8)
        blocks = self.hbm.blocks_of(owner)[: -(-n_tokens // self.bt)]
        rows = self.hbm.data[blocks, layer].reshape(-1, self.bpl)
        return rows[:n_tokens]

    # -- lifecycle ----------------------------------------------------------------------
    def now(self) -> float:
        """Monotonic clock (the ctl process shares it on one machine)."""
        return time.monotonic()

    def close(self) -> None:
        """Stop the sender thread."""
        self.stopped.set()
        self._out.put(None)
