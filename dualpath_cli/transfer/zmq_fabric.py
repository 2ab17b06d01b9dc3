"""ZeroMQ fabric: PUSH/PULL over loopback TCP, msgpack header + zero-copy buffer frames.

Each endpoint binds one PULL socket on 127.0.0.1 (random port); senders keep one PUSH socket
per destination. A message is a multipart ``[msgpack(header + buffer specs), buf0, buf1...]``
whose buffers are sent and received with ``copy=False``, so layer blocks are never
serialised (the small header is copied: cheaper than a zero-copy frame). ZeroMQ sockets
are not thread-safe: sends are serialised by a lock and only the owning thread receives.
With :class:`~dualpath_cli.transfer.curve.CurveKeys` every mailbox is a CURVE server and
every sender a CURVE client (:mod:`dualpath_cli.transfer.curve`).
"""

from __future__ import annotations

import os
import threading
from typing import Any

import msgpack
import numpy as np
import zmq

from dualpath_cli.transfer.base import UNREADABLE, Message, buffer_specs, restore_buffers
from dualpath_cli.transfer.curve import CurveKeys, secure_client, secure_server

__all__ = ["ZmqFabric", "ZmqEndpoint", "BIND_HOST_ENV"]

#: Environment variable naming the address endpoints bind (default: loopback).
BIND_HOST_ENV = "DUALPATH_BIND_HOST"

# pyzmq's flags as plain ints: its enum flags cost an enum operation per frame (``|`` in
# send_multipart, a conversion in recv), a third of a small message's send on the
# scheduler's hot path
_SNDMORE = int(zmq.SNDMORE)
_NOBLOCK = int(zmq.NOBLOCK)
_RCVMORE = int(zmq.RCVMORE)
_RCVTIMEO = int(zmq.RCVTIMEO)


