"""Which cluster a live command talks to, and with which token: one rule for every command.

Why one module: ``status``, ``stop``, ``monitor``, ``record``, ``diagnose``, ``explain``,
``top``, ``tune``, ``storage warm`` and ``bench --url`` all take ``--url``, ``--port`` and
``--token-file`` (cli/options.py) and find "the running cluster" the same way, and a change (a
new variable, a better message when the token is missing) must reach them all at once. Light
on purpose (the state file reader only) so ``dualpath --help`` does not pay for it; the API
client loads inside :func:`connect`.

Rules (a :class:`ClusterRef` holds what the command was given):

1. The API: ``--url``, else ``--port`` (the live state file of the launch on that port),
   else ``DUALPATH_URL``, else the one live state file (``services/statefile.py``). None is
   :class:`NotRunning` (exit 3); several, with neither ``--url`` nor ``--port``, are
   :class:`AmbiguousCluster` (exit 3, naming their ports).
2. The token: ``--token-file``, else ``DUALPATH_TOKEN``, else the token file of the live state
   file that names the API (none: read-only access).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dualpath_cli.errors import DualPathError, UsageError
from dualpath_cli.services import statefile
from dualpath_cli.services.statefile import ClusterState

if TYPE_CHECKING:
    from dualpath_cli.api.protocol import ClusterClient

__all__ = ["ClusterRef", "Target", "NotRunning", "AmbiguousCluster", "NoToken", "EXIT_NONE",
           "locate", "resolve", "running", "connect", "read_token_file"]

#: ``dualpath status``'s exit code for "no cluster found" (and "which one?").
EXIT_NONE = 3


class NotRunning(DualPathError):
    """No cluster found through ``--url``, ``--port``, ``DUALPATH_URL`` or the state file."""

    exit_code = EXIT_NONE


class AmbiguousCluster(DualPathError):
    """Several clusters run here and the command named none (exit 3: it cannot look).

    Not a :class:`NotRunning`: ``tune set`` edits the config file when none runs, never when
    it only does not know which one to change.
    """

    exit_code = EXIT_NONE


class NoToken(DualPathError):
    """A control command without the cluster's bearer token (exit 2, like a usage error)."""

    exit_code = 2


@dataclass(frozen=True, slots=True)
class ClusterRef:
    """The cluster a command was told about: its ``--url``, ``--port`` and ``--token-file``.

    Args:
        url: the API's base URL (``None``: not given).
        port: the port of a cluster launched on this host (its state file).
        token_file: a file holding the cluster's bearer token.
    """

    url: str | None = None
    port: int | None = None
    token_file: Path | None = None

    @property
    def named(self) -> str | None:
        """The flag that names a cluster (``--url`` or ``--port``), ``None`` when neither."""
        return "--url" if self.url is not None else "--port" if self.port is not None else None


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
                      f"token: {self.token_note or 'none found'}; pass --token-file or set "
                      "DUALPATH_TOKEN (the launcher wrote it to the token file named in its "
                      "state file)")


def read_token_file(path: Path) -> str:
    """The token in ``--token-file``'s file; :class:`UsageError` when it cannot be read."""
    try:
        text = path.expanduser().read_text().strip()
    except OSError as err:
        raise UsageError(f"--token-file {path}: cannot read it ({err.strerror})") from None
    except UnicodeDecodeError:
        raise UsageError(f"--token-file {path}: not a token (not UTF-8 text)") from None
    if not text:
        raise UsageError(f"--token-file {path}: it is empty")
    return text


def _read_token(path: str) -> tuple[str | None, str]:
    """``(token, why not)`` from a token file (a world-readable one is refused)."""
    from dualpath_cli.api.auth import TokenAuth, TokenFileError

    try:
        return TokenAuth.load(path).token, ""
    except TokenFileError as err:
        return None, str(err)


def locate(ref: ClusterRef = ClusterRef()) -> tuple[str, ClusterState | None]:
    """The API to ask and the live state file of its launch here (``None``: not launched on
    this host), by rule 1 of the module docstring."""
    url = ref.url
    if url is None and ref.port is None:
        url = os.environ.get("DUALPATH_URL") or None
    if url:
        if any(c.isspace() or not c.isprintable() for c in url):  # echoed in errors: one line
            raise UsageError(f"--url/DUALPATH_URL {url!r}: not a URL (it holds spaces or "
                             "control characters)")
        url = url.rstrip("/")
        live, _ = statefile.live_states()
        return url, next((s for s in live if s.url.rstrip("/") == url), None)
    live, stale = statefile.live_states(ref.port)
    if not live:
        where = statefile.state_dir()
        on = f" on port {ref.port}" if ref.port is not None else ""
        gone = f"; removed a stale state file (pid {stale[0].pid} is gone)" if stale else ""
        raise NotRunning(f"no cluster running{on} (no live state file in {where}{gone})")
    if len(live) > 1:
        ports = ", ".join(str(s.port) for s in live)
        raise AmbiguousCluster(f"{len(live)} clusters are running (ports {ports}); choose one "
                               "with --port")
    return live[0].url, live[0]


def resolve(ref: ClusterRef = ClusterRef()) -> Target:
    """The cluster to ask and its token (module docstring); :class:`NotRunning` when there
    is none, :class:`AmbiguousCluster` when it cannot tell which."""
    url, state = locate(ref)
    if ref.token_file is not None:
        return Target(url, read_token_file(ref.token_file), state)
    env = os.environ.get("DUALPATH_TOKEN")
    if env:
        return Target(url, env, state)
    if state is None:
        return Target(url, None, None, "no --token-file, DUALPATH_TOKEN is not set and no "
                      f"live state file in {statefile.state_dir()} names {url}")
    token, why = _read_token(state.token_file)
    return Target(url, token, state, why)


def running(ref: ClusterRef = ClusterRef()) -> Target | None:
    """The cluster a command should act on live, or ``None`` when none is named or running.

    Why: ``tune set`` changes a running cluster when there is one and edits the config file
    otherwise; "otherwise" means no ``--url``, ``--port``, ``DUALPATH_URL`` or live state
    file (a ``--port`` with no cluster on it is :class:`NotRunning`, not a file edit).
    """
    try:
        return resolve(ref)
    except NotRunning:
        if ref.port is not None:
            raise
        return None


def connect(ref: ClusterRef, timeout: float) -> ClusterClient:
    """A client of the target cluster (the one seam tests replace with a FakeClient)."""
    from dualpath_cli.api.client import DualPathClient

    target = resolve(ref)
    return DualPathClient(target.url, target.token, timeout=timeout)
