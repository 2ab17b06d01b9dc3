"""What a run reports: job completion, per-turn latencies, NIC balance, utilisation."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from dualpath_cli.core.balance import max_over_avg as node_max_avg
from dualpath_cli.core.types import Role

__all__ = ["SimResult", "LatencyStats", "SnicSeries", "latency_stats", "max_over_avg",
           "snic_series"]


@dataclass(frozen=True, slots=True)
class LatencyStats:
    """Mean and percentiles of one latency, seconds (NaN when no sample)."""

    mean: float
    p50: float
    p90: float
    p99: float
    count: int

    def to_dict(self) -> dict[str, float]:
        """Plain dict."""
        return asdict(self)


def latency_stats(values: list[float] | np.ndarray) -> LatencyStats:
    """Summarise ``values`` (empty gives NaNs and count 0)."""
    arr = np.asarray(values, dtype=float)
    if arr.size == 0:
        nan = float("nan")
        return LatencyStats(nan, nan, nan, nan, 0)
    p50, p90, p99 = np.percentile(arr, [50, 90, 99])
    return LatencyStats(float(arr.mean()), float(p50), float(p90), float(p99), int(arr.size))


LOADED_UTIL = 0.5
"""A time bin counts as loaded when the cluster's storage NICs together ran at >= 50%."""


def max_over_avg(bins: list[dict[int, float]], capacity: float,
                 min_util: float = LOADED_UTIL) -> tuple[float, int]:
    """Mean over *loaded* time bins of max/avg bytes read across nodes (1.0 = balanced).

    The paper measures storage-NIC balance "in a small time window" and leaves out the
    underloaded tail; here a bin is loaded when all nodes together read at least
    ``min_util x capacity`` bytes in it (``capacity``: what every SNIC at line rate reads in
    one bin). When no bin is loaded (a light run) every bin with traffic counts. Returns the
    mean ratio (NaN when nothing was read) and the number of bins it averages.
    """
    indices = sorted({b for node_bins in bins for b in node_bins})
    rows = [[node_bins.get(b, 0.0) for node_bins in bins] for b in indices]
    rows = [r for r in rows if sum(r) > 0]
    loaded = [r for r in rows if sum(r) >= min_util * capacity]
    chosen = loaded or rows
    ratios = [node_max_avg(r) for r in chosen]
    return (float(np.mean(ratios)) if ratios else float("nan")), len(chosen)


@dataclass(frozen=True, slots=True)
class SnicSeries:
    """Bytes each node's storage NIC read per time bin: the balance Max/Avg sums up, over time.

    ``nodes`` are labelled ``P0..`` (prefill) then ``D0..`` (decode); ``read_bytes[i][b]`` is
    what node ``i`` read in ``[b * bin_s, (b + 1) * bin_s)``, bins from t = 0 to the last read.
    ``line_rate`` is one node's storage-NIC bandwidth, bytes/s; ``end_s`` the run's end.
    """

    bin_s: float
    end_s: float
    line_rate: float
    nodes: tuple[str, ...]
    read_bytes: tuple[tuple[float, ...], ...]

    @property
    def bins(self) -> int:
        """Number of time bins (0 when nothing was read)."""
        return len(self.read_bytes[0]) if self.read_bytes else 0

    def times(self) -> list[float]:
        """Each bin's start, seconds."""
        return [b * self.bin_s for b in range(self.bins)]

    def spans(self) -> list[float]:
        """Each bin's length, seconds: ``bin_s``, except a last bin cut short by the run's end."""
        spans = [min(self.bin_s, self.end_s - t) for t in self.times()]
        return [span if span > 0 else self.bin_s for span in spans]

    def edges(self) -> list[float]:
        """The ``bins + 1`` bin boundaries, seconds (after the last one, the end of reads)."""
        spans = self.spans()
        return [*self.times(), (self.bins - 1) * self.bin_s + spans[-1]] if spans else [0.0]

    def gb_per_s(self) -> list[list[float]]:
        """Per node, per bin: GB/s read (a last, partial bin is divided by its own length)."""
        spans = self.spans()
        return [[v / span / 1e9 for v, span in zip(row, spans, strict=True)]
                for row in self.read_bytes]

    def is_prefill(self, index: int) -> bool:
        """Whether node ``index`` is a prefill (PE) node."""
        return self.nodes[index].startswith("P")

    def to_dict(self) -> dict[str, object]:
        """Plain JSON-able dict (bytes per bin, as recorded)."""
        return {"bin_s": self.bin_s, "end_s": self.end_s,
                "line_rate_bytes_per_s": self.line_rate, "nodes": list(self.nodes),
                "read_bytes": [list(row) for row in self.read_bytes]}


