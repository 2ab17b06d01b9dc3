"""A real HTTP server on loopback for the OpenAI-route tests: uvicorn in a thread serving
``create_app`` over a started :class:`LiveCluster` (no test client, no mocks)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import uvicorn

from dualpath_cli.api.app import create_app
from dualpath_cli.api.auth import TokenAuth
from dualpath_cli.services.live import LiveCluster
from dualpath_cli.telemetry.gpu import UnavailableGpu


@dataclass
class Served:
    """A serving cluster: its base URL and the cluster."""

    url: str
    live: LiveCluster


@contextmanager
def serve(live: LiveCluster, timeout: float = 30.0) -> Iterator[Served]:
    """Serve ``live`` (already started) on a free loopback port until the block exits."""
    # IPPROTO_TCP: asyncio then sets TCP_NODELAY on accepted sockets (no 40 ms Nagle stall)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    app = create_app(live, TokenAuth("test-token"), gpu=UnavailableGpu("tests"))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.01)
    try:
        yield Served(f"http://127.0.0.1:{port}", live)
    finally:
        server.should_exit = True
        thread.join(timeout)
        sock.close()
