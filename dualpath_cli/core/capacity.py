"""Capacity maths: the paper's bottleneck-free P/D range and the KV working-set estimate.

Bottleneck-free range (paper section 4.2, equation 9). With ``P`` prefill and ``D`` decode
nodes, ``g`` GPUs per node each paired with one compute NIC (CNIC) of bandwidth ``B``, storage
bandwidth ``s*B`` per node and DRAM bandwidth ``M`` per node, every storage NIC can run
saturated without a CNIC or DRAM bottleneck when::

    s/(g-s) <= P/D <= min{ (g-2s)/s, (g-s)/(2s), (M/(Bs) - 3)/2 }

The per-link loads behind it (constraints (1)-(8)) come from the traffic of one PE-DE GPU
pair: ``T_p = Bs/(D g^2)`` on the PE read path and ``T_c = Bs/(P g^2)`` on the DE read path.
They depend on P and D only through the ratio P/D.

The paper justifies constraint (1), ``2Bs/g <= B``, with "since s <= g"; the inequality really
needs ``s <= g/2``. It is reported here as an extra check (:attr:`PDRange.pe_cnic_read_ok`)
rather than silently assumed, together with the PE DRAM pressure ``2sB <= M`` that the paper
calls "generally fine".

Working set (paper section 8.2): with ``lambda`` new trajectories per second and mean job
time ``T``, about ``lambda*T`` trajectories are alive (Little's law); each is on average half
way to its final length, so the KV working set is ``lambda*T*mean_total_len/2`` tokens.

Everything here is pure arithmetic on floats; bandwidths are bytes/s.
"""

from __future__ import annotations

from dataclasses import dataclass

from dualpath_cli.errors import UsageError

__all__ = [
    "Bound",
    "PDRange",
    "LinkLoad",
    "storage_ratio",
    "pd_ratio_range",
    "link_loads",
    "working_set_tokens",
    "working_set_bytes",
    "RATIO_TOLERANCE",
]

#: Relative slack when comparing a ratio with a bound, so 1P7D sits on the 1/7 edge.
RATIO_TOLERANCE = 1e-9


@dataclass(frozen=True, slots=True)
class Bound:
    """One side of equation (9): its value, the constraint it comes from and its formula."""

    name: str
    value: float
    constraints: str
    formula: str

    def to_dict(self) -> dict[str, object]:
        """Plain-JSON form."""
        return {"name": self.name, "value": self.value, "constraints": self.constraints,
                "formula": self.formula}


@dataclass(frozen=True, slots=True)
class PDRange:
    """The bottleneck-free P/D range for one node type, with every bound that makes it."""

    gpus_per_node: int
    storage_ratio: float
    cnic_bandwidth: float
    dram_bandwidth: float
    lower: Bound
    upper: tuple[Bound, ...]
    pe_cnic_read_ok: bool
    pe_dram_ok: bool

    @property
    def min_ratio(self) -> float:
        """Smallest bottleneck-free P/D (infinite when ``s >= g``)."""
        return self.lower.value

    @property
    def max_ratio(self) -> float:
        """Largest bottleneck-free P/D: the tightest upper bound."""
        return min(bound.value for bound in self.upper)

    @property
    def binding_upper(self) -> Bound:
        """The upper bound that sets :attr:`max_ratio` (first one on ties)."""
        return min(self.upper, key=lambda bound: bound.value)

    @property
    def feasible(self) -> bool:
        """Whether any P/D ratio is bottleneck-free (and the side checks hold)."""
        return (self.pe_cnic_read_ok and self.pe_dram_ok
                and _le(self.min_ratio, self.max_ratio))

    def contains(self, ratio: float) -> bool:
        """Whether ``ratio`` = P/D lies in the range (edges included, with float slack)."""
        return self.feasible and _le(self.min_ratio, ratio) and _le(ratio, self.max_ratio)

    def to_dict(self) -> dict[str, object]:
        """Plain-JSON form (infinite values become ``None`` in :func:`emit_json`)."""
        return {
            "min_ratio": self.min_ratio,
            "max_ratio": self.max_ratio,
            "feasible": self.feasible,
            "lower_bound": self.lower.to_dict(),
            "upper_bounds": [bound.to_dict() for bound in self.upper],
            "binding_upper_bound": self.binding_upper.name,
            "checks": {
                "pe_cnic_read_ok": self.pe_cnic_read_ok,
                "pe_dram_ok": self.pe_dram_ok,
            },
            "inputs": {
                "gpus_per_node": self.gpus_per_node,
                "storage_ratio": self.storage_ratio,
                "cnic_bytes_per_s": self.cnic_bandwidth,
                "dram_bytes_per_s": self.dram_bandwidth,
            },
        }


