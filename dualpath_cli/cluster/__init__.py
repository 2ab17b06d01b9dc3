"""Cluster seam: start engines grouped by node, supervise them, report deaths.

:class:`LocalCluster` runs one child process per engine (ZeroMQ fabric, the embedded
default); :class:`InProcCluster` runs engines as threads of this process (queue fabric, the
shipped fake). Both call ``on_death(engine_id)`` as soon as an engine stops unexpectedly.
"""

from dualpath_cli.cluster.base import Cluster
from dualpath_cli.cluster.inproc import InProcCluster
from dualpath_cli.cluster.local import LocalCluster

__all__ = ["Cluster", "InProcCluster", "LocalCluster"]
