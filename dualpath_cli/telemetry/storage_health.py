"""Each node's store health since start: failed reads, corrupt blocks, refused writes.

Why in the status record: a failing, corrupt or full store serves every turn still, so
nothing else ``status`` shows (state, engines, queue) moves; an operator's first glance must
still say which node's store is in trouble. The counts are the engines' own counters (the
families ``/metrics`` serves: ``dualpath_storage_read_errors_total``,
``_corrupt_blocks_total``, ``_write_errors_total``), read from their last metrics frames,
so status and the metrics agree; ``diagnose store-health`` grades what grew in a window.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from dualpath_cli.telemetry.metrics import spec
from dualpath_cli.telemetry.view import NodeView

__all__ = ["NodeStorage", "storage_of_frames", "storage_from_dicts", "node_names",
           "FAMILIES"]

#: NodeStorage field -> the counter family it sums over the node's engines and labels.
FAMILIES = {"read_errors": "dualpath_storage_read_errors_total",
            "corrupt_blocks": "dualpath_storage_corrupt_blocks_total",
            "writes_refused": "dualpath_storage_write_errors_total"}
_LABELS = {family: spec(family).labels for family in FAMILIES.values()}


@dataclass(frozen=True, slots=True)
class NodeStorage:
    """One node's store trouble since start (only nodes with some are listed)."""

    node: int
    name: str
    read_errors: int = 0
    corrupt_blocks: int = 0
    writes_refused: int = 0
    #: of writes_refused, those refused because the store was full (ENOSPC)
    full: int = 0

    def line(self) -> str:
        """``store on node D1: 3 reads failed, 1 corrupt block quarantined, 12 writes
        refused (full) since start``."""
        parts = []
        if self.read_errors:
            parts.append(f"{self.read_errors} read{'s' * (self.read_errors != 1)} failed")
        if self.corrupt_blocks:
            parts.append(f"{self.corrupt_blocks} corrupt block"
                         f"{'s' * (self.corrupt_blocks != 1)} quarantined")
        if self.writes_refused:
            parts.append(f"{self.writes_refused} write{'s' * (self.writes_refused != 1)} "
                         "refused" + (" (full)" if self.full == self.writes_refused else ""))
        return (f"store on node {self.name}: {', '.join(parts)} since start "
                "(dualpath diagnose store-health)")

    def to_dict(self) -> dict[str, Any]:
        """The status record's form."""
        return asdict(self)


def storage_of_frames(frames: Mapping[Any, Any], names: Mapping[int, str]
                      ) -> tuple[NodeStorage, ...]:
    """The nodes with failed reads, corrupt blocks or refused writes, from the engines' last
    metrics frames, by node; ``names``: node -> its operator's name.

    Cheap at 1,152 engines: where each engine's frame keeps these counters is found once per
    frame layout (``lid``) and remembered; each call then reads a few values per engine.
    """
    from dualpath_cli.telemetry.frames import is_frame  # numpy: the server side only

    counts: dict[int, dict[str, int]] = {}
    for fr in frames.values():
        if not is_frame(fr):
            continue
        values = fr["values"]
        for field, node, full, pos in _slots_of(fr):
            value = int(values[pos]) if pos < len(values) else 0
            if not value:
                continue
            c = counts.setdefault(node, {})
            c[field] = c.get(field, 0) + value
            if full:
                c["full"] = c.get("full", 0) + value
    return tuple(NodeStorage(n, names.get(n, str(n)), **c) for n, c in sorted(counts.items()))


_Slot = tuple[str, int, bool, int]  # field, node, refused as full, position in values
_LAYOUTS: dict[str, list[_Slot]] = {}
_FIELD_OF = {family: field for field, family in FAMILIES.items()}


def _slots_of(fr: Mapping[str, Any]) -> list[_Slot]:
    lid = str(fr.get("lid", ""))
    known = _LAYOUTS.get(lid) if lid else None
    if known is not None:
        return known
    out: list[_Slot] = []
    pos = 0
    for name, key, slots in fr["layout"]:
        field = _FIELD_OF.get(name)
        if field is not None and slots == 1:
            labels = dict(zip(_LABELS[name], map(str, key), strict=False))
            node = labels.get("node", "")
            if node.lstrip("-").isdigit():
                out.append((field, int(node), labels.get("reason") == "full", pos))
        pos += slots
    if lid:
        if len(_LAYOUTS) >= 4096:  # engines restarted many times: start over
            _LAYOUTS.clear()
        _LAYOUTS[lid] = out
    return out


def node_names(nodes: Sequence[NodeView]) -> dict[int, str]:
    """Node -> its operator's name (``D1``), as the membership record has it; from a view
    without names, the role's letter and the node id."""
    return {n.node: n.name or f"{'P' if n.role == 'prefill' else 'D'}{n.node}" for n in nodes}


def storage_from_dicts(data: Sequence[Mapping[str, Any]] | None) -> tuple[NodeStorage, ...]:
    """The status record's ``storage`` list (absent from an older API: empty)."""
    out = []
    for d in data or ():
        try:
            out.append(NodeStorage(int(d["node"]), str(d.get("name") or d["node"]),
                                   int(d.get("read_errors", 0)), int(d.get("corrupt_blocks", 0)),
                                   int(d.get("writes_refused", 0)), int(d.get("full", 0))))
        except (KeyError, TypeError, ValueError):
            continue
    return tuple(out)
