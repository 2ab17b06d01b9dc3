"""The transfer interface: endpoints that send and receive (header, buffers) messages.

Why a header plus buffers: control fields travel as a small msgpack map while KV layer
blocks travel as raw frames that the receiver views without copying (``np.frombuffer``).
An endpoint is owned by one receiving thread; ``send`` may be called from any thread.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

__all__ = ["Message", "Endpoint", "ResetsPeers", "Fabric", "UNREADABLE", "buffer_specs",
           "restore_buffers"]

UNREADABLE = "_unreadable"
"""Header key of a message a fabric received but could not read (the value says why)."""


@dataclass(slots=True)
class Message:
    """One message: a header map and zero or more numpy buffers."""

    header: dict[str, Any]
    buffers: list[np.ndarray] = field(default_factory=list)

    @property
    def kind(self) -> str:
        """The message type (``header["t"]``)."""
        return str(self.header.get("t", ""))

    @property
    def nbytes(self) -> int:
        """Payload bytes carried by the buffers."""
        return int(sum(b.nbytes for b in self.buffers))


class Endpoint(Protocol):
    """A mailbox other endpoints can address by ``address``."""

    address: str

    def send(self, to: str, header: dict[str, Any],
             buffers: list[np.ndarray] | None = None) -> bool | None:
        """Deliver a message to the endpoint at ``to`` (fire and forget, ordered per pair);
        False when it was dropped and the sender knows it (ZeroMQ: the peer did not take it
        within the send timeout)."""

    def recv(self, timeout: float | None = None) -> Message | None:
        """The next message, or None after ``timeout`` seconds (None = wait forever)."""

    def close(self) -> None:
        """Release sockets/queues; further sends to this address are dropped."""


@runtime_checkable
class ResetsPeers(Protocol):
    """An endpoint that keeps a connection per peer and can drop them at once (ZeroMQ),
    so a cut link loses what they still queue (the ``fabric_drop`` fault)."""

    def reset_peers(self, keep: set[str]) -> int:
        """Close the connections to every peer but ``keep``; returns how many closed."""
        ...


class Fabric(Protocol):
    """Creates endpoints; an address from one fabric is reachable from its peers."""

    kind: str

    def endpoint(self, name: str) -> Endpoint:
        """A new bound endpoint; ``name`` is for logs only."""


def buffer_specs(buffers: list[np.ndarray]) -> list[list[Any]]:
    """[dtype, shape] of each buffer, for the header."""
    return [[b.dtype.str, list(b.shape)] for b in buffers]


def restore_buffers(specs: list[list[Any]], frames: list[Any]) -> list[np.ndarray]:
    """Views of raw frames as arrays with the sender's dtype and shape (no copy)."""
    out = []
    for (dtype, shape), frame in zip(specs, frames, strict=True):
        out.append(np.frombuffer(frame, dtype=np.dtype(dtype)).reshape(shape))
    return out
