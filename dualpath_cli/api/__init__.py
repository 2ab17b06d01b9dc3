"""The live cluster's HTTP API (server side) and its typed client.

``import dualpath_cli.api.client`` stays light (httpx only): the server side (FastAPI) is
imported only when :func:`create_app` is asked for, so front-ends that only read a cluster
(monitor, TUI, diagnose) never load it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dualpath_cli.api.app import create_app
    from dualpath_cli.api.auth import TokenAuth
    from dualpath_cli.api.client import DualPathClient

__all__ = ["create_app", "TokenAuth", "DualPathClient"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from dualpath_cli.api.app import create_app
        return create_app
    if name == "TokenAuth":
        from dualpath_cli.api.auth import TokenAuth
        return TokenAuth
    if name == "DualPathClient":
        from dualpath_cli.api.client import DualPathClient
        return DualPathClient
    raise AttributeError(f"module 'dualpath_cli.api' has no attribute {name!r}")
