"""What runs on the Ray cluster's nodes: one :class:`NodeActor` per dualpath node and the
:class:`SchedulerActor` (see :mod:`.ray_backend` for the design).

A node actor also notes the named semaphores its engines map, so that its restarted
incarnation can unlink what a kill left behind (below).
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dualpath_cli.errors import DualPathError
from dualpath_cli.services.ray_common import import_ray

__all__ = ["NodeActor", "SchedulerActor"]


def _actor_identity() -> tuple[bool, str, str]:
    """Inside an actor: whether Ray restarted it, its node's id and its node's address."""
    ray = import_ray()
    ctx = ray.get_runtime_context()
    with warnings.catch_warnings():  # the property reads a deprecated actor_id inside
        warnings.simplefilter("ignore")
        restarted = bool(ctx.was_current_actor_reconstructed)
    return restarted, ctx.get_node_id(), ray.util.get_node_ip_address()


class NodeActor:
    """One dualpath node as a Ray actor: joins the scheduler and runs its engines.

    The constructor is what ``launch --role ROLE --join URL`` does up to "serving"; Ray runs
    it again when it restarts the actor, which then first takes its old incarnation out of
    scheduling. The engines are child processes of the actor's worker and exit with it
    (``cluster/local.py``'s parent watchdog), so a killed actor stops heartbeating at once.
    """

    def __init__(self, url: str, token: str, name: str, role: str, gpus: int,
                 loopback: bool, store: str | None, timeout: float) -> None:
        from dualpath_cli.services.node import NodeAgent

        self.restarted, self.node_id, self.ip = _actor_identity()
        bind = "127.0.0.1" if loopback else self.ip
        self.agent = NodeAgent(url, token, name, role, gpus,
                               Path(store) if store is not None else None, bind)
        self._record = _record_path(name)
        if self.restarted:  # our previous process died: its engines leave now
            self._leave_old(url, token, name)
            _unlink_recorded(self._record)
        self.join_s = self.agent.join(timeout)
        _record_semaphores(self._record)
        # as on a --join node: rejoin a restarted scheduler, give up on a vanished one
        self._stop = threading.Event()
        self._serving = threading.Thread(target=self.agent.serve, args=(self._stop,),
                                         name="node-agent", daemon=True)
        self._serving.start()

    @staticmethod
    def _leave_old(url: str, token: str, name: str) -> None:
        import httpx

        try:
            httpx.delete(f"{url}/api/v1/join/{name}", timeout=10.0,
                         headers={"Authorization": f"Bearer {token}"})
        except httpx.HTTPError:
            pass  # the join below reports an unreachable scheduler

    def info(self) -> dict[str, Any]:
        """Where the node runs and what the scheduler gave it (JSON-able)."""
        plan = self.agent.plan
        assert plan is not None
        return {"name": plan.name, "role": plan.role, "index": plan.node,
                "engines": list(plan.engine_ids), "node_id": self.node_id, "ip": self.ip,
                "pid": os.getpid(), "restarted": self.restarted,
                "join_s": round(self.join_s, 3)}

    def stop(self) -> None:
        """Stop the engines (the scheduler is closing; no need to leave)."""
        self._stop.set()
        self._serving.join(5.0)
        self.agent.close(leave=False)
        _remove_record(self._record)


class SchedulerActor:
    """The scheduler and its HTTP API as a Ray actor, pinned to one Ray node.

    Why a factory: the API is the front-end's (``cli/ray_launch.py``); services import no
    API. ``factory(restarted)`` builds the host (bound, serving, engines may join) and is
    run again by Ray when it restarts the actor: the new incarnation finds the checkpoint
    the dead one left under the state directory (``env`` carries the launcher's
    ``XDG_*``/``DUALPATH_*`` variables, so the state directory is the launcher's) and
    resumes from it. The host offers ``info()``, ``wait_ready(timeout)``,
    ``drain(timeout)`` and ``close()``, each returning JSON-able data.
    """

    def __init__(self, factory: Callable[[bool], Any], env: dict[str, str]) -> None:
        os.environ.update(env)
        self.restarted, self.node_id, self.ip = _actor_identity()
        self.host: Any = None
        self.error = ""
        try:
            self.host = factory(self.restarted)
        except DualPathError as err:  # (a port taken...) kept for info(): raised here, Ray
            self.error = str(err)  # would print its traceback on the launcher's terminal

    def info(self) -> dict[str, Any]:
        """The host's info plus where this incarnation runs (JSON-able); ``error``: the
        one line why the host could not start."""
        ray = import_ray()
        own = self.host.info() if self.host is not None else {"error": self.error}
        return {**own, "name": ray.get_runtime_context().get_actor_name(),
                "node_id": self.node_id, "ip": self.ip, "pid": os.getpid(),
                "restarted": self.restarted}

    def wait_ready(self, timeout: float) -> dict[str, Any]:
        """Wait until every joined engine said hello; then :meth:`info`."""
        if self.host is not None:
            self.host.wait_ready(timeout)
        return self.info()

    def drain(self, timeout: float) -> dict[str, Any]:
        """Stop admitting, answer in-flight turns (up to ``timeout``), stop the API."""
        if self.host is None:
            return {"drained": 0, "abandoned": 0, "seconds": 0.0}
        result: dict[str, Any] = self.host.drain(timeout)
        return result

    def close(self) -> None:
        """Stop at once (turns in flight are answered 503); removes the checkpoint."""
        if self.host is not None:
            self.host.close()


# --- named semaphores of a killed actor ----------------------------------------------------
# The engines' shared NIC buckets are multiprocessing values, each with a named POSIX
# semaphore (/dev/shm/sem.mp-*). multiprocessing's resource tracker unlinks them when their
# process dies, but when Ray kills an actor's worker it kills the worker's children too,
# tracker included, so the names would stay behind. The actor notes the names it has open;
# its restarted incarnation (on the same node, as a rule) unlinks what is left.
def _record_path(name: str) -> Path:
    base = os.environ.get("RAY_TMPDIR") or tempfile.gettempdir()
    return Path(base) / f"dualpath-ray-{os.getuid()}" / f"{name}.semaphores"


def _record_semaphores(record: Path) -> None:
    """Note the named semaphores this process's engines map (Linux; elsewhere nothing).

    The engines' maps, not ours: the creator maps a semaphore under glibc's temporary name.
    """
    import psutil

    names: set[str] = set()
    for child in psutil.Process().children(recursive=True):
        try:
            maps = Path(f"/proc/{child.pid}/maps").read_text()
        except OSError:
            continue
        names.update(re.findall(r"/dev/shm/(sem\.mp-[\w-]+)", maps))
    if not names:
        return
    try:
        record.parent.mkdir(mode=0o700, exist_ok=True)
        record.write_text("".join(n + "\n" for n in sorted(names)))
    except OSError:
        pass  # best effort: only a leak after a kill depends on it


def _unlink_recorded(record: Path) -> None:
    """Unlink the semaphores a killed previous incarnation noted (see above)."""
    try:
        names = record.read_text().split()
    except OSError:
        return
    for n in names:
        if re.fullmatch(r"sem\.mp-[\w-]+", n):
            with contextlib.suppress(OSError):
                os.unlink(f"/dev/shm/{n}")
    _remove_record(record)


def _remove_record(record: Path) -> None:
    with contextlib.suppress(OSError):
        record.unlink()
    with contextlib.suppress(OSError):
        record.parent.rmdir()  # only when no other actor's record is left
