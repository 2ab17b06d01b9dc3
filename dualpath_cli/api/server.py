"""Serve an ASGI app with uvicorn on a background thread (tests, benchmarks, embedding).

Why: an end-to-end test or benchmark needs a real server on a free loopback port that it can
stop cleanly; binding the socket first (port 0) and handing it to uvicorn leaves no window in
which another process could take the port, and waiting on ``server.started`` replaces sleeps.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import uvicorn

from dualpath_cli.api.listen import base_url, listen

__all__ = ["ServerThread"]


class ServerThread:
    """uvicorn serving ``app`` on ``host:port`` (port 0: a free one) until :meth:`stop`.

    Use as a context manager; ``url`` is the base URL once started.
    """

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, *,
                 log_level: str = "warning", access_log: bool = False) -> None:
        self.sock = listen(host, port)
        self.host = host
        self.port: int = self.sock.getsockname()[1]
        self.url = base_url(host, self.port)
        config = uvicorn.Config(app, log_level=log_level, access_log=access_log,
                                lifespan="off", timeout_graceful_shutdown=5)
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self.server.run,
                                        kwargs={"sockets": [self.sock]}, daemon=True,
                                        name=f"uvicorn-{self.port}")

    def start(self, timeout: float = 10.0) -> ServerThread:
        """Start serving; returns once uvicorn accepts connections."""
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive():
                raise RuntimeError(f"the API server on {self.url} exited during start")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"the API server on {self.url} did not start in "
                                   f"{timeout:g} s")
            time.sleep(0.01)  # polling uvicorn's flag: it offers no event to wait on
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving and close the socket (idempotent)."""
        self.server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout)
        self.sock.close()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