@dataclass(frozen=True, slots=True)
class LinkLoad:
    """Load on one link kind (per CNIC or per node DRAM) when every storage NIC is saturated."""

    name: str
    constraints: str
    labels: str
    load: float
    capacity: float

    @property
    def utilization(self) -> float:
        """Load as a fraction of the link's capacity."""
        return self.load / self.capacity

    @property
    def ok(self) -> bool:
        """Whether the link keeps up (load <= capacity, with float slack)."""
        return _le(self.load, self.capacity)

    def to_dict(self) -> dict[str, object]:
        """Plain-JSON form."""
        return {"name": self.name, "constraints": self.constraints, "labels": self.labels,
                "load_bytes_per_s": self.load, "capacity_bytes_per_s": self.capacity,
                "utilization": self.utilization, "ok": self.ok}


def _le(a: float, b: float) -> bool:
    return a <= b + RATIO_TOLERANCE * max(1.0, abs(a), abs(b))


def _positive(value: float, name: str) -> None:
    if not value > 0:
        raise UsageError(f"invalid {name} {value!r}: must be greater than zero")


def storage_ratio(snics_per_node: int, snic_bandwidth: float, cnic_bandwidth: float) -> float:
    """The paper's ``s``: a node's storage bandwidth in units of one CNIC's bandwidth ``B``.

    Args:
        snics_per_node: storage NICs per node.
        snic_bandwidth: bandwidth of one storage NIC, bytes/s.
        cnic_bandwidth: bandwidth ``B`` of one GPU's compute NIC, bytes/s.
    """
    _positive(snics_per_node, "storage NICs per node")
    _positive(snic_bandwidth, "storage-NIC bandwidth")
    _positive(cnic_bandwidth, "compute-NIC bandwidth")
    return snics_per_node * snic_bandwidth / cnic_bandwidth


def pd_ratio_range(gpus_per_node: int, storage: float, cnic_bandwidth: float,
                   dram_bandwidth: float) -> PDRange:
    """Equation (9): the range of P/D ratios with no CNIC or DRAM bottleneck.

    Args:
        gpus_per_node: ``g``, GPUs (and CNICs) per node.
        storage: ``s``, node storage bandwidth in CNIC units (see :func:`storage_ratio`).
        cnic_bandwidth: ``B``, one CNIC's bandwidth in bytes/s.
        dram_bandwidth: ``M``, one node's DRAM bandwidth in bytes/s.

    Raises:
        UsageError: when a quantity is not positive.
    """
    _positive(gpus_per_node, "GPUs per node")
    _positive(storage, "storage ratio s")
    _positive(cnic_bandwidth, "compute-NIC bandwidth")
    _positive(dram_bandwidth, "DRAM bandwidth")
    g, s = float(gpus_per_node), storage
    lower_value = s / (g - s) if g > s else float("inf")
    lower = Bound("pe_cnic_write", lower_value, "(2)-(3)", "s/(g-s)")
    upper = (
        Bound("de_cnic_read", (g - 2 * s) / s, "(4)-(5)", "(g-2s)/s"),
        Bound("de_cnic_write", (g - s) / (2 * s), "(6)-(7)", "(g-s)/(2s)"),
        Bound("de_dram", (dram_bandwidth / (cnic_bandwidth * s) - 3) / 2, "(8)",
              "(M/(Bs)-3)/2"),
    )
    return PDRange(
        gpus_per_node=gpus_per_node, storage_ratio=s, cnic_bandwidth=cnic_bandwidth,
        dram_bandwidth=dram_bandwidth, lower=lower, upper=upper,
        pe_cnic_read_ok=_le(2 * s, g),
        pe_dram_ok=_le(2 * s * cnic_bandwidth, dram_bandwidth),
    )


