"""What one engine process holds: endpoint, model, store + loader, NICs, HBM, metrics, sender.

Why one object: the prefill and decode workers share the plumbing (an ordered sender that
pays the compute NIC before each send, the node's StorageLoader that pays the storage NIC and
whose read queue is the node's read_q, block persistence through the storage NIC, HBM
reads/writes of per-layer token ranges, the engine's metrics) and differ only in the data
path they run. Each engine records into its own :class:`MetricsRegistry`, so engines sharing
a process (the in-process cluster) never mix their numbers; heartbeats carry its snapshot.
"""

from __future__ import annotations

import heapq
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from dualpath_cli.core.layout import BlockKey, BlockShape, Namespace
from dualpath_cli.runtime.fabric_loss import FABRIC_LOST
from dualpath_cli.runtime.hbm import HbmPool
from dualpath_cli.runtime.kept_reports import KeptReports
from dualpath_cli.runtime.ports import ModelPort
from dualpath_cli.runtime.wire import (
    TIERS,
    Decode,
    EngineCounters,
    Fetch,
    Heartbeat,
    Layer,
    PrefillDone,
    QueueReport,
    ReadFailed,
    WireMessage,
    encode,
)
from dualpath_cli.runtime.write_refusals import WriteRefusals
from dualpath_cli.storage import (
    HEADER_SIZE,
    KVStore,
    LoadResult,
    MemoryStore,
    PosixStore,
    ReplicatedStore,
    StorageError,
    StorageLoader,
    TokenBucket,
    encode_block,
)
from dualpath_cli.storage.probe import PROBE_S, StoreProbe
from dualpath_cli.storage.store import CountsCopyReads
from dualpath_cli.telemetry.frames import frame
from dualpath_cli.telemetry.registry import REGISTRY, MetricsRegistry
from dualpath_cli.transfer.base import Endpoint, ResetsPeers
from dualpath_cli.transfer.shaping import pay

__all__ = ["EngineSpec", "Counters", "EngineContext", "open_store", "KV_DTYPE"]

log = logging.getLogger(__name__)

