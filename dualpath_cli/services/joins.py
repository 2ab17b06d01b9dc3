"""The join desk: what the API's join routes call to place, report and drop joining nodes.

Why a service: the HTTP layer drives the cluster through services, never ``cluster/``
directly. A live cluster that takes remote nodes has its own (checkpointed)
:class:`~dualpath_cli.cluster.join.JoinService`; one whose engines are all local has none, and
the desk makes one over its system on first use (a node may still join it). A stand-in
cluster without a system takes no joining nodes (:class:`NoJoins`).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from dualpath_cli.cluster.join import MAX_GPUS, JoinService
from dualpath_cli.errors import DualPathError

if TYPE_CHECKING:
    from dualpath_cli.services.live import LiveCluster

__all__ = ["JoinDesk", "NoJoins", "MAX_GPUS"]


class NoJoins(DualPathError):
    """This cluster takes no joining nodes (it has no runtime system)."""


class JoinDesk:
    """The join service of one live cluster, found (or made) on first use."""

    def __init__(self, live: LiveCluster) -> None:
        self._live = live
        self._lock = threading.Lock()
        self._service: JoinService | None = None

    def _get(self) -> JoinService:
        with self._lock:
            if self._service is None:
                system = getattr(self._live, "system", None)
                if system is None:
                    raise NoJoins("this cluster takes no joining nodes")
                own = getattr(self._live, "joins", None)  # the live cluster's (checkpointed)
                self._service = own if isinstance(own, JoinService) else JoinService(system)
            return self._service

    def join(self, node: str, role: str, gpus: int) -> dict[str, Any]:
        """Place node ``node``'s ``gpus`` engines of ``role``; its plan as JSON.

        Raises:
            NoJoins: the cluster takes no joining nodes.
            UsageError: a bad role, GPU count or name, or a name still serving.
        """
        return self._get().join(node, role, gpus).to_dict()

    def status(self, node: str) -> dict[str, Any]:
        """Node ``node``'s engines and their states.

        Raises:
            NoJoins: the cluster takes no joining nodes.
            UsageError: an unknown node.
        """
        return self._get().status(node)

    def leave(self, node: str) -> int:
        """Take node ``node`` out of scheduling; the engines taken.

        Raises:
            NoJoins: the cluster takes no joining nodes.
            UsageError: an unknown node.
        """
        return self._get().leave(node)