def link_loads(prefill_nodes: int, decode_nodes: int, gpus_per_node: int, storage: float,
               cnic_bandwidth: float, dram_bandwidth: float) -> tuple[LinkLoad, ...]:
    """Per-link loads of constraints (1)-(8) for a ``prefill_nodes``P``decode_nodes``D cluster.

    Loads are per CNIC (PCIe side, which also carries loopback H2D/D2H) and per node DRAM,
    in bytes/s, when every storage NIC reads at full speed and the scheduler balances load.

    Raises:
        UsageError: when a count or bandwidth is not positive.
    """
    _positive(prefill_nodes, "prefill node count")
    _positive(decode_nodes, "decode node count")
    _positive(gpus_per_node, "GPUs per node")
    _positive(storage, "storage ratio s")
    _positive(cnic_bandwidth, "compute-NIC bandwidth")
    _positive(dram_bandwidth, "DRAM bandwidth")
    ratio = prefill_nodes / decode_nodes
    per_gpu = cnic_bandwidth * storage / gpus_per_node  # Bs/g: one GPU's share of a node's reads
    node_reads = cnic_bandwidth * storage  # sB
    return (
        LinkLoad("pe_cnic_read", "(1)", "PE 3, 5", 2 * per_gpu, cnic_bandwidth),
        LinkLoad("pe_cnic_write", "(2)-(3)", "PE 4, DE 5", per_gpu * (1 + 1 / ratio),
                 cnic_bandwidth),
        LinkLoad("de_cnic_read", "(4)-(5)", "PE 8, DE 3, 6", per_gpu * (ratio + 2),
                 cnic_bandwidth),
        LinkLoad("de_cnic_write", "(6)-(7)", "PE 7, 9, DE 7", per_gpu * (2 * ratio + 1),
                 cnic_bandwidth),
        LinkLoad("pe_dram", "-", "PE 2, 3", 2 * node_reads, dram_bandwidth),
        LinkLoad("de_dram", "(8)", "DE 2, 3, 6; PE 7, 8", (3 + 2 * ratio) * node_reads,
                 dram_bandwidth),
    )


def working_set_tokens(arrival_rate: float, mean_jct: float, mean_total_len: float) -> float:
    """KV tokens alive at once: ``arrival_rate * mean_jct * mean_total_len / 2``.

    Args:
        arrival_rate: new agent trajectories per second (the paper's APS, lambda).
        mean_jct: mean job (trajectory) completion time in seconds.
        mean_total_len: mean final context length of a trajectory, in tokens.
    """
    for value, name in ((arrival_rate, "arrival rate"), (mean_jct, "mean JCT"),
                        (mean_total_len, "mean total length")):
        if not value >= 0:
            raise UsageError(f"invalid {name} {value!r}: must be zero or more")
    return arrival_rate * mean_jct * mean_total_len / 2


def working_set_bytes(arrival_rate: float, mean_jct: float, mean_total_len: float,
                      bytes_per_token: int) -> float:
    """The working set of :func:`working_set_tokens` in bytes of KV (all layers)."""
    _positive(bytes_per_token, "KV bytes per token")
    return working_set_tokens(arrival_rate, mean_jct, mean_total_len) * bytes_per_token
