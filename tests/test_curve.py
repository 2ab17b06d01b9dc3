"""ZeroMQ CURVE between nodes (issue 16 item 1, issue 17 item 4): the fabric's sockets talk
with the cluster's keys, and a peer with a wrong key (or none) gets no message through."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

from dualpath_cli.errors import ConfigError
from dualpath_cli.transfer.curve import CurveKeys, curve_wanted, secure_client
from dualpath_cli.transfer.zmq_fabric import ZmqFabric

FAILED = {zmq.EVENT_HANDSHAKE_FAILED_AUTH, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
          zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL}


def _forge(ctx: zmq.Context[Any], to: str, keys: CurveKeys | None,
           server_public: str | None, timeout: float = 10.0) -> int:
    """Connect a sender with ``keys`` (None: no CURVE) to ``to``, queue a forged message and
    return the first handshake outcome its monitor reports."""
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 0)
    if keys is not None:
        secure_client(sock, keys, server_public)
    mon = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | sum(FAILED))
    try:
        sock.connect(to)
        sock.send(msgpack.packb({"kind": "forged", "_b": []}, use_bin_type=True),
                  flags=zmq.NOBLOCK)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if mon.poll(100):
                event = int(recv_monitor_message(mon)["event"])
                if event in FAILED or event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                    return event
        pytest.fail(f"no handshake outcome within {timeout:g} s")
    finally:
        sock.disable_monitor()
        mon.close(0)
        sock.close(0)


def test_the_cluster_key_talks_and_wrong_keys_are_refused() -> None:
    keys = CurveKeys.generate()
    fabric = ZmqFabric(curve=keys)
    inbox, outbox = fabric.endpoint("a"), fabric.endpoint("b")
    ctx = zmq.Context.instance()
    try:
        outbox.send(inbox.address, {"kind": "hello"}, [np.arange(4, dtype=np.int64)])
        got = inbox.recv(timeout=10.0)
        assert got is not None and got.header["kind"] == "hello"
        assert got.buffers[0].tolist() == [0, 1, 2, 3]

        other = CurveKeys.generate()
        # a key pair of its own (ZAP refuses it), a wrong server key, no CURVE at all
        assert _forge(ctx, inbox.address, other, keys.public) \
            == zmq.EVENT_HANDSHAKE_FAILED_AUTH
        assert _forge(ctx, inbox.address, keys, other.public) in FAILED
        assert _forge(ctx, inbox.address, None, None) in FAILED
        # nothing of theirs got in; the right key still does
        outbox.send(inbox.address, {"kind": "after"})
        got = inbox.recv(timeout=10.0)
        assert got is not None and got.header["kind"] == "after"
        assert inbox.recv(timeout=0) is None
    finally:
        inbox.close()
        outbox.close()


def test_key_file_is_private_and_checked(tmp_path: Path) -> None:
    path = tmp_path / "curve.key"
    keys = CurveKeys.ensure(path)
    assert path.stat().st_mode & 0o777 == 0o600
    assert CurveKeys.ensure(path) == keys  # kept across restarts
    assert keys.secret not in repr(keys)
    path.chmod(0o644)
    with pytest.raises(ConfigError, match="lets others read it"):
        CurveKeys.load(path)
    path.chmod(0o600)
    path.write_text("{}")
    with pytest.raises(ConfigError, match="not a key file"):
        CurveKeys.load(path)


def test_auto_is_on_off_loopback_only() -> None:
    assert not curve_wanted("auto", "127.0.0.1") and not curve_wanted("auto", "::1")
    assert curve_wanted("auto", "10.0.0.5") and curve_wanted("auto", "node7")
    assert curve_wanted("on", "127.0.0.1") and not curve_wanted("off", "10.0.0.5")
    with pytest.raises(ConfigError, match="expected one of auto, on, off"):
        curve_wanted("yes", "127.0.0.1")