def snic_series(nodes: Sequence[tuple[Role, Mapping[int, float]]], bin_s: float,
                end_s: float, line_rate: float) -> SnicSeries:
    """A :class:`SnicSeries` from each node's role and sparse ``{bin: bytes}`` record."""
    count = max((b + 1 for _, bins in nodes for b in bins), default=0)
    labels: list[str] = []
    seen = {Role.PREFILL: 0, Role.DECODE: 0}
    for role, _ in nodes:
        labels.append(f"{'P' if role is Role.PREFILL else 'D'}{seen[role]}")
        seen[role] += 1
    rows = tuple(tuple(bins.get(b, 0.0) for b in range(count)) for _, bins in nodes)
    return SnicSeries(bin_s, end_s, line_rate, tuple(labels), rows)


@dataclass(slots=True)
class SimResult:
    """Outcome of one simulated run (offline or online).

    ``jct`` is the offline job completion time (time the last agent finishes); in online
    mode it is the mean trajectory completion time of agents that finished. Offline runs
    also put the mean trajectory completion time in ``extra["mean_trajectory_s"]``.
    """

    mode: str
    policy: str
    model: str
    pd: str
    agents: int
    turns: int
    sim_time: float
    jct: float
    events: int
    wall_s: float
    snic_max_avg: float
    snic_util: float
    pe_util: float
    de_util: float
    read_tokens_pe_side: int
    read_tokens_de_side: int
    aps: float = 0.0
    ttft: LatencyStats | None = None
    ttst: LatencyStats | None = None
    tpot: LatencyStats | None = None
    slo_ok: bool | None = None
    stop_reason: str | None = None  # online: "horizon", "steady" or "ttft" (StopRule)
    dram_util: float = math.nan  # the busiest node's KV bytes through DRAM / its bandwidth
    dram_peak: float = math.nan  # the same in the busiest time bin (bin_s) of any node
    extra: dict[str, float] = field(default_factory=dict)
    snic_series: SnicSeries | None = None
    hit_tokens: int = 0  # prompt tokens found in the store, own context and shared prefixes
    shared_hit_tokens: int = 0  # ... of which another conversation stored
    prompt_tokens: int = 0  # every prompt's tokens (hit and computed)

    @property
    def hit_ratio(self) -> float:
        """Share of prompt tokens found in the store (0 when no prompt)."""
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def cross_conversation_hit_share(self) -> float:
        """Share of hit tokens that came from another conversation (0 when no hit)."""
        return self.shared_hit_tokens / self.hit_tokens if self.hit_tokens else 0.0

    @property
    def steady(self) -> bool | None:
        """Whether an online run ended at steady state (``None`` offline)."""
        return None if self.stop_reason is None else self.stop_reason == "steady"

    @property
    def turns_per_s(self) -> float:
        """Simulated turns per wall-clock second."""
        return self.turns / self.wall_s if self.wall_s > 0 else float("inf")

    def to_dict(self, series: bool = False) -> dict[str, object]:
        """Plain JSON-able dict; ``series`` adds ``snic_series`` (None when not recorded)."""
        out: dict[str, object] = {
            "mode": self.mode, "policy": self.policy, "model": self.model, "pd": self.pd,
            "agents": self.agents, "turns": self.turns, "sim_time_s": self.sim_time,
            "jct_s": self.jct, "events": self.events, "wall_s": self.wall_s,
            "turns_per_s": self.turns_per_s, "snic_max_avg": self.snic_max_avg,
            "snic_util": self.snic_util, "pe_util": self.pe_util, "de_util": self.de_util,
            "dram_util": self.dram_util, "dram_peak": self.dram_peak,
            "read_tokens_pe_side": self.read_tokens_pe_side,
            "read_tokens_de_side": self.read_tokens_de_side,
            "hit_tokens": self.hit_tokens, "shared_hit_tokens": self.shared_hit_tokens,
            "cross_conversation_hit_share": self.cross_conversation_hit_share,
            "prompt_tokens": self.prompt_tokens, "hit_ratio": self.hit_ratio,
        }
        if self.mode == "online":
            out.update({
                "aps": self.aps,
                "ttft": self.ttft.to_dict() if self.ttft else None,
                "ttst": self.ttst.to_dict() if self.ttst else None,
                "tpot": self.tpot.to_dict() if self.tpot else None,
                "slo_ok": self.slo_ok, "steady": self.steady,
                "stop_reason": self.stop_reason,
            })
        out.update(self.extra)
        if series:
            out["snic_series"] = self.snic_series.to_dict() if self.snic_series else None
        return out
