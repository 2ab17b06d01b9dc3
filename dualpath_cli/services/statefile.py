"""Where a launched cluster says it is: one small JSON state file per port.

Why a file: ``dualpath status``, ``stop``, the monitor and the TUI must find a cluster that
another shell (or ``--detach``) started, without flags. The launcher writes the file when it
is ready and removes it when it exits; a file whose pid is gone (the launcher was killed) is
*stale* and every reader treats it as absent and removes it.

Directory (the first that applies):

1. ``$XDG_RUNTIME_DIR/dualpath/`` (per-user tmpfs, gone at logout: the right home for a pid);
2. ``$XDG_STATE_HOME/dualpath/``;
3. ``~/.local/state/dualpath/``.

It is created with mode 0700. Files in it, for the cluster on port ``P``:

- ``cluster-P.json``: pid, pid start time (on the wall clock and since boot), URL, host,
  port, started_at, the token file's path, the log file (``--detach``), the P/D shape and
  store; once ``dualpath stop`` asked for a stop, ``stop_requested``; when the launcher
  drained on such a request, ``stopped`` and ``drain`` (turns drained, cut off, seconds) for
  ``stop`` to print, after which ``stop`` removes the file.
- ``token-P``: the API bearer token (mode 0600).
- ``launch-P.log``: the detached launcher's output.
- ``checkpoint-P.json`` (and ``checkpoint-P.json.prompts-N``): the scheduler's checkpoint
  (services/restart.py), left only by a launcher that died uncleanly; a launch on ``P``
  restores it. While it is there a stale state file is removed without its token: the
  restarted launcher keeps the token its nodes and clients hold.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from dualpath_cli.atomicio import atomic_write_text

__all__ = ["ClusterState", "state_dir", "state_path", "token_path", "log_path",
           "checkpoint_path", "read_state", "write_state", "remove_state", "pid_alive",
           "process_start_time", "process_start_since_boot", "live_states"]

_NAME = re.compile(r"^cluster-(\d+)\.json$")


def state_dir() -> Path:
    """The directory of state files (module docstring), created with mode 0700."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        base = Path(runtime)
    else:
        base = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    path = base / "dualpath"
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def state_path(port: int) -> Path:
    """The state file of the cluster on ``port``."""
    return state_dir() / f"cluster-{port}.json"


def token_path(port: int) -> Path:
    """The token file of the cluster on ``port``."""
    return state_dir() / f"token-{port}"


def curve_path(port: int) -> Path:
    """The CURVE key file of the cluster on ``port`` (mode 0600; transfer/curve.py): kept
    when its launcher is killed, so a restarted scheduler keeps its nodes' keys."""
    return state_dir() / f"curve-{port}.key"


def checkpoint_path(port: int) -> Path:
    """The scheduler checkpoint of the cluster on ``port`` (services/restart.py)."""
    return state_dir() / f"checkpoint-{port}.json"


def log_path(port: int) -> Path:
    """The log file of a detached launcher on ``port``."""
    return state_dir() / f"launch-{port}.log"


@dataclass
class ClusterState:
    """What a launcher publishes about itself (``None``: not known yet)."""

    pid: int
    url: str
    host: str
    port: int
    started_at: float
    token_file: str
    pid_start: float | None = None
    pid_start_since_boot: float | None = None
    ready_s: float | None = None
    pd: str | None = None
    store: str | None = None
    log_file: str | None = None
    stop_requested: bool = False
    stopped: bool = False
    drain: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form."""
        return asdict(self)

    @property
    def path(self) -> Path:
        """This state's file."""
        return state_path(self.port)

    def alive(self) -> bool:
        """Whether the launcher process that wrote this file still runs."""
        return pid_alive(self.pid, self.pid_start, self.pid_start_since_boot)


def process_start_time(pid: int) -> float | None:
    """Start time of ``pid`` (seconds since the epoch), ``None`` when it does not exist."""
    import psutil

    try:
        return float(psutil.Process(pid).create_time())
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return None


def process_start_since_boot(pid: int) -> float | None:
    """When ``pid`` started, in seconds since boot (Linux's ``/proc/PID/stat``); ``None``
    when it does not exist or there is no ``/proc``.

    Stored beside the pid so a recycled pid is not mistaken for the launcher. Why not the
    wall-clock start: psutil computes it from the boot time in whole seconds that
    ``/proc/stat`` derives from the wall clock, so a clock step (NTP, a VM's time sync on a
    loaded host) moves a live launcher's start by a second or more, and every reader then
    removed its state and token files as stale. The time since boot never moves.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        # the fields after the command's ")": state is field 3, starttime (ticks) field 22
        return int(stat[stat.rindex(")") + 2:].split()[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def pid_alive(pid: int, start: float | None = None,
              start_since_boot: float | None = None) -> bool:
    """Whether ``pid`` runs (and, when a start is given, is the process started then: by
    ``start_since_boot`` where this system tells it, else by the wall-clock ``start``).

    A zombie (exited, not yet reaped by its parent) counts as gone.
    """
    import psutil

    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        if start_since_boot is not None:
            now = process_start_since_boot(pid)
            if now is not None:
                return abs(now - start_since_boot) < 0.5  # the same tick, read twice
        return start is None or abs(proc.create_time() - start) < 1.0
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return False


def read_state(path: Path) -> ClusterState | None:
    """The state in ``path``; ``None`` when missing or unreadable (a half-made file cannot
    exist: writes are atomic, so unreadable means foreign)."""
    try:
        data = json.loads(path.read_text())
        names = {f.name for f in fields(ClusterState)}
        return ClusterState(**{k: v for k, v in data.items() if k in names})
    except (OSError, ValueError, TypeError):
        return None


def write_state(state: ClusterState) -> None:
    """Publish ``state`` atomically (mode 0600)."""
    atomic_write_text(state.path, json.dumps(state.to_dict(), indent=1) + "\n", mode=0o600,
                      fsync=False)


def remove_state(port: int, *, token: bool = True) -> None:
    """Remove the state file (and the token file) of ``port``; missing files are fine."""
    paths = [state_path(port)] + ([token_path(port)] if token else [])
    for path in paths:
        try:
            path.unlink()
        except FileNotFoundError:
            pass


def live_states(port: int | None = None) -> tuple[list[ClusterState], list[ClusterState]]:
    """``(live, stale)`` states in the state directory (only ``port``'s when given).

    Stale files (their launcher is gone) are removed with their token files; a stopped
    launcher's file (left for ``dualpath stop`` to read) counts as stale once its pid is
    gone, so it never outlives the next reader.
    """
    live: list[ClusterState] = []
    stale: list[ClusterState] = []
    for path in sorted(state_dir().iterdir()):
        match = _NAME.match(path.name)
        if not match or (port is not None and int(match.group(1)) != port):
            continue
        state = read_state(path)
        if state is None:
            continue
        if state.alive():
            live.append(state)
        else:
            stale.append(state)
    for state in stale:  # a killed launcher that left a checkpoint is restarted with its token
        remove_state(state.port, token=not checkpoint_path(state.port).exists())
    return live, stale
