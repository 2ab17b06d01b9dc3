"""Transfer seam: messages (a msgpack header plus raw buffer frames) between engines.

Two implementations behind one interface: :class:`ZmqFabric` (ZeroMQ PUSH/PULL between
processes, layer blocks as zero-copy frames) and :class:`InProcFabric` (queues in one
process, the shipped fake).
"""

from dualpath_cli.transfer.base import Endpoint, Fabric, Message
from dualpath_cli.transfer.inproc import InProcFabric
from dualpath_cli.transfer.zmq_fabric import ZmqFabric

__all__ = ["Endpoint", "Fabric", "Message", "InProcFabric", "ZmqFabric", "fabric_for"]


def fabric_for(kind: str) -> Fabric:
    """The fabric named ``kind`` ("zmq" or "inproc")."""
    if kind == "zmq":
        return ZmqFabric()
    if kind == "inproc":
        return InProcFabric()
    raise ValueError(f"unknown transfer fabric {kind!r}: expected zmq or inproc")
