"""A fresh cluster for ``dualpath drill`` when none runs: launched, drilled, stopped.

Why the launcher and not an in-process LiveCluster: the drill rehearses what an operator
meets, so the cluster is the one ``dualpath launch`` runs (its API, its token, its state
file, its engine processes and whatever restarts them), on a free port and a store of its
own in a temporary directory (with a replica root, so hot blocks can be copied), and it is
stopped with ``dualpath stop`` afterwards (the
store removed). Bounded: the launch and the stop each have a timeout.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from dualpath_cli.errors import DualPathError

__all__ = ["Embedded", "launch_embedded", "stop_embedded", "LaunchFailed"]

_CLI = [sys.executable, "-m", "dualpath_cli.cli.app"]
LAUNCH_TIMEOUT_S = 180
STOP_TIMEOUT_S = 120


class LaunchFailed(DualPathError):
    """The drill's own cluster did not come up (exit 3: no verdict)."""

    exit_code = 3


@dataclass(frozen=True, slots=True)
class Embedded:
    """The drill's own cluster: where its API is, its token file, its store."""

    url: str
    port: int
    token_file: Path
    store: Path
    workdir: Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch_embedded(extra: list[str] | None = None) -> Embedded:
    """``dualpath launch --detach`` on a free port with a temporary store.

    Raises:
        LaunchFailed: it did not become ready (its one-line error).
    """
    work = Path(tempfile.mkdtemp(prefix="dualpath-drill-"))
    port = _free_port()
    store = work / "store"
    # a replica root, so that the fix long-tail offers for hot blocks (copies) can be applied
    cmd = [*_CLI, "launch", "--detach", "--json", "--port", str(port), "--store", str(store),
           "--replica-root", str(work / "replica"), *(extra or [])]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        stop_embedded(Embedded(f"http://127.0.0.1:{port}", port, Path(), store, work))
        raise LaunchFailed(f"the drill's cluster was not ready within {LAUNCH_TIMEOUT_S} s"
                           ) from None
    except BaseException:  # Ctrl-C while it starts: the detached launcher must not outlive us
        stop_embedded(Embedded(f"http://127.0.0.1:{port}", port, Path(), store, work))
        raise
    if done.returncode != 0:
        shutil.rmtree(work, ignore_errors=True)
        why = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise LaunchFailed(f"the drill's cluster did not start: {why}")
    try:
        state = json.loads(done.stdout)
        return Embedded(str(state["url"]), port, Path(state["token_file"]), store, work)
    except (ValueError, KeyError, TypeError):
        stop_embedded(Embedded(f"http://127.0.0.1:{port}", port, Path(), store, work))
        raise LaunchFailed("the drill's cluster started but its state was not JSON") from None


def stop_embedded(e: Embedded) -> str:
    """``dualpath stop`` it and remove its store; what stop said ("" when it was quiet)."""
    try:
        done = subprocess.run([*_CLI, "stop", "--port", str(e.port)], capture_output=True,
                              text=True, timeout=STOP_TIMEOUT_S)
        said = (done.stdout + done.stderr).strip()
    except subprocess.TimeoutExpired:
        said = f"dualpath stop did not finish within {STOP_TIMEOUT_S} s"
    shutil.rmtree(e.workdir, ignore_errors=True)
    return said
