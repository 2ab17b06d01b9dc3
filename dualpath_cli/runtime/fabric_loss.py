"""Which engine's fabric link lost a turn's KV, from the ``read_failed`` that reported it.

Why apart from the wire protocol (runtime/wire.py): the words are the engines' (their
``ReadFailed.why``) and the blame is the scheduler's (it counts the lost turn against an
engine: ``kv_lost_turns``, the fabric workflow of diagnose); both share these constants.
"""

from __future__ import annotations

from dualpath_cli.runtime.wire import ReadFailed

__all__ = ["FABRIC_LOST", "FABRIC_MISSING", "PEER_GONE", "kv_loss_engine"]

#: How a :class:`ReadFailed` says a KV message of the turn was lost on the compute fabric:
#: dropped by its sender (``... (this engine's fabric link is down)`` or ``... (the peer did
#: not take it)``), or found missing by the DE (``... from PE missing ...``).
FABRIC_LOST = "fabric: a KV message"
FABRIC_MISSING = "fabric: KV rows from"
PEER_GONE = "(the peer did not take it)"


def kv_loss_engine(msg: ReadFailed, pe: int, de: int) -> int | None:
    """The engine whose fabric link lost a turn's KV (``None``: ``msg`` is no fabric loss):
    the sender whose own link is down, the peer that did not take a message, the PE whose
    rows a DE found missing."""
    if msg.block >= 0 or not msg.why.startswith("fabric:"):
        return None
    if msg.why.startswith(FABRIC_MISSING):
        return pe
    if PEER_GONE in msg.why:
        return de if msg.eid == pe else pe
    return msg.eid
