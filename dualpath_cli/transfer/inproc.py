"""In-process fabric: the shipped fake, queues instead of sockets, same interface."""

from __future__ import annotations

import itertools
import queue
import threading
from typing import Any

import numpy as np

from dualpath_cli.transfer.base import Message

__all__ = ["InProcFabric", "InProcEndpoint"]


class InProcEndpoint:
    """A queue-backed endpoint. Buffers are passed by reference (zero copy, like ZeroMQ)."""

    def __init__(self, fabric: InProcFabric, address: str) -> None:
        self.address = address
        self._fabric = fabric
        self._queue: queue.Queue[Message] = queue.Queue()

    def send(self, to: str, header: dict[str, Any],
             buffers: list[np.ndarray] | None = None) -> None:
        target = self._fabric.lookup(to)
        if target is not None:
            target.accept(Message(dict(header), list(buffers or [])))

    def accept(self, message: Message) -> None:
        """Queue a message sent to this endpoint (its sender's hand-over)."""
        self._queue.put(message)

    def recv(self, timeout: float | None = None) -> Message | None:
        try:
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            return None

    def close(self) -> None:
        self._fabric.unregister(self.address)


class InProcFabric:
    """A registry of in-process endpoints."""

    kind = "inproc"

    def __init__(self) -> None:
        self._endpoints: dict[str, InProcEndpoint] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count()

    def endpoint(self, name: str) -> InProcEndpoint:
        with self._lock:
            ep = InProcEndpoint(self, f"inproc://{name}-{next(self._ids)}")
            self._endpoints[ep.address] = ep
            return ep

    def lookup(self, address: str) -> InProcEndpoint | None:
        """The endpoint at ``address`` if it is still open."""
        with self._lock:
            return self._endpoints.get(address)

    def unregister(self, address: str) -> None:
        """Forget ``address`` (messages to it are dropped from now on)."""
        with self._lock:
            self._endpoints.pop(address, None)
