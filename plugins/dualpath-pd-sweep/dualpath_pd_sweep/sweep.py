"""The sweep itself: pure arithmetic over dualpath's capacity maths."""

from __future__ import annotations

from dataclasses import dataclass

from dualpath_cli.core.capacity import PDRange, link_loads, pd_ratio_range
from dualpath_cli.errors import UsageError

__all__ = ["SweepRow", "sweep_pd"]


@dataclass(frozen=True, slots=True)
class SweepRow:
    """One xPyD split: its ratio, whether it is bottleneck-free, and its busiest link."""

    prefill_nodes: int
    decode_nodes: int
    ratio: float
    inside: bool
    busiest_link: str
    busiest_utilization: float

    @property
    def pd(self) -> str:
        """The deployment written like the paper, e.g. "2P4D"."""
        return f"{self.prefill_nodes}P{self.decode_nodes}D"

    def to_dict(self) -> dict[str, object]:
        """Plain-JSON form."""
        return {"pd": self.pd, "prefill_nodes": self.prefill_nodes,
                "decode_nodes": self.decode_nodes, "ratio": self.ratio, "inside": self.inside,
                "busiest_link": self.busiest_link,
                "busiest_utilization": self.busiest_utilization}


def sweep_pd(nodes: int, gpus_per_node: int, storage: float, cnic_bandwidth: float,
             dram_bandwidth: float) -> tuple[PDRange, list[SweepRow]]:
    """Every split of ``nodes`` into P >= 1 prefill and D >= 1 decode nodes, P ascending.

    Args:
        nodes: total node budget (at least 2).
        gpus_per_node: ``g``.
        storage: ``s``, node storage bandwidth in CNIC units.
        cnic_bandwidth: ``B`` in bytes/s.
        dram_bandwidth: ``M`` in bytes/s.

    Returns:
        The bottleneck-free range and one row per split. A split is inside exactly when no
        link's load exceeds its capacity (the range and the loads are the same inequalities).
    """
    if nodes < 2:
        raise UsageError(f"invalid --nodes {nodes}: need at least 2 (one prefill, one decode)")
    bounds = pd_ratio_range(gpus_per_node, storage, cnic_bandwidth, dram_bandwidth)
    rows = []
    for prefill in range(1, nodes):
        decode = nodes - prefill
        loads = link_loads(prefill, decode, gpus_per_node, storage, cnic_bandwidth,
                           dram_bandwidth)
        busiest = max(loads, key=lambda link: link.utilization)
        rows.append(SweepRow(prefill, decode, prefill / decode,
                             bounds.contains(prefill / decode), busiest.name,
                             busiest.utilization))
    return bounds, rows
