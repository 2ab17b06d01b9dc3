"""A fresh cluster for ``dualpath drill`` when none runs: launched, drilled, stopped.

Why the launcher and not an in-process LiveCluster: the drill rehearses what an operator
meets, so the cluster is the one ``dualpath launch`` runs (its API, its token, its state
file, its engine processes and whatever restarts them), on a free port and a store of its
own in a temporary directory (with a replica root, so hot blocks can be copied), and it is
stopped with ``dualpath stop`` afterwards (the
store removed). Bounded: the launch and the stop each have a timeout.

A leave needs a node with a launcher of its own to stop (the embedded default runs every
node in one launcher, and accepts no joins), so for the rows that need one the drill also
launches a joined cluster: a ``--role scheduler`` launch and nodes P0, D0 and D1, each its
own ``launch --role R --node NAME --join 127.0.0.1:PORT`` (what an operator runs on each
machine), all on loopback. Stopping it stops every launcher that joined its port, those the
drill started again after a leave included.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from dualpath_cli.errors import DualPathError

__all__ = ["Embedded", "launch_embedded", "launch_joined", "stop_embedded", "LaunchFailed",
           "JOINED_NODES"]

_CLI = [sys.executable, "-m", "dualpath_cli.cli.app"]
LAUNCH_TIMEOUT_S = 180
STOP_TIMEOUT_S = 120
#: The joined cluster's nodes (role, name): two decode nodes, so one can leave while the
#: other serves.
JOINED_NODES = (("prefill", "P0"), ("decode", "D0"), ("decode", "D1"))
#: How long a joined node's launcher may drain before it is killed at the drill's end (its
#: own drain is bounded by 30 s).
NODE_STOP_S = 45.0
#: The name a node the drill started again after a leave logs under (drill_rows.py).
RELAUNCH_LOG_PREFIX = "dualpath-drill-node-"


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


def launch_joined() -> Embedded:
    """A ``--role scheduler`` launch (as :func:`launch_embedded`) and the nodes of
    :data:`JOINED_NODES` joined to it on loopback, each serving.

    Raises:
        LaunchFailed: the scheduler or a node did not come up (its one-line error).
    """
    e = launch_embedded(["--role", "scheduler"])
    try:
        outs = [_start_node(e, role, name) for role, name in JOINED_NODES]
        deadline = time.monotonic() + LAUNCH_TIMEOUT_S
        for (_, name), (proc, out) in zip(JOINED_NODES, outs, strict=True):
            _wait_ready(proc, out, name, deadline)
    except BaseException:
        stop_embedded(e)
        raise
    return e


def _start_node(e: Embedded, role: str, name: str) -> tuple[subprocess.Popen[bytes], Path]:
    """Start node ``name`` joining ``e`` (its own session: it outlives no one but is
    stopped by :func:`stop_embedded`); its stdout (the ready line) and log go to files."""
    out, log = e.workdir / f"{name}.out", e.workdir / f"{name}.log"
    cmd = [*_CLI, "launch", "--role", role, "--node", name, "--join",
           f"127.0.0.1:{e.port}", "--token-file", str(e.token_file), "--json"]
    with open(out, "wb") as so, open(log, "wb") as se:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=so, stderr=se,
                                start_new_session=True)
    return proc, out


def _wait_ready(proc: subprocess.Popen[bytes], out: Path, name: str,
                deadline: float) -> None:
    """Until node ``name`` printed its ready line (it serves), bounded by ``deadline``."""
    while time.monotonic() < deadline:
        if out.read_text(errors="replace").strip():
            return
        if proc.poll() is not None:
            log = out.with_suffix(".log").read_text(errors="replace").strip().splitlines()
            raise LaunchFailed(f"the drill's joined node {name} exited "
                               f"({proc.returncode}): {(log or ['no message'])[-1]}")
        time.sleep(0.2)
    raise LaunchFailed(f"the drill's joined node {name} did not serve within "
                       f"{LAUNCH_TIMEOUT_S} s")


def _stop_joined_nodes(port: int) -> None:
    """SIGTERM every launcher that joined ``port`` on loopback (they drain and leave),
    killing with its engines any still running after :data:`NODE_STOP_S`; then remove the
    logs the drill gave the nodes it started again after a leave (drill_rows.py; those of
    its own clusters are in their work directory, removed with it)."""
    import psutil

    join = f"127.0.0.1:{port}"
    nodes, logs = [], set()
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info.get("cmdline") or []
        if "--join" in cmd and join in cmd and "launch" in cmd:
            nodes.append(proc)
            try:
                logs |= {Path(f.path) for f in proc.open_files()
                         if Path(f.path).name.startswith(RELAUNCH_LOG_PREFIX)}
            except psutil.Error:
                pass
    for proc in nodes:
        try:
            proc.terminate()
        except psutil.NoSuchProcess:
            continue
    _, alive = psutil.wait_procs(nodes, timeout=NODE_STOP_S)
    for proc in alive:
        try:
            for child in proc.children(recursive=True):
                child.kill()
            proc.kill()
        except psutil.NoSuchProcess:
            continue
    for log in logs:
        log.unlink(missing_ok=True)


def stop_embedded(e: Embedded) -> str:
    """Stop the nodes that joined it, ``dualpath stop`` it and remove its store; what stop
    said ("" when it was quiet)."""
    _stop_joined_nodes(e.port)
    try:
        done = subprocess.run([*_CLI, "stop", "--port", str(e.port)], capture_output=True,
                              text=True, timeout=STOP_TIMEOUT_S)
        said = (done.stdout + done.stderr).strip()
    except subprocess.TimeoutExpired:
        said = f"dualpath stop did not finish within {STOP_TIMEOUT_S} s"
    shutil.rmtree(e.workdir, ignore_errors=True)
    return said
