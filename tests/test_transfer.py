"""Transfer seam: both fabrics deliver headers and buffers intact, in order."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

from dualpath_cli.transfer import InProcFabric, ZmqFabric, fabric_for
from dualpath_cli.transfer.shaping import SharedTokenBucket, make_bucket, pay


@pytest.fixture(params=["inproc", "zmq"])
def fabric(request: pytest.FixtureRequest) -> InProcFabric | ZmqFabric:
    return fabric_for(request.param)  # type: ignore[return-value]


def test_roundtrip_header_and_buffers(fabric: InProcFabric | ZmqFabric) -> None:
    a, b = fabric.endpoint("a"), fabric.endpoint("b")
    block = np.arange(2 * 8 * 16, dtype=np.uint8).reshape(2, 8, 16)
    logits = np.linspace(0, 1, 5, dtype=np.float32)
    a.send(b.address, {"t": "layer", "rid": 7, "layer": 3}, [block, logits])
    msg = b.recv(timeout=5)
    assert msg is not None and msg.kind == "layer"
    assert msg.header["rid"] == 7 and msg.header["layer"] == 3
    np.testing.assert_array_equal(msg.buffers[0], block)
    np.testing.assert_array_equal(msg.buffers[1], logits)
    assert msg.nbytes == block.nbytes + logits.nbytes
    a.close()
    b.close()


def test_order_and_timeout(fabric: InProcFabric | ZmqFabric) -> None:
    a, b = fabric.endpoint("a"), fabric.endpoint("b")
    for i in range(50):
        a.send(b.address, {"t": "n", "i": i}, [np.zeros((0, 4), np.uint8)])
    got = [b.recv(timeout=5) for _ in range(50)]
    assert [m.header["i"] for m in got if m] == list(range(50))
    assert b.recv(timeout=0.01) is None
    a.close()
    b.close()


def test_concurrent_senders(fabric: InProcFabric | ZmqFabric) -> None:
    a, b = fabric.endpoint("a"), fabric.endpoint("b")

    def blast(k: int) -> None:
        for i in range(100):
            a.send(b.address, {"t": "x", "k": k, "i": i}, [np.full(64, k, np.uint8)])

    threads = [threading.Thread(target=blast, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seen: dict[int, list[int]] = {}
    for _ in range(400):
        m = b.recv(timeout=5)
        assert m is not None
        assert int(m.buffers[0][0]) == m.header["k"]
        seen.setdefault(m.header["k"], []).append(m.header["i"])
    assert all(v == list(range(100)) for v in seen.values())
    a.close()
    b.close()


def test_send_to_closed_inproc_endpoint_is_dropped() -> None:
    fab = InProcFabric()
    a, b = fab.endpoint("a"), fab.endpoint("b")
    b.close()
    a.send(b.address, {"t": "late"})  # no error


def test_unknown_fabric() -> None:
    with pytest.raises(ValueError, match="unknown transfer fabric"):
        fabric_for("carrier-pigeon")


def _child_reserve(bucket: SharedTokenBucket, out: Any) -> None:
    out.put(bucket.reserve(500, 0.0))


@pytest.mark.e2e
def test_shared_token_bucket_is_one_nic_across_processes() -> None:
    """A node's storage NIC is one timeline even when its engines are separate processes."""
    import multiprocessing as mp

    bucket = SharedTokenBucket(1000.0)  # 1000 B/s
    assert bucket.reserve(1000, 0.0) == 1.0
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    p = ctx.Process(target=_child_reserve, args=(bucket, out))
    p.start()
    assert out.get(timeout=60) == 1.5  # queued behind the parent's transfer
    p.join(60)
    assert bucket.reserve(500, 0.0) == 2.0  # and the parent sees the child's booking
    assert not make_bucket(0, shared=True).enabled and pay(make_bucket(0, False), 10) == 0.0
