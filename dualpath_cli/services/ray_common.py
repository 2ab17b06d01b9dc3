"""What the Ray launch's driver (:mod:`.ray_backend`) and its actors (:mod:`.ray_actors`)
share: the error, Ray's lazy import, the actors' namespace and names, Ray error lines.

Ray is an optional extra (``pip install 'dualpath[ray]'``), imported only through
:func:`import_ray`, inside functions, so the CLI starts without it.
"""

from __future__ import annotations

from typing import Any

from dualpath_cli.errors import DualPathError

__all__ = ["RayBackendError", "import_ray", "NAMESPACE", "actor_name", "scheduler_actor_name",
           "one_line"]

#: Ray namespace of our actors (``ray.get_actor(name, namespace=NAMESPACE)``).
NAMESPACE = "dualpath"


class RayBackendError(DualPathError):
    """Ray is not installed, its cluster is unreachable, or it cannot host the engines."""


def actor_name(port: int, role: str, index: int) -> str:
    """The Ray actor name of ``role`` node ``index`` of the launch on API ``port``."""
    return f"dualpath-{port}-{role}-{index}"


def scheduler_actor_name(port: int) -> str:
    """The Ray actor name of the scheduler of the launch on API ``port``."""
    return f"dualpath-{port}-scheduler"


def import_ray() -> Any:
    """The ``ray`` module; :class:`RayBackendError` when the extra is not installed."""
    try:
        import ray  # type: ignore[import-not-found,unused-ignore]  # the optional extra
    except ImportError:
        raise RayBackendError("--backend ray needs Ray: pip install 'dualpath[ray]'") from None
    return ray


def one_line(err: BaseException) -> str:
    """The most telling line of a Ray error (its cause's last line)."""
    cause = getattr(err, "cause", None)  # a Ray task error carries the task's exception
    text = str(cause if isinstance(cause, BaseException) else err).strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else type(err).__name__