KV_DTYPE = np.dtype(np.float16)  # the reference model keeps K and V as fp16 (raw codec)
#: Blocks per engine exported with their read counts (``dualpath_storage_block_reads_total``):
#: the hottest only, so /metrics stays bounded at any store size.
HOT_BLOCKS_EXPORTED = 8
#: Blocks whose reads an engine tracks at most; beyond it the least-read half is dropped (a
#: hot block, read far more often than the rest, always survives).
_BLOCK_READS_TRACKED = 4096


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
        store: ``{"kind": "posix", "root": DIR}`` or ``{"kind": "memory", "obj": store}``.
        codec: storage codec (a raw one: the runtime's KV must stay bit-exact).
        dram_cache_bytes: the loader's DRAM buffer cache (0: reads always cross the NIC).
        quota_s: PE compute quota per forward batch, seconds of predicted compute.
        flops_rate: achieved FLOP/s that turns the model's FLOPs into predicted seconds.
        heartbeat_s: heartbeat period.
        fetch_s: leader fetch period.
        metrics_s: how often a heartbeat carries the full metrics snapshot.
        curve: the cluster's CURVE key pair (``transfer.curve.CurveKeys``) when its
            sockets use CURVE, else ``None``.
        store_probe_s: probe the store after this many seconds without a store read
            (storage/probe.py; 0: never).
    """

    engine_id: int
    role: str
    node: int
    group: int
    leader: bool
    ctl: str
    snic_read: TokenBucket
    snic_write: TokenBucket
    cnic: TokenBucket
    hbm_blocks: int
    block_tokens: int
    model: str = "tiny"
    store: dict[str, Any] = field(default_factory=dict)
    codec: str = "fp16"
    dram_cache_bytes: int = 0
    quota_s: float = 0.3
    flops_rate: float = 1e9
    heartbeat_s: float = 0.05
    fetch_s: float = 0.005
    metrics_s: float = 0.25
    curve: Any = None
    store_probe_s: float = PROBE_S


class Counters:
    """Engine-local running totals of the :class:`~.wire.EngineCounters` fields (defined
    there once), reported with every heartbeat; ``lock`` also guards the engine's hit tables."""

    __slots__ = ("lock", "_totals")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._totals: dict[str, float] = asdict(EngineCounters())

    def add(self, **deltas: float) -> None:
        """Add to named counters atomically (a name that is no counter raises KeyError)."""
        with self.lock:
            totals = self._totals
            for name, value in deltas.items():
                totals[name] += value

    def total(self, name: str) -> float:
        """One counter's total so far."""
        with self.lock:
            return self._totals[name]

    def snapshot(self) -> dict[str, float]:
        """Plain copy for a heartbeat (``Heartbeat(..., **snapshot)``)."""
        with self.lock:
            return dict(self._totals)


def open_store(spec: dict[str, Any], registry: MetricsRegistry | None = None) -> KVStore:
    """The store described by ``spec`` (``posix`` root, optionally with ``replicas``: replica
    roots; or an in-process ``memory`` object).

    A POSIX store opened for one engine records its metrics (store bytes, evictions) into
    that engine's ``registry``, so they travel with the engine's heartbeat snapshots.
    """
    kind = spec.get("kind", "memory")
    if kind == "posix":
        reg = registry if registry is not None else REGISTRY
        primary = PosixStore(str(spec["root"]), registry=reg)
        if not spec.get("replicas"):
            return primary
        # replica roots hold copies of hot blocks only (diagnose long-tail --fix); reads of
        # a block with copies rotate among them (storage/replicas.py)
        roots = [primary, *(PosixStore(str(r), registry=reg) for r in spec["replicas"])]
        return ReplicatedStore(roots, hot_reads=0, registry=reg, primary_home=True)
    obj = spec.get("obj")
    if isinstance(obj, MemoryStore):
        return obj
    raise ValueError(f"unknown store spec {spec!r}: expected kind posix with a root, or "
                     "memory with a MemoryStore object")


class EngineContext:
    """Shared plumbing of one engine."""

    def __init__(self, spec: EngineSpec, endpoint: Endpoint, model: ModelPort,
                 store: KVStore, registry: MetricsRegistry | None = None) -> None:
        self.spec = spec
        self.ep = endpoint
        self.model = model
        self.store = store
        self.bpl = model.kv_bytes_per_token_layer
        self.n_layers = model.n_layers
        self.bt = spec.block_tokens
        shape = BlockShape(model.n_layers, spec.block_tokens, self.bpl)
        self.namespace = Namespace(spec.model, "layer_major", shape, spec.codec)
        self.registry = registry if registry is not None else MetricsRegistry()
        self.loader = StorageLoader(
            store, node=spec.node, role=spec.role,
            shaper=spec.snic_read,  # the node's one storage NIC, shared by its engines
            block_tokens=spec.block_tokens, block_nbytes=HEADER_SIZE + shape.full_nbytes,
            cache_bytes=spec.dram_cache_bytes, registry=self.registry)
        self.probe = (StoreProbe(self.loader, spec.store_probe_s) if spec.store_probe_s > 0
                      else None)
        self.hbm = HbmPool(spec.hbm_blocks, spec.block_tokens, model.n_layers, self.bpl)
        self.counters = Counters()
        self.started = time.monotonic()
        self.stopped = threading.Event()
        self.seen = -1  # highest dispatch sequence whose reads were submitted to the loader
        self._report_lock = threading.Lock()
        self._report_n = 0
        self.report_to = ""  # the group leader's address (GroupLeader); "": the scheduler
        self._group_reports = KeptReports()  # a leader's, for its next fetch
        self._hits = [[0] * len(TIERS) for _ in range(model.n_layers)]  # [layer][tier]
        self._slack: list[float | None] = [None] * model.n_layers  # last prefill's, per layer
        self._tier = {tier: i for i, tier in enumerate(TIERS)}
        self._block_reads: dict[str, int] = {}  # block key hex -> store reads (bounded)
        self._bind_metrics()
        self._out: queue.Queue[tuple[str, Layer | PrefillDone | Decode, bool] | None] = (
            queue.Queue())
        self.fabric_down = False  # a fabric_drop fault: KV sends are lost (fabric_cut)
        #: called before each block write (a store_full fault: raises as a full disk does)
        self.write_hook: Callable[[KVStore, BlockKey], None] | None = None
        self._dropped_turns: set[tuple[int, int]] = set()
        self._sender = threading.Thread(target=self._send_loop, daemon=True,
                                        name=f"send-{spec.engine_id}")
        self._sender.start()

    # -- metrics ------------------------------------------------------------------------
    def _bind_metrics(self) -> None:
        r, s = self.registry, self.spec
        eid, node, role = s.engine_id, s.node, s.role
        self.m_util = r.gauge("dualpath_gpu_utilization_ratio", engine=eid, node=node,
                              role=role)
        self.m_flops = r.gauge("dualpath_flops_achieved_flops_per_second", engine=eid,
                               role=role)
        self.m_hbm = r.gauge("dualpath_hbm_usage_bytes", engine=eid)
        self.m_frag = r.gauge("dualpath_hbm_fragmentation_ratio", engine=eid)
        self.m_bubble = [r.counter("dualpath_attention_bubble_seconds_total", role=role,
                                   layer=layer) for layer in range(self.n_layers)]
        self.m_nic = {(nic, d): r.counter("dualpath_nic_bytes_total", node=node, nic=nic,
                                          role=role, direction=d)
                      for nic in ("snic", "cnic") for d in ("read", "write", "tx", "rx")
                      if (nic == "snic") == (d in ("read", "write"))}
        # token-denominated per-layer hits (no engine label: merged across engines; bound on
        # PEs only, the engines that place a hit in HBM layer by layer) and the hit KV bytes
        # placed in HBM by the side that supplied them
        self.m_layer_tok = [{t: r.counter("dualpath_kv_layer_hit_tokens_total", layer=layer,
                                          tier=t) for t in TIERS}
                            for layer in range(self.n_layers)] if role == "prefill" else []
        self.m_hbm_bytes = {side: r.counter("dualpath_kv_read_bytes_total", tier="hbm",
                                            side=side) for side in ("pe", "de")}
        self.write_refusals = WriteRefusals(r, node, role, self.spec.engine_id)

    def layer_hits(self, layer: int, tier: str, blocks: int) -> None:
        """Count ``blocks`` Layer Blocks of ``layer`` served by ``tier``."""
        if blocks > 0:
            self.registry.counter("dualpath_layer_cache_hits_total", role=self.spec.role,
                                  layer=layer, tier=tier).inc(blocks)
            with self.counters.lock:
                self._hits[layer][self._tier[tier]] += blocks
            tokens = blocks * self.bt
            self.m_layer_tok[layer][tier].inc(tokens)
            self.m_hbm_bytes["de" if tier == "peer" else "pe"].inc(tokens * self.bpl)

    def layer_slack(self, layer: int, seconds: float) -> None:
        """Load-ahead slack of ``layer`` in the last prefill that read a cached prefix:
        seconds its KV was ready before compute wanted it (negative: compute waited)."""
        self._slack[layer] = seconds

    def count_block_reads(self, keys: Sequence[str]) -> None:
        """Count store reads of blocks (hex keys) for the hot-block evidence."""
        with self.counters.lock:
            reads = self._block_reads
            for k in keys:
                reads[k] = reads.get(k, 0) + 1
            if len(reads) > _BLOCK_READS_TRACKED:
                keep = sorted(reads.items(), key=lambda kv: -kv[1])[:_BLOCK_READS_TRACKED // 2]
                self._block_reads = dict(keep)

    def hot_block_rows(self) -> list[dict[str, Any]]:
        """The most-read blocks as registry snapshot rows of
        ``dualpath_storage_block_reads_total`` (at most :data:`HOT_BLOCKS_EXPORTED`)."""
        with self.counters.lock:
            top = heapq.nlargest(HOT_BLOCKS_EXPORTED, self._block_reads.items(),
                                 key=lambda kv: kv[1])
        node = str(self.spec.node)
        return [{"labels": {"node": node, "block": k}, "value": float(n)} for k, n in top]

    def with_hot_blocks(self, metrics: dict[str, Any]) -> dict[str, Any]:
        """``metrics`` (a registry snapshot, or a frame: telemetry/frames.py) with the
        engine's most-read blocks added as ``dualpath_storage_block_reads_total``.

        Why not the registry: its series live for ever, and which blocks are hottest
        changes; these rows are rebuilt at every report, so the labels stay bounded. A frame
        gets them appended to its layout and values, with the hot set in its layout id (equal
        ids must mean equal layouts).
        """
        rows = self.hot_block_rows()
        if not rows:
            return metrics
        name = "dualpath_storage_block_reads_total"
        copies = self.copy_read_rows([r["labels"]["block"] for r in rows])
        cname = "dualpath_storage_block_copy_reads_total"
        if "layout" in metrics and "values" in metrics:  # a frame
            keys = [r["labels"]["block"] for r in rows]
            node = str(self.spec.node)
            cl = [[node, c["labels"]["block"], c["labels"]["root"]] for c in copies]
            lid = hash((tuple(keys), tuple(map(tuple, cl)))) & 0xFFFFFFFF
            return {**metrics,
                    "lid": f"{metrics['lid']}:hot:{lid:08x}",
                    "layout": [*metrics["layout"], *([name, [node, k], 1] for k in keys),
                               *([cname, labels, 1] for labels in cl)],
                    "values": [*metrics["values"], *(r["value"] for r in rows),
                               *(c["value"] for c in copies)]}
        return {**metrics, name: rows, **({cname: copies} if copies else {})}

    def copy_read_rows(self, keys: Sequence[str]) -> list[dict[str, Any]]:
        """Reads of each of ``keys`` that has replicas, per root holding a copy, as
        snapshot rows of ``dualpath_storage_block_copy_reads_total`` (the evidence that a
        replicated hot block's reads are spread; none without replica roots)."""
        store = self.store
        if not isinstance(store, CountsCopyReads):
            return []
        node = str(self.spec.node)
        return [{"labels": {"node": node, "block": k, "root": root}, "value": float(n)}
                for k in keys for root, n in store.copy_reads(BlockKey.from_hex(k)).items()]

    def compact_hbm(self) -> int:
        """Defragment the HBM pool (live blocks to the front, data moved); returns how many
        blocks moved. Safe while the workers run: the pool moves data under its lock."""
        moved = len(self.hbm.compact())
        self.counters.add(compactions=1)
        return moved

    def refresh_gauges(self) -> None:
        """Update the sampled gauges (HBM, GPU utilisation) before a snapshot."""
        st = self.hbm.stats()
        block_bytes = self.n_layers * self.bt * self.bpl
        self.m_hbm.set(st.used_blocks * block_bytes)
        self.m_frag.set(st.fragmentation)
        wall = time.monotonic() - self.started
        if wall > 0:
            self.m_util.set(min(1.0, self.counters.total("busy_s") / wall))

    # -- reports ------------------------------------------------------------------------
    def report_queue(self) -> None:
        """Send the node's read queue now (a :class:`~.wire.QueueReport`)."""
        self._report(None)

    def dispatched(self, seq: int, submit: Callable[[], None] | None = None) -> None:
        """Dispatch ``seq`` arrived: ``submit`` its reads (if any), then count it ``seen``.

        No report is sent for it: the scheduler charged the reads at dispatch, so the queue
        it sees is the same until they end, and the loader's callback reports then. Unless
        a report (another thread's) went out meanwhile: it may have counted the reads in
        ``rq`` without ``seen`` covering them, and the scheduler would count them twice
        until the next report, so one is sent at once."""
        with self._report_lock:
            before = self._report_n
        if submit is not None:
            submit()
        self.seen = max(self.seen, seq)
        with self._report_lock:  # a report in progress ends first: its increment is seen
            raced = self._report_n != before
        if raced:
            self.report_queue()

    def heartbeat(self, jobs: int, with_metrics: bool) -> None:
        """Send a :class:`~.wire.Heartbeat`: the queue report plus the engine's facts.

        ``with_metrics`` refreshes the sampled gauges and attaches the registry snapshot.
        """
        st = self.hbm.stats()
        rq = self.loader.read_queue
        counters = self.counters.snapshot()
        with self.counters.lock:
            hits = tuple(tuple(row) for row in self._hits)
        slack = tuple(self._slack)
        metrics = None
        if with_metrics:
            self.refresh_gauges()
            metrics = frame(self.registry)  # layout + values: telemetry/frames.py
            metrics = self.with_hot_blocks(metrics)
        facts: dict[str, Any] = {
            **counters, "rq_bytes": rq.bytes, "rq_blocks": rq.blocks,
            "dram_cache_bytes": self.loader.cache.bytes,
            "uptime_s": time.monotonic() - self.started, "jobs": jobs,
            "quota_s": self.spec.quota_s, "hbm_capacity_blocks": st.capacity_blocks,
            "hbm_used_blocks": st.used_blocks, "hbm_largest_free_run": st.largest_free_run,
            "hbm_fragmentation": st.fragmentation,
            "hbm_block_bytes": self.n_layers * self.bt * self.bpl, "layer_hits": hits,
            "layer_slack_s": slack,
            "metrics": metrics}
        self._report(facts)

    def _report(self, facts: dict[str, Any] | None) -> None:
        """One queue report (plain, or a heartbeat with ``facts``), numbered and sent.

        ``n`` orders reports sent from several threads (mailbox, loader callbacks); ``seen``
        is the last dispatch whose reads are already counted in ``rq``.
        """
        with self._report_lock:
            seen = self.seen  # read before rq: rq includes everything up to seen
            rq = self.loader.read_queue.tokens
            self._report_n += 1
            eid, n = self.spec.engine_id, self._report_n
            if facts is not None:
                self.to_ctl(Heartbeat(eid, n, seen, rq, **facts))
            elif self.spec.leader:  # rides on this leader's next fetch
                self.keep_report(QueueReport(eid, n, seen, rq))
            elif self.report_to:
                header, frames = encode(QueueReport(eid, n, seen, rq))
                self.ep.send(self.report_to, header, frames)
            else:
                self.to_ctl(QueueReport(eid, n, seen, rq))

    def keep_report(self, msg: QueueReport) -> None:
        """A leader keeps a group member's (or its own) newest queue report for its next
        fetch; a report that reached an engine that does not lead goes to the scheduler."""
        if not self.spec.leader:
            self.to_ctl(msg)
            return
        self._group_reports.keep(msg.eid, msg.n, msg.seen, msg.rq)

    def fetch(self) -> Fetch:
        """This leader's fetch, carrying the queue reports kept since its last one."""
        return Fetch(self.spec.engine_id, self.spec.group, self.spec.role,
                     self._group_reports.take())

    # -- network ------------------------------------------------------------------------
    def to_ctl(self, msg: WireMessage) -> None:
        """Control message to the scheduler (not shaped: control traffic is tiny)."""
        header, frames = encode(msg)
        self.ep.send(self.spec.ctl, header, frames)

    def send_kv(self, to: str, msg: Layer | PrefillDone | Decode, shaped: bool) -> None:
        """Queue a message on the compute NIC (ordered; the NIC is paid before sending): a
        turn's KV, or the Decode a PE forwards ahead of it."""
        self._out.put((to, msg, shaped))

    def _send_loop(self) -> None:
        while True:
            item = self._out.get()
            if item is None:
                return
            to, msg, shaped = item
            header, buffers = encode(msg)
            nbytes = sum(b.nbytes for b in buffers)
            if shaped:
                pay(self.spec.cnic, nbytes)
            self.counters.add(cnic_tx_bytes=nbytes)
            self.m_nic["cnic", "tx"].inc(nbytes)
            if self.fabric_down:
                self._kv_dropped(to, msg, "this engine's fabric link is down")
            elif self.ep.send(to, header, buffers) is False:
                self._kv_dropped(to, msg, "the peer did not take it")

    def fabric_cut(self, down: bool) -> None:
        """This engine's compute-fabric link down (``fabric_drop`` fault) or back up: while
        down every KV message it sends is lost, and what its sockets to peers still queue
        is lost at once (they are closed); control messages still reach the scheduler."""
        self.fabric_down = down
        if down and isinstance(self.ep, ResetsPeers):
            self.ep.reset_peers({self.spec.ctl})

    def _kv_dropped(self, to: str, msg: Layer | PrefillDone | Decode, how: str) -> None:
        """A KV message of a turn did not leave: the peer cannot finish the turn, so the
        scheduler is told to run it again (once per attempt)."""
        key = (msg.rid, msg.att)
        if key in self._dropped_turns:
            return
        if len(self._dropped_turns) >= 4096:
            self._dropped_turns.clear()
        self._dropped_turns.add(key)
        log.warning("engine %d: a KV message of request %d to %s was dropped; re-queueing it",
                    self.spec.engine_id, msg.rid, to)
        self.to_ctl(ReadFailed(self.spec.engine_id, msg.rid, msg.att, -1,
                               f"{FABRIC_LOST} to {to} was dropped ({how})"))

    def h2d(self, nbytes: int, shaped: bool) -> None:
        """A host<->device copy through this engine's compute NIC (loopback RDMA write)."""
        if shaped:
            pay(self.spec.cnic, nbytes)

    # -- storage ------------------------------------------------------------------------
    def read_blocks(self, keys: Sequence[str], done: Callable[[LoadResult], None]) -> None:
        """Queue Full Block reads on the node's loader; ``done(result)`` runs when all landed.

        A corrupt block was quarantined by the store and comes back as a miss (None).
        """
        ticket = self.loader.submit([BlockKey.from_hex(k) for k in keys],
                                    block_tokens=self.bt)

        def account(result: LoadResult) -> None:
            stored = [b for b in result.blocks if b is not None and b.tier == "store"]
            nbytes = sum(b.nbytes for b in stored)
            if stored:
                self.count_block_reads([b.key.hex for b in stored])
            self.counters.add(snic_read_bytes=nbytes)
            self.m_nic["snic", "read"].inc(nbytes)
            done(result)

        ticket.add_done_callback(account)

    def block_rows(self, block: Any, layer: int) -> np.ndarray:
        """Layer ``layer`` of a loaded Full Block as packed rows ``uint8 [tokens, bytes]``."""
        return block.array()[layer].view(np.uint8)

    def write_block(self, key: BlockKey, block: np.ndarray, shaped: bool) -> bool:
        """Persist one Full Block (``uint8 [L, tokens, bytes]``) through the storage NIC;
        False when the store could not take it (counted and logged, not raised)."""
        header, payload = encode_block(key, block.view(KV_DTYPE), self.namespace)
        if shaped:
            pay(self.spec.snic_write, header.file_nbytes)
        try:
            refuse = self.write_hook
            if refuse is not None:  # a store_full fault: refused as the file system would
                refuse(self.store, key)
            self.store.put(header, payload)
        except (OSError, StorageError) as err:  # a full or failing store loses this block,
            # not the engine (PosixStore raises WriteRefused for ENOSPC/EROFS/EIO)
            self.write_refusals.count(key.hex, err)
            return False
        self.counters.add(snic_write_bytes=header.file_nbytes, blocks_persisted=1)
        self.m_nic["snic", "write"].inc(header.file_nbytes)
        return True

    # -- HBM ----------------------------------------------------------------------------
    def hbm_write(self, owner: int, layer: int, start: int, kv: np.ndarray) -> None:
        """Write packed KV rows for tokens ``start..`` of ``owner`` into its HBM blocks."""
        self.hbm.write_rows(owner, layer, start, kv)

    def hbm_read(self, owner: int, layer: int, n_tokens: int) -> np.ndarray:
        """Packed KV ``[n_tokens, bytes]`` of ``owner``'s first tokens for ``layer``."""
        if n_tokens <= 0:
            return np.zeros((0, self.bpl), dtype=np.uint8)
        return self.hbm.read_rows(owner, layer, n_tokens)

    # -- lifecycle ----------------------------------------------------------------------
    def now(self) -> float:
        """Monotonic clock (the ctl process shares it on one machine)."""
        return time.monotonic()

    def close(self) -> None:
        """Stop the sender thread and the loader."""
        self.stopped.set()
        self._out.put(None)
        if self.probe is not None:
            self.probe.close()
        self.loader.close()
