"""Which cluster a live command talks to: ``--url``, else ``DUALPATH_URL``, else the state file.

Why one module: ``status``, ``stop``, ``monitor``, ``record``, ``diagnose`` and ``tune`` all
find "the running cluster" the same way, and a change (a new variable, a better message when
the token is missing) must reach them all at once. Light on purpose (the state file reader
only) so ``dualpath --help`` does not pay for it; the API client loads inside :func:`connect`.

Rules:

1. ``--url`` or ``DUALPATH_URL`` names the API. Its token is ``DUALPATH_TOKEN``, else the
   token file of the live state file with that URL (none: read-only access).
2. Otherwise the one live state file (``services/statefile.py``) gives the URL and its token
   file; none is :class:`NotRunning` (exit 3), several need ``--port``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from dualpath_cli.errors import DualPathError, UsageError
from dualpath_cli.services import statefile
from dualpath_cli.services.statefile import ClusterState

__all__ = ["Target", "NotRunning", "NoToken", "EXIT_NONE", "resolve", "running", "connect"]

#: ``dualpath status``'s exit code for "no cluster found".
EXIT_NONE = 3


class NotRunning(DualPathError):
    """No cluster found through the state file, ``--url`` or ``DUALPATH_URL``."""

    exit_code = EXIT_NONE


class NoToken(DualPathError):
    """A control command without the cluster's bearer token (exit 2, like a usage error)."""

    exit_code = 2


@dataclass(frozen=True, slots=True)
class Target:
    """A cluster to ask: its API, its token (``None``: read-only) and why there is none.

    Args:
        url: the API's base URL.
        token: the bearer token, or ``None``.
        state: the state file that named it (``None``: given by URL, no local launcher).
        token_note: why ``token`` is ``None`` (shown when a control command is refused).
    """

    url: str
    token: str | None
    state: ClusterState | None = None
    token_note: str = ""

    def require_token(self, what: str) -> str:
        """The token, or :class:`NoToken` saying where it was looked for and how to give it."""
        if self.token:
            return self.token
        raise NoToken(f"{what} changes the running cluster at {self.url} and needs its bearer "
                      f"token: {self.token_note or 'none found'}; set DUALPATH_TOKEN (the "
                      "launcher wrote it to the token file named in its state file)")


def _read_token(path: str) -> tuple[str | None, str]:
    """``(token, why not)`` from a token file (a world-readable one is refused)."""
    from dualpath_cli.api.auth import TokenAuth, TokenFileError

    try:
        return TokenAuth.load(path).token, ""
    except TokenFileError as err:
        return None, str(err)


def resolve(url: str | None = None, port: int | None = None) -> Target:
    """The cluster to ask (module docstring); :class:`NotRunning` when there is none."""
    url = url or os.environ.get("DUALPATH_URL")
    live, stale = statefile.live_states(port)
    if url:
        url = url.rstrip("/")
        match = next((s for s in live if s.url == url), None)
        env = os.environ.get("DUALPATH_TOKEN")
        if env:
            return Target(url, env, match)
        if match is None:
            return Target(url, None, None, "DUALPATH_TOKEN is not set and no live state "
                          f"file in {statefile.state_dir()} names {url}")
        token, why = _read_token(match.token_file)
        return Target(url, token, match, why)
    if not live:
        where = statefile.state_dir()
        gone = f"; removed a stale state file (pid {stale[0].pid} is gone)" if stale else ""
        raise NotRunning(f"no cluster running (no live state file in {where}{gone})")
    if len(live) > 1:
        ports = ", ".join(str(s.port) for s in live)
        raise UsageError(f"{len(live)} clusters are running (ports {ports}); choose one "
                         "with --port")
    s = live[0]
    token, why = _read_token(s.token_file)
    return Target(s.url, token, s, why)


def running(url: str | None = None) -> Target | None:
    """The cluster a command should act on live, or ``None`` when none is named or running.

    Why: ``tune set`` changes a running cluster when there is one and edits the config file
    otherwise; "otherwise" means no ``--url``, no ``DUALPATH_URL`` and no live state file.
    """
    try:
        return resolve(url)
    except NotRunning:
        return None


def connect(url: str | None, timeout: float) -> Any:
    """A client of the target cluster (the one seam tests replace with a FakeClient)."""
    from dualpath_cli.api.client import DualPathClient

    target = resolve(url)
    return DualPathClient(target.url, target.token, timeout=timeout)
