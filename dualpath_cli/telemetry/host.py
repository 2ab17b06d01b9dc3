"""Host facts for /metrics: CPU, memory and per-interface NIC counters, from psutil.

Why here and not in the runtime: these describe the machine the API process runs on (the
embedded cluster's only machine), not an engine; the exporter samples them at scrape time
so they cost nothing between scrapes. Interface counters are the kernel's (bytes, errors,
drops since boot), exposed as counters with the interface name as the ``device`` label.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import psutil

__all__ = ["NicCounters", "HostFacts", "host_facts"]


@dataclass(frozen=True, slots=True)
class NicCounters:
    """One network interface's kernel counters since boot."""

    device: str
    bytes_sent: int
    bytes_recv: int
    errin: int
    errout: int
    dropin: int
    dropout: int


@dataclass(frozen=True, slots=True)
class HostFacts:
    """One sample of the host.

    ``cpu_utilization`` is the busy fraction 0..1 since the previous sample (``None`` on the
    first call of a process: psutil needs two readings).
    """

    cpu_count: int
    cpu_utilization: float | None
    memory_total_bytes: int
    memory_used_bytes: int
    memory_available_bytes: int
    nics: tuple[NicCounters, ...] = field(default_factory=tuple)


_primed = False


def host_facts() -> HostFacts:
    """Sample the host now (cheap: a few /proc reads, no waiting)."""
    global _primed
    busy = psutil.cpu_percent(interval=None)
    util = busy / 100.0 if _primed else None
    _primed = True
    mem = psutil.virtual_memory()
    nics = tuple(
        NicCounters(name, c.bytes_sent, c.bytes_recv, c.errin, c.errout, c.dropin, c.dropout)
        for name, c in sorted(psutil.net_io_counters(pernic=True).items()))
    return HostFacts(cpu_count=psutil.cpu_count() or 1, cpu_utilization=util,
                     memory_total_bytes=mem.total, memory_used_bytes=mem.total - mem.available,
                     memory_available_bytes=mem.available, nics=nics)
