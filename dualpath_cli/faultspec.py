"""Fault records and the one SPEC parser: what ``--inject`` and ``PATCH /api/v1/faults`` name.

Why: every ``dualpath diagnose`` workflow must be provable on the real runtime, and operators
rehearse them, so the runtime can be made to misbehave on purpose, the same way from
``dualpath launch --inject SPEC`` and ``PATCH /api/v1/faults``. A fault is one frozen
:class:`Fault` record; it is also a wire message (kind ``fault``), so the scheduler sends it to
the engines it targets, in threads or in processes over ZeroMQ, and each engine applies it to
its own plumbing (:class:`~dualpath_cli.runtime.faults.FaultInjector`). Off by default;
``on=False`` undoes one. Pure data and parsing (no I/O, no threads), so the API and the CLI
parse and check a SPEC without importing the runtime.

SPEC text is ``KIND:key=value,...``:

* ``snic_throttle:node=N,fraction=F`` -- node N's storage-NIC read bucket runs at F of its
  rate (0 < F <= 1; the cluster's storage NICs must be shaped);
* ``read_latency:node=N,latency=DUR`` -- every read batch of node N's loaders takes DUR more;
* ``read_errors:node=N,rate=R`` -- a fraction R of node N's block reads fail (reported as
  I/O errors, so the turn is re-read or re-queued as after a real EIO);
* ``hot_blocks:node=N[,blocks=HEX+HEX...][,count=K][,rate=R]`` -- node N's loader reads the
  named blocks (or the first K stored ones, default 4) R times a second each (default 20);
* ``hbm_frag:engine=E[,stride=S]`` -- engine E pins every S-th free HBM block (default 4),
  scattering its free space (fragmentation score -> 1 - S/free);
* ``slow_compute:engine=E,factor=X`` -- engine E's forward passes take X times as long;
* ``fabric_drop:engine=E`` -- engine E drops out of the compute fabric: its sockets to peers
  are closed (what they queue is lost) and every KV message it sends is lost until the fault
  is cleared; control messages still reach the scheduler. Each turn whose KV was lost is
  run again (its peer could not finish it).
* ``store_full:node=N`` -- node N's store refuses every block write with ENOSPC, as a full
  disk does: new KV is not persisted (turns are still served, later ones hit less), each
  refused write is counted in ``dualpath_storage_write_errors_total{reason="full"}``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from dualpath_cli.errors import DualPathError, UsageError
from dualpath_cli.units import parse_duration

__all__ = ["Fault", "FaultError", "FAULT_KINDS", "parse_fault", "parse_faults"]

#: kind -> (target key, required keys, optional keys)
FAULT_KINDS: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    "snic_throttle": ("node", ("fraction",), ()),
    "read_latency": ("node", ("latency",), ()),
    "read_errors": ("node", ("rate",), ()),
    "hot_blocks": ("node", (), ("blocks", "count", "rate")),
    "hbm_frag": ("engine", (), ("stride",)),
    "slow_compute": ("engine", ("factor",), ()),
    "fabric_drop": ("engine", (), ()),
    "store_full": ("node", (), ()),
}


class FaultError(UsageError):
    """A fault SPEC that cannot be parsed or does not fit the cluster (one line, exit 2)."""


@dataclass(frozen=True, slots=True)
class Fault:
    """One fault: its kind, its target (a node or an engine) and its parameters.

    Unused parameters keep their defaults. ``on=False`` undoes the fault of this kind on this
    target. The record is also the wire message of kind ``fault``. ``id`` and ``since`` are
    given by the cluster when it injects the fault (0: not injected yet), so an operator can
    name one fault to clear and see how long a part has been degraded.
    """

    KIND: ClassVar[str] = "fault"
    kind: str
    node: int = -1
    engine: int = -1
    fraction: float = 1.0
    latency_s: float = 0.0
    rate: float = 0.0
    factor: float = 1.0
    stride: int = 0
    count: int = 0
    blocks: tuple[str, ...] = ()
    on: bool = True
    id: int = 0
    since: float = 0.0

    @property
    def target(self) -> tuple[str, int]:
        """``("node", n)`` or ``("engine", e)``."""
        return ("node", self.node) if FAULT_KINDS[self.kind][0] == "node" else (
            "engine", self.engine)

    def spec(self) -> str:
        """The SPEC text that parses back to this fault."""
        key, value = self.target
        parts = [f"{key}={value}"]
        if self.kind == "snic_throttle":
            parts.append(f"fraction={self.fraction:g}")
        elif self.kind == "read_latency":
            parts.append(f"latency={self.latency_s * 1000:g}ms")
        elif self.kind == "read_errors":
            parts.append(f"rate={self.rate:g}")
        elif self.kind == "hot_blocks":
            if self.blocks:
                parts.append("blocks=" + "+".join(self.blocks))
            else:
                parts.append(f"count={self.count}")
            parts.append(f"rate={self.rate:g}")
        elif self.kind == "hbm_frag":
            parts.append(f"stride={self.stride}")
        elif self.kind == "slow_compute":
            parts.append(f"factor={self.factor:g}")
        return f"{self.kind}:{','.join(parts)}"

    def to_dict(self) -> dict[str, Any]:
        """What ``/api/v1/status`` lists: the SPEC, kind, target and parameters."""
        key, value = self.target
        d: dict[str, Any] = {"spec": self.spec(), "kind": self.kind, key: value}
        table: dict[str, dict[str, Any]] = {
                  "snic_throttle": {"fraction": self.fraction},
                  "read_latency": {"latency_s": self.latency_s},
                  "read_errors": {"rate": self.rate},
                  "hot_blocks": {"blocks": list(self.blocks), "count": self.count,
                                 "rate": self.rate},
                  "hbm_frag": {"stride": self.stride},
                  "slow_compute": {"factor": self.factor},
                  "fabric_drop": {},
                  "store_full": {}}
        d.update(table[self.kind])
        if self.id:
            d.update(id=self.id, since=self.since)
        return d

    def describe(self) -> str:
        """``snic_throttle node 1 fraction 0.25``: kind, target and parameters in words."""
        key, value = self.target
        params = self.spec().partition(",")[2]
        words = " ".join(p.replace("=", " ", 1) for p in params.split(",") if p)
        return f"{self.kind} {key} {value}" + (f" {words}" if words else "")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Fault:
        """The fault ``/api/v1/status`` lists (:meth:`to_dict`'s form; ``spec`` is derived,
        so it is not read).

        Raises:
            FaultError: a kind this version does not know.
        """
        kind = str(data.get("kind"))
        if kind not in FAULT_KINDS:
            raise FaultError(f"fault {kind!r}: unknown kind; known: {', '.join(FAULT_KINDS)}")
        return cls(kind, node=int(data.get("node", -1)), engine=int(data.get("engine", -1)),
                   fraction=float(data.get("fraction", 1.0)),
                   latency_s=float(data.get("latency_s", 0.0)),
                   rate=float(data.get("rate", 0.0)), factor=float(data.get("factor", 1.0)),
                   stride=int(data.get("stride", 0)), count=int(data.get("count", 0)),
                   blocks=tuple(str(b) for b in data.get("blocks") or ()),
                   id=int(data.get("id", 0)), since=float(data.get("since", 0.0)))


def _number(kind: str, key: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise FaultError(f"fault {kind}: {key}={text!r} is not a number") from None
    if not math.isfinite(value):
        raise FaultError(f"fault {kind}: {key}={text!r} is not a finite number")
    return value


def _share(kind: str, key: str, text: str) -> float:
    """``key``'s value, a share in (0, 1]."""
    value = _number(kind, key, text)
    if not 0 < value <= 1:
        raise FaultError(f"fault {kind}: {key}={text} must be in (0, 1]")
    return value


