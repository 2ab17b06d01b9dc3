"""The API's listening socket, bound before anything else starts.

Why its own light module: ``dualpath launch`` binds first (a taken port fails in
milliseconds, before any engine starts) and the test/benchmark server thread binds the same
way, and neither should pay for importing uvicorn to do it.
"""

from __future__ import annotations

import socket

__all__ = ["listen", "base_url", "free_port"]


def listen(host: str, port: int) -> socket.socket:
    """A TCP socket listening on ``host:port`` (port 0: a free one), not inheritable.

    The protocol is ``IPPROTO_TCP``, not 0: asyncio sets TCP_NODELAY on accepted connections
    only for a TCP-protocol listener, and without it every response body waited ~40 ms for
    the client's delayed ACK (Nagle).

    Raises:
        socket.gaierror: ``host`` does not resolve.
        OSError: the address cannot be bound (``EADDRINUSE`` when taken).
    """
    family, _, _, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # not REUSEPORT: one owner
    try:
        sock.bind(addr)
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(False)
    return sock


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now (for a child to bind: tests, benchmarks)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def base_url(host: str, port: int) -> str:
    """``http://host:port`` (IPv6 hosts in brackets)."""
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}"
