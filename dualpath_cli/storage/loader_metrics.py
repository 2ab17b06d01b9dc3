"""A loader's metrics: reads, hits by tier, queue size, bandwidth, prefetch accuracy.

Kept apart from the loader so that the loader's code reads as queueing and reading; the
loader calls these with its lock held where they read its queue (the counts here are
only touched from there).
"""

from __future__ import annotations

from dualpath_cli.storage.block_queue import BlockQueue
from dualpath_cli.telemetry.registry import MetricsRegistry

__all__ = ["LoaderMetrics"]

_SIDE = {"prefill": "pe", "decode": "de"}


class LoaderMetrics:
    """The metrics of one node's loader, bound to ``registry`` with its labels."""

    def __init__(self, r: MetricsRegistry, node: str, role: str, shaped: float,
                 clock_now: float) -> None:
        n = node
        self.node = node
        self.m_bytes = r.counter("dualpath_storage_read_bytes_total", node=n, role=role)
        self.m_blocks = r.counter("dualpath_storage_read_blocks_total", node=n, role=role)
        self.m_q_len = r.gauge("dualpath_storage_read_queue_length", node=n)
        self.m_q_tok = r.gauge("dualpath_storage_read_queue_tokens", node=n)
        self.m_q_bytes = r.gauge("dualpath_storage_read_queue_bytes", node=n)
        self.m_inflight = r.gauge("dualpath_storage_reads_in_flight", node=n)
        self.m_lat = {t: r.histogram("dualpath_storage_read_latency_seconds", node=n, tier=t)
                      for t in ("dram", "store")}
        self.m_service = r.histogram("dualpath_storage_read_service_seconds", node=n)
        self.m_hits = {t: r.counter("dualpath_storage_cache_hits_total", node=n, tier=t)
                       for t in ("dram", "store")}
        self.m_miss = {t: r.counter("dualpath_storage_cache_misses_total", node=n, tier=t)
                       for t in ("dram", "store")}
        self.m_ratio = {t: r.gauge("dualpath_storage_cache_hit_ratio", node=n, tier=t)
                        for t in ("dram", "store")}
        self.m_cache_bytes = r.gauge("dualpath_storage_cache_bytes", node=n)
        self.m_cancel = r.counter("dualpath_storage_cancelled_reads_total", node=n)
        self.m_read_errors = {why: r.counter("dualpath_storage_read_errors_total", node=n,
                                             reason=why) for why in ("read_failed", "timed_out")}
        side = _SIDE.get(role, role)
        self.m_kv_req = r.counter("dualpath_kv_requested_tokens_total", tier="dram")
        self.m_kv_hit = r.counter("dualpath_kv_hit_tokens_total", tier="dram")
        self.m_kv_bytes = {t: r.counter("dualpath_kv_read_bytes_total", tier=t, side=side)
                           for t in ("dram", "store")}
        self.m_kv_miss = {why: r.counter("dualpath_kv_miss_blocks_total", tier="dram",
                                         reason=why)
                          for why in ("never_stored", "evicted", "quarantined")}
        self.m_kv_age = r.histogram("dualpath_kv_evicted_block_age_seconds", tier="dram")
        self.m_prefetch = r.counter("dualpath_storage_prefetched_blocks_total", node=n)
        self.m_pf_accuracy = r.gauge("dualpath_prefetch_accuracy_ratio", node=n)
        self.m_actual = r.gauge("dualpath_storage_actual_bandwidth_bytes_per_second", node=n)
        self.m_util = r.gauge("dualpath_snic_utilization_ratio", node=n)
        r.gauge("dualpath_storage_shaped_bandwidth_bytes_per_second", node=n).set(shaped)
        self._registry = r
        self._lookups = {"dram": [0, 0], "store": [0, 0]}
        self._bw_window = (clock_now, 0)
        self.pf_read = 0  # blocks a prefetch read successfully
        self.pf_joined = 0  # ... of which a request joined while the read was in flight

    def count_lookup(self, tier: str, hits: int, misses: int) -> None:
        """Hits and misses of one lookup in ``tier``, and the tier's running hit ratio."""
        if hits:
            self.m_hits[tier].inc(hits)
        if misses:
            self.m_miss[tier].inc(misses)
        counts = self._lookups[tier]
        counts[0] += hits
        counts[1] += hits + misses
        if counts[1]:
            self.m_ratio[tier].set(counts[0] / counts[1])

    def count_tier(self, requested: int, hit: int, nbytes: int, why: dict[str, int],
                   ages: list[float]) -> None:
        """One request's DRAM-buffer lookup in tokens, bytes and miss reasons."""
        self.m_kv_req.inc(requested)
        if hit:
            self.m_kv_hit.inc(hit)
            self.m_kv_bytes["dram"].inc(nbytes)
        for reason, n in why.items():
            self.m_kv_miss[reason].inc(n)
        if ages:
            self.m_kv_age.observe_many(ages)

    def publish_accuracy(self, prefetch_used: int) -> None:
        """Prefetched blocks a request used (``prefetch_used`` found in the cache, plus
        those joined in flight), over blocks prefetched."""
        if self.pf_read:
            self.m_pf_accuracy.set((prefetch_used + self.pf_joined) / self.pf_read)

    def publish_queue(self, q: BlockQueue) -> None:
        """The read queue's size now."""
        self.m_q_len.set(q.blocks)
        self.m_q_tok.set(q.tokens)
        self.m_q_bytes.set(q.bytes)
        self.m_inflight.set(q.in_flight)

    def count_bandwidth(self, now: float, read_bytes: int, shaped_rate: float | None) -> None:
        """Bytes just read, into the actual bandwidth (and the SNIC's utilisation when
        shaped), published at most every 0.25 s."""
        start, total = self._bw_window
        total += read_bytes
        if now - start >= 0.25:
            rate = total / (now - start)
            self.m_actual.set(rate)
            if shaped_rate:
                self.m_util.set(min(1.0, rate / shaped_rate))
            self._bw_window = (now, 0)
        else:
            self._bw_window = (start, total)

    def count_reads(self, read_bytes: int, hits: int, prefetched: int,
                    corrupt: dict[str, int], latencies: list[float],
                    failed: dict[str, int] | None = None) -> None:
        """A delivered batch of store reads: bytes, blocks, corrupt blocks, latencies, and
        the reads that failed (by miss reason: read_failed, timed_out)."""
        if read_bytes:
            self.m_bytes.inc(read_bytes)
            self.m_blocks.inc(hits)
            self.m_kv_bytes["store"].inc(read_bytes)
        if prefetched:
            self.m_prefetch.inc(prefetched)
        for reason, count in corrupt.items():
            self._registry.counter("dualpath_storage_corrupt_blocks_total", node=self.node,
                                   reason=reason).inc(count)
        for reason, count in (failed or {}).items():
            self.m_read_errors[reason].inc(count)
        self.m_lat["store"].observe_many(latencies)

    def count_service(self, seconds: float) -> None:
        """The store's service time of one read batch (the loader's ``_deliver``)."""
        self.m_service.observe(max(0.0, seconds))