def _whole(kind: str, key: str, text: str, low: int) -> int:
    value = _number(kind, key, text)
    if not value.is_integer() or value < low:
        raise FaultError(f"fault {kind}: {key}={text!r} must be a whole number >= {low}")
    return int(value)


def parse_fault(spec: str) -> Fault:
    """The :class:`Fault` a SPEC text names (see the module docstring for the grammar).

    Raises:
        FaultError: one line naming what is wrong (kind, key or value).
    """
    text = spec.strip() if isinstance(spec, str) else ""
    kinds = ", ".join(FAULT_KINDS)
    if not text:
        raise FaultError(f"empty fault spec; expected KIND:key=value,... with KIND one of "
                         f"{kinds}")
    kind, _, rest = text.partition(":")
    kind = kind.strip()
    if kind not in FAULT_KINDS:
        raise FaultError(f"unknown fault kind {kind!r} in {text!r}; choose one of: {kinds}")
    target, required, optional = FAULT_KINDS[kind]
    allowed = (target, *required, *optional)
    given: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or not value:
            raise FaultError(f"fault {kind}: {part!r} is not key=value")
        if key not in allowed:
            raise FaultError(f"fault {kind}: unknown key {key!r}; expected "
                             f"{', '.join(allowed)}")
        if key in given:
            raise FaultError(f"fault {kind}: {key} given twice")
        given[key] = value
    missing = [k for k in (target, *required) if k not in given]
    if missing:
        raise FaultError(f"fault {kind}: missing {', '.join(missing)} (e.g. "
                         f"{_EXAMPLES[kind]})")
    at = _whole(kind, target, given[target], 0)
    fault = Fault(kind, node=at) if target == "node" else Fault(kind, engine=at)
    if kind == "snic_throttle":
        fault = replace(fault, fraction=_share(kind, "fraction", given["fraction"]))
    elif kind == "read_latency":
        try:
            lat = parse_duration(given["latency"])
        except DualPathError as err:
            raise FaultError(f"fault {kind}: latency: {err}") from None
        if not 0 < lat <= 10:
            raise FaultError(f"fault {kind}: latency={given['latency']} must be above 0 and "
                             "at most 10s")
        fault = replace(fault, latency_s=lat)
    elif kind == "read_errors":
        fault = replace(fault, rate=_share(kind, "rate", given["rate"]))
    elif kind == "hot_blocks":
        from dualpath_cli.core.layout import KEY_BYTES  # numpy: only where a key is checked

        blocks = tuple(b.strip().lower() for b in given.get("blocks", "").split("+")
                       if b.strip())
        for b in blocks:
            if len(b) != 2 * KEY_BYTES or not all(c in "0123456789abcdef" for c in b):
                raise FaultError(f"fault {kind}: block {b!r} is not a block key ("
                                 f"{2 * KEY_BYTES} hex digits, as the store lists them)")
        if blocks and "count" in given:
            raise FaultError(f"fault {kind}: give blocks or count, not both")
        count = 0 if blocks else _whole(kind, "count", given.get("count", "4"), 1)
        r = _number(kind, "rate", given.get("rate", "20"))
        if not 0 < r <= 1000:
            raise FaultError(f"fault {kind}: rate={given.get('rate')} must be in (0, 1000] "
                             "reads per second per block")
        fault = replace(fault, blocks=blocks, count=count, rate=r)
    elif kind == "hbm_frag":
        fault = replace(fault, stride=_whole(kind, "stride", given.get("stride", "4"), 2))
    elif kind == "slow_compute":
        x = _number(kind, "factor", given["factor"])
        if not 1 <= x <= 100:
            raise FaultError(f"fault {kind}: factor={given['factor']} must be in [1, 100]")
        fault = replace(fault, factor=x)
    return fault


_EXAMPLES = {
    "snic_throttle": "snic_throttle:node=1,fraction=0.25",
    "read_latency": "read_latency:node=1,latency=20ms",
    "read_errors": "read_errors:node=1,rate=0.1",
    "hot_blocks": "hot_blocks:node=0,count=4,rate=20",
    "hbm_frag": "hbm_frag:engine=2,stride=4",
    "slow_compute": "slow_compute:engine=1,factor=4",
    "fabric_drop": "fabric_drop:engine=0",
    "store_full": "store_full:node=1",
}


def parse_faults(specs: Sequence[str]) -> list[Fault]:
    """Every SPEC parsed; a later fault of the same kind and target replaces an earlier one."""
    out: dict[tuple[str, tuple[str, int]], Fault] = {}
    for spec in specs:
        f = parse_fault(spec)
        out[f.kind, f.target] = f
    return list(out.values())
