"""CURVE forced on for a cluster on loopback (issue 16 item 1): the scheduler keeps its key
pair under the state dir (0600), joined nodes get it with their join, their engines complete
the workload with identical tokens, and a socket without the key reaches no engine."""

from __future__ import annotations

import os
import time
from pathlib import Path

import msgpack
import psutil
import pytest
import zmq
from test_multinode import START_S, Procs, _embedded_tokens, _free_port, _json_line
from zmq.utils.monitor import recv_monitor_message

from dualpath_cli.runtime.workloads import agentic_workload
from dualpath_cli.services.remote_runner import run_agents_remote
from dualpath_cli.transfer.curve import CurveKeys, secure_client

pytestmark = pytest.mark.e2e  # engine processes over CURVE

FAILED = (zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
          | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)


def _listening(pid: int, skip: int) -> list[int]:
    """TCP ports ``pid`` listens on, less ``skip`` (the API)."""
    conns = psutil.Process(pid).net_connections(kind="tcp")
    return sorted({c.laddr.port for c in conns
                   if c.status == psutil.CONN_LISTEN and c.laddr.port != skip})


def _handshake(port: int, keys: CurveKeys | None, server_public: str | None) -> int:
    """A forged message to ``port`` from a sender holding ``keys``: its handshake outcome."""
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 0)
    if keys is not None:
        secure_client(sock, keys, server_public)
    mon = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | FAILED)
    try:
        sock.connect(f"tcp://127.0.0.1:{port}")
        sock.send(msgpack.packb({"kind": "stop", "_b": []}), flags=zmq.NOBLOCK)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if mon.poll(100):
                event = int(recv_monitor_message(mon)["event"])
                if event & (FAILED | zmq.EVENT_HANDSHAKE_SUCCEEDED):
                    return event
        pytest.fail("no handshake outcome within 20 s")
    finally:
        sock.disable_monitor()
        mon.close(0)
        sock.close(0)


def test_joined_nodes_complete_a_workload_with_curve_forced_on(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    env = dict(os.environ, XDG_RUNTIME_DIR=str(run), XDG_STATE_HOME=str(tmp_path / "state"),
               XDG_DATA_HOME=str(tmp_path / "data"), DUALPATH_URL="", DUALPATH_TOKEN="")
    procs = Procs(env)
    port = _free_port()
    try:
        sched = procs.start("--role", "scheduler", "--port", str(port), "--store",
                            str(tmp_path / "store"), "--curve", "on", "--json")
        state = _json_line(sched, START_S)
        key_file = run / "dualpath" / f"curve-{port}.key"
        assert key_file.stat().st_mode & 0o777 == 0o600
        keys = CurveKeys.load(key_file)
        nodes = {name: procs.start("--role", role, "--node", name, "--join",
                                   f"127.0.0.1:{port}", "--token-file", state["token_file"],
                                   "--json")
                 for name, role in (("p0", "prefill"), ("d0", "decode"))}
        for p in nodes.values():
            _json_line(p, START_S)
        token = Path(state["token_file"]).read_text().strip()
        agents, turns = 3, 3
        result, _ = run_agents_remote(state["url"], agentic_workload(agents, turns=turns),
                                      token=token, timeout=120)
        assert not result.errors and len(result.turns) == agents * turns
        assert result.tokens_by_turn() == _embedded_tokens(agents, turns)

        # the scheduler's control mailbox: CURVE only, the cluster's key only
        (ctl,) = _listening(sched.pid, port)
        assert _handshake(ctl, None, None) != zmq.EVENT_HANDSHAKE_SUCCEEDED  # plain
        assert _handshake(ctl, CurveKeys.generate(), keys.public) \
            == zmq.EVENT_HANDSHAKE_FAILED_AUTH  # a key pair of its own
        assert _handshake(ctl, keys, None) == zmq.EVENT_HANDSHAKE_SUCCEEDED  # the cluster's
        # ...and so is every engine's mailbox on the joined nodes
        engine_ports = [q for p in nodes.values()
                        for child in psutil.Process(p.pid).children(recursive=True)
                        for q in _listening(child.pid, port)]
        assert len(engine_ports) >= 2
        for q in engine_ports:
            assert _handshake(q, None, None) != zmq.EVENT_HANDSHAKE_SUCCEEDED
        assert sched.poll() is None and all(p.poll() is None for p in nodes.values())
    finally:
        procs.close()
    assert not key_file.exists()  # a clean stop removes the key with the token
