"""GPU facts behind a small backend protocol: NVML when a GPU is present, else "not available".

Why a protocol: the exporter must say *whether* it knows GPU facts, never invent them. On a
machine without an NVIDIA driver :func:`detect_gpu_backend` returns an
:class:`UnavailableGpu` whose report has ``available=False`` and a reason, which the exporter
prints as ``dualpath_gpu_available 0`` and no device samples. Tests use the shipped
:class:`FakeGpuBackend`. ``pynvml`` (package nvidia-ml-py) is imported only when probing.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

__all__ = ["GpuDevice", "GpuReport", "GpuBackend", "NvmlBackend", "UnavailableGpu",
           "FakeGpuBackend", "detect_gpu_backend"]


@dataclass(frozen=True, slots=True)
class GpuDevice:
    """One GPU as the driver reports it (``None``: the driver does not say)."""

    index: int
    name: str
    uuid: str = ""
    utilization: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class GpuReport:
    """What a backend knows now: whether GPU facts are available, why not, and the devices."""

    available: bool
    backend: str
    devices: tuple[GpuDevice, ...] = ()
    reason: str = ""


@runtime_checkable
class GpuBackend(Protocol):
    """Anything that can report the host's GPUs."""

    name: str

    def report(self) -> GpuReport:
        """The devices now (never raises: a failing driver is an unavailable report)."""
        ...


@dataclass
class UnavailableGpu:
    """No GPU facts on this host; ``reason`` says why (no driver, no device)."""

    reason: str
    name: str = "none"

    def report(self) -> GpuReport:
        """Always unavailable."""
        return GpuReport(False, self.name, (), self.reason)


@dataclass
class FakeGpuBackend:
    """A shipped fake: reports the given devices (``available=False`` when none)."""

    devices: tuple[GpuDevice, ...] = ()
    name: str = "fake"
    calls: int = field(default=0, init=False)

    def report(self) -> GpuReport:
        """The configured devices."""
        self.calls += 1
        if not self.devices:
            return GpuReport(False, self.name, (), "fake backend with no device")
        return GpuReport(True, self.name, self.devices)


class NvmlBackend:
    """NVIDIA's management library through ``pynvml`` (nvidia-ml-py).

    Construct with :meth:`probe`, which initialises NVML once and fails cleanly.
    """

    name = "nvml"

    def __init__(self, nvml: Any, count: int) -> None:
        self._nvml = nvml
        self._count = count
        self._lock = threading.Lock()

    @classmethod
    def probe(cls) -> NvmlBackend | UnavailableGpu:
        """An NVML backend, or :class:`UnavailableGpu` saying why not."""
        try:
            import pynvml
        except ImportError:
            return UnavailableGpu("nvidia-ml-py (pynvml) is not installed")
        try:
            pynvml.nvmlInit()
            count = int(pynvml.nvmlDeviceGetCount())
        except pynvml.NVMLError as err:  # a missing driver library is one too
            return UnavailableGpu(f"NVML unavailable: {err}".splitlines()[0])
        if count == 0:
            return UnavailableGpu("NVML found no GPU")
        return cls(pynvml, count)

    def report(self) -> GpuReport:
        """Utilisation and memory of every device (a failing query: that field is None)."""
        nv = self._nvml
        devices = []
        with self._lock:
            try:
                for i in range(self._count):
                    h = nv.nvmlDeviceGetHandleByIndex(i)
                    devices.append(GpuDevice(
                        i, _text(_try(nv, nv.nvmlDeviceGetName, h)) or "gpu",
                        _text(_try(nv, nv.nvmlDeviceGetUUID, h)) or "", *_util_mem(nv, h)))
            except Exception as err:  # noqa: BLE001 - a driver fault must not fail the scrape
                return GpuReport(False, self.name, (), f"NVML query failed: {err}")
        return GpuReport(True, self.name, tuple(devices))


def _try(nv: Any, fn: Any, *args: Any) -> Any:
    """``fn(*args)``, or None where the driver does not say (``nv``: the pynvml module)."""
    try:
        return fn(*args)
    except nv.NVMLError:
        return None


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def _util_mem(nv: Any, handle: Any) -> tuple[float | None, int | None, int | None]:
    rates = _try(nv, nv.nvmlDeviceGetUtilizationRates, handle)
    mem = _try(nv, nv.nvmlDeviceGetMemoryInfo, handle)
    util = rates.gpu / 100.0 if rates is not None else None
    if mem is None:
        return util, None, None
    return util, int(mem.used), int(mem.total)


def detect_gpu_backend() -> GpuBackend:
    """NVML when a GPU and its driver are present, else an explicit "not available"."""
    return NvmlBackend.probe()