class ZmqEndpoint:
    """A PULL mailbox plus cached PUSH sockets to peers."""

    def __init__(self, ctx: zmq.Context[Any], host: str = "127.0.0.1", *,
                 send_timeout_ms: int = 500, send_hwm: int | None = None,
                 port: int = 0, curve: CurveKeys | None = None) -> None:
        self._ctx = ctx
        self._send_timeout_ms = send_timeout_ms
        self._send_hwm = send_hwm  # None: libzmq's default (1000 messages); 0: unbounded
        self.curve = curve
        self._pull = ctx.socket(zmq.PULL)
        self._pull.setsockopt(zmq.LINGER, 0)
        if curve is not None:
            secure_server(ctx, self._pull, curve)
        if port:  # a restarted scheduler binds its old port (runtime/checkpoint.py)
            try:
                self._pull.bind(f"tcp://{host}:{port}")
            except zmq.ZMQError:
                self._pull.close()
                raise
        else:
            port = self._pull.bind_to_random_port(f"tcp://{host}")
        self.address = f"tcp://{host}:{port}"
        self._push: dict[str, zmq.Socket[Any]] = {}
        self._lock = threading.Lock()
        self._recv_timeout_ms = -1  # the PULL socket's RCVTIMEO (libzmq's default: none)
        self._closed = False
        self.dropped = 0

    def bound_to(self, host: str, port: int) -> ZmqEndpoint:
        """A new endpoint on this one's context and keys, bound to ``host:port`` (a
        restarted scheduler takes its old port back).

        Raises:
            zmq.ZMQError: the port is taken.
        """
        return ZmqEndpoint(self._ctx, host, port=port, curve=self.curve)

    def send(self, to: str, header: dict[str, Any],
             buffers: list[np.ndarray] | None = None) -> bool:
        """Queue a message to ``to``; False when it was dropped (closed, or the peer did
        not take it within the send timeout)."""
        bufs = [b if b.flags.c_contiguous else np.ascontiguousarray(b) for b in buffers or ()]
        if bufs:
            head = dict(header)
            head["_b"] = buffer_specs(bufs)
        else:  # no buffers, no specs: the receiver reads a missing "_b" as none
            head = header
        packed = msgpack.packb(head, use_bin_type=True)
        with self._lock:
            if self._closed:
                return False
            sock = self._push.get(to)
            if sock is None:
                sock = self._ctx.socket(zmq.PUSH)
                sock.setsockopt(zmq.LINGER, 200)
                # a dead peer must not stall the sender
                sock.setsockopt(zmq.SNDTIMEO, self._send_timeout_ms)
                if self._send_hwm is not None:
                    sock.setsockopt(zmq.SNDHWM, self._send_hwm)
                if self.curve is not None:
                    secure_client(sock, self.curve)
                sock.connect(to)
                self._push[to] = sock
            try:
                # the header copied (small), then each array as its own buffer (no view to
                # make); once the first part is taken the others are too (ZeroMQ queues a
                # multipart message whole)
                last = len(bufs) - 1
                sock.send(packed, _SNDMORE if last >= 0 else 0)
                for i, b in enumerate(bufs):
                    frame: Any = b if b.size else b""  # an array is a buffer ZeroMQ takes
                    sock.send(frame, _SNDMORE if i < last else 0, copy=False)
            except zmq.Again:
                self.dropped += 1  # peer gone or not reading: the caller reports the work
                return False
        return True

    def reset_peers(self, keep: set[str]) -> int:
        """Close the sockets to every peer but ``keep`` at once (linger 0: what they still
        queue is lost, as over a connection that drops); the next send reconnects.
        Returns how many were closed."""
        with self._lock:
            gone = [to for to in self._push if to not in keep]
            for to in gone:
                self._push.pop(to).close(linger=0)
        return len(gone)

    def recv(self, timeout: float | None = None) -> Message | None:
        sock = self._pull
        ms = -1 if timeout is None else max(0, int(timeout * 1000))
        try:
            if ms == 0:
                first = sock.recv(_NOBLOCK)
            else:
                # one blocking receive with the socket's timeout: ~60% of the CPU of a
                # non-blocking try, its zmq.Again and a poll when the mailbox is empty, and
                # one call when a message is queued (bench/zmq_recv.py)
                if ms != self._recv_timeout_ms:
                    sock.setsockopt(_RCVTIMEO, ms)
                    self._recv_timeout_ms = ms
                first = sock.recv()
        except zmq.Again:
            return None
        # the header is small: copied as bytes (a zero-copy frame costs more); the buffers
        # (a prompt, KV layers) zero-copy; the parts of a message arrive together
        try:
            head = msgpack.unpackb(first, raw=False)
        except (ValueError, TypeError, msgpack.UnpackException) as err:
            head = f"{type(err).__name__}: {err}"
        if not isinstance(head, dict):  # not our peer's header (or a part of a message
            self._skip_parts()           # sent with more parts than its header declared)
            return _unreadable(f"a header that is not a msgpack map ({head!r:.60})")
        specs = head.pop("_b", None)
        if not specs:
            # the header declares no buffer parts: none is queried for (a RCVMORE query,
            # 1-2 us, was a tenth of a control message's receive at the scheduler)
            return Message(head, [])
        frames = []
        while sock.get(_RCVMORE):
            frames.append(sock.recv(copy=False).buffer)
        try:
            return Message(head, restore_buffers(specs, frames))
        except (ValueError, TypeError) as err:
            return _unreadable(f"{len(frames)} buffer parts that do not match the header's "
                               f"{len(specs)} ({err})")

    def _skip_parts(self) -> None:
        """Drop the rest of the message being received."""
        while self._pull.get(_RCVMORE):
            self._pull.recv(copy=False)

    @property
    def socket(self) -> zmq.Socket[Any]:
        """The PULL socket (for a poller over many endpoints owned by one thread)."""
        return self._pull

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for sock in self._push.values():
                sock.close()
            self._push.clear()
            self._pull.close()


def _unreadable(why: str) -> Message:
    """A message that could not be read, as one :func:`~dualpath_cli.runtime.wire.decode`
    refuses with ``why`` (receivers count and log it; the loop goes on)."""
    return Message({UNREADABLE: why}, [])


class ZmqFabric:
    """Creates ZeroMQ endpoints sharing one context per process (CURVE with ``curve``)."""

    kind = "zmq"

    def __init__(self, host: str | None = None, curve: CurveKeys | None = None) -> None:
        self._ctx: zmq.Context[Any] = zmq.Context.instance()
        # a node that joins a scheduler on another host binds where its peers reach it
        self.host = host or os.environ.get(BIND_HOST_ENV) or "127.0.0.1"
        self.curve = curve

    def endpoint(self, name: str) -> ZmqEndpoint:
        del name
        return ZmqEndpoint(self._ctx, self.host, curve=self.curve)
