"""A real HTTP server on loopback for the OpenAI-route tests: ``create_app`` over a started
:class:`LiveCluster`, served by :class:`~dualpath_cli.api.server.ServerThread` (uvicorn on a
free port; no test client, no mocks)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dualpath_cli.api.app import create_app
from dualpath_cli.api.auth import TokenAuth
from dualpath_cli.api.server import ServerThread
from dualpath_cli.runtime.options import RuntimeOptions
from dualpath_cli.services.live import LiveCluster
from dualpath_cli.telemetry.gpu import UnavailableGpu


def tiny_opts(**kw: Any) -> RuntimeOptions:
    """The cluster these tests serve: 8-token blocks, a slow GPU's compute rate, and
    heartbeats lenient enough for a loaded CI box (no false deaths)."""
    return RuntimeOptions(block_tokens=8, flops_rate=5e9, fetch_s=0.005,
                          heartbeat_timeout=10.0, **kw)


@dataclass
class Served:
    """A serving cluster: its base URL and the cluster."""

    url: str
    live: LiveCluster


@contextmanager
def serve(live: LiveCluster) -> Iterator[Served]:
    """Serve ``live`` (already started) on a free loopback port until the block exits."""
    app = create_app(live, TokenAuth("test-token"), gpu=UnavailableGpu("tests"))
    with ServerThread(app) as server:
        yield Served(server.url, live)


@contextmanager
def serve_new(opts: RuntimeOptions) -> Iterator[Served]:
    """Start a :class:`LiveCluster` of ``opts`` and serve it until the block exits; then
    close it (its engine processes with it)."""
    live = LiveCluster(opts)
    live.start()
    try:
        with serve(live) as s:
            yield s
    finally:
        live.close()


@contextmanager
def serve_processes(store_dir: Path) -> Iterator[Served]:
    """:func:`tiny_opts`' cluster as engine processes over a PosixStore in ``store_dir``,
    served until the block exits."""
    with serve_new(tiny_opts(processes=True, store_dir=store_dir)) as s:
        yield s
