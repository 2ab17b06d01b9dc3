"""A started :class:`LiveCluster` behind the real API server on loopback, guarded by a
launch's token (a file, as ``dualpath launch`` writes one): what the end-to-end tests of the
operator commands talk to. A test that uses it starts a server: it is ``e2e``.

Why not tests/openai_server.py's ``serve_new``: that one serves the OpenAI routes with a
fixed token and closes the cluster; these tests need the token a client must send, a GPU
backend of their own, and the polite end (a drain), as a launched cluster stops.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

from dualpath_cli.api.app import create_app
from dualpath_cli.api.auth import TokenAuth
from dualpath_cli.api.server import ServerThread
from dualpath_cli.runtime.options import RuntimeOptions
from dualpath_cli.services.live import LiveCluster
from dualpath_cli.telemetry.gpu import GpuBackend


class TokenServed(NamedTuple):
    """A served cluster: the cluster, its base URL and the token its API wants."""

    live: LiveCluster
    url: str
    auth: TokenAuth


@contextmanager
def serve_with_token(opts: RuntimeOptions, token_file: Path,
                     gpu: GpuBackend | None = None) -> Iterator[TokenServed]:
    """Start a cluster of ``opts``, serve it behind a new token kept in ``token_file``
    (``gpu``: the GPU backend its API reports) until the block exits; then drain it (10 s).
    """
    live = LiveCluster(opts)
    live.start()
    auth = TokenAuth.generate(token_file)
    try:
        with ServerThread(create_app(live, auth, gpu=gpu)) as server:
            yield TokenServed(live, server.url, auth)
    finally:
        live.drain(10)
