"""Per-node launch on loopback: a scheduler and engine nodes in separate processes (--join)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import psutil
import pytest

from dualpath_cli.api.listen import listen
from dualpath_cli.cluster.system import RuntimeSystem
from dualpath_cli.runtime.options import RuntimeOptions
from dualpath_cli.runtime.workloads import agentic_workload
from dualpath_cli.services.node import JoinError, join_url
from dualpath_cli.services.remote_runner import run_agents_remote
from dualpath_cli.services.runner import TurnRecord, run_agents

pytestmark = pytest.mark.e2e  # schedulers and nodes as processes

START_S = 180.0  # a loaded 2-core CI box spawns and imports slowly


def _free_port() -> int:
    sock = listen("127.0.0.1", 0)
    port = int(sock.getsockname()[1])
    sock.close()
    return port


def launch_env(tmp: Path) -> dict[str, str]:
    """The environment of launched processes: private XDG dirs under ``tmp`` (``run``
    created 0700), no ``DUALPATH_URL``/``DUALPATH_TOKEN`` from the caller's shell.

    A function, not a fixture: bench/reliability.py runs these scenarios outside pytest.
    """
    run = tmp / "run"
    run.mkdir(mode=0o700)
    return dict(os.environ, XDG_RUNTIME_DIR=str(run), XDG_STATE_HOME=str(tmp / "state"),
                XDG_DATA_HOME=str(tmp / "data"), DUALPATH_URL="", DUALPATH_TOKEN="")


def engine_semaphores(pid: int) -> set[str]:
    """The ``sem.mp-*`` names (NIC-bucket locks) the processes under ``pid`` map, unlinked
    or not (Linux). The engines' maps, not the creator's: glibc maps a new semaphore under a
    temporary name."""
    names: set[str] = set()
    for child in psutil.Process(pid).children(recursive=True):
        try:
            maps = Path(f"/proc/{child.pid}/maps").read_text()
        except OSError:
            continue
        names.update(re.findall(r"/dev/shm/(sem\.mp-[\w-]+)", maps))
    return names


class Procs:
    """``dualpath launch`` processes of one test, each in its own session (killed as a
    group: SIGTERM, then SIGKILL after 30 s)."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, *args: str) -> subprocess.Popen[str]:
        p = subprocess.Popen([sys.executable, "-m", "dualpath_cli.cli.app", "launch", *args],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=self.env, start_new_session=True)
        self.procs.append(p)
        return p

    def join(self, role: str, name: str, port: int | str,
             token_file: str | None = None) -> subprocess.Popen[str]:
        """A node joining the scheduler on loopback ``port`` (``--json``); without
        ``token_file`` the token comes from ``DUALPATH_TOKEN``."""
        token = ("--token-file", token_file) if token_file is not None else ()
        return self.start("--role", role, "--node", name, "--join", f"127.0.0.1:{port}",
                          *token, "--json")

    def close(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)
            for stream in (p.stdout, p.stderr):
                if stream is not None:
                    stream.close()


def _json_line(p: subprocess.Popen[str], timeout: float) -> dict[str, Any]:
    """The first stdout line (``--json``), or fail with the process's stderr.

    Fails with AssertionError, not ``pytest.fail``: bench scripts call it too.
    """
    out: list[str] = []
    stream: IO[str] | None = p.stdout
    assert stream is not None
    reader = threading.Thread(target=lambda: out.append(stream.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    if not out or not out[0].strip():
        p.kill()
        err = p.stderr.read() if p.stderr is not None else ""
        raise AssertionError(f"no ready line within {timeout:g} s: {err[-3000:]}")
    data: dict[str, Any] = json.loads(out[0])
    return data


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[dict[str, Any]]:
    procs = Procs(launch_env(tmp_path))
    port = _free_port()
    try:
        sched = procs.start("--role", "scheduler", "--port", str(port), "--store",
                            str(tmp_path / "store"), "--json")
        state = _json_line(sched, START_S)
        yield {"procs": procs, "port": port, "url": state["url"],
               "token_file": state["token_file"], "sched": sched, "store": tmp_path / "store"}
    finally:
        procs.close()


def _join(c: dict[str, Any], role: str, name: str, token_file: str) -> subprocess.Popen[str]:
    procs: Procs = c["procs"]
    return procs.join(role, name, c["port"], token_file)


def _embedded_tokens(agents: int, turns: int) -> dict[tuple[int, int], tuple[int, ...]]:
    with RuntimeSystem(RuntimeOptions(fetch_s=0.005)) as system:
        return run_agents(system, agentic_workload(agents, turns=turns)).tokens_by_turn()


def test_nodes_join_serve_and_survive_a_dead_node(cluster: dict[str, Any],
                                                  tmp_path: Path) -> None:
    bad = tmp_path / "bad-token"
    bad.write_text("not-the-token\n")
    bad.chmod(0o600)
    refused = _join(cluster, "decode", "intruder", str(bad))
    _, err = refused.communicate(timeout=START_S)
    assert refused.returncode != 0
    assert "refused node 'intruder'" in err and "token does not match" in err
    assert len(err.strip().splitlines()) == 1  # one line, no traceback

    nodes = {name: _join(cluster, role, name, cluster["token_file"])
             for name, role in (("p0", "prefill"), ("d0", "decode"), ("d1", "decode"))}
    joined = {name: _json_line(p, START_S) for name, p in nodes.items()}
    assert {j["role"] for j in joined.values()} == {"prefill", "decode"}
    assert len({j["index"] for j in joined.values()}) == 3
    assert all(j["join_s"] > 0 for j in joined.values())

    token = Path(cluster["token_file"]).read_text().strip()
    agents, turns = 4, 4
    done: list[TurnRecord] = []
    killed = threading.Event()

    def on_turn(rec: TurnRecord) -> None:
        done.append(rec)
        if len(done) == 3 and not killed.is_set():  # node d1 dies mid-run, SIGKILLed
            os.killpg(nodes["d1"].pid, signal.SIGKILL)
            killed.set()

    result, _ = run_agents_remote(cluster["url"], agentic_workload(agents, turns=turns),
                                  token=token, on_turn=on_turn, timeout=120)
    assert killed.is_set()
    assert not result.errors
    assert len(result.turns) == agents * turns
    assert result.tokens_by_turn() == _embedded_tokens(agents, turns)
    assert cluster["sched"].poll() is None and nodes["d0"].poll() is None


def test_a_node_on_the_schedulers_host_joins_without_being_given_the_token(
        cluster: dict[str, Any], tmp_path: Path) -> None:
    """OPERATOR-STORIES story 6 on one host: no --token-file and no DUALPATH_TOKEN (the
    launch environment clears it); the node reads the scheduler's token from the state file
    its launch wrote, as ``dualpath status`` does. A scheduler elsewhere (no state file for
    that port here) still needs the token, in one line."""
    procs: Procs = cluster["procs"]
    node = procs.join("decode", "d-local", cluster["port"])
    line = _json_line(node, START_S)
    assert line["node"] == "d-local" and line["role"] == "decode"
    other = procs.join("decode", "d-far", _free_port())
    _, err = other.communicate(timeout=START_S)
    assert other.returncode != 0
    assert "joining needs the cluster's token" in err and len(err.strip().splitlines()) == 1


def test_join_url() -> None:
    assert join_url("10.0.0.5:8470") == "http://10.0.0.5:8470"
    assert join_url("http://sched:8470/") == "http://sched:8470"
    assert join_url("::1:8470") == "http://[::1]:8470"
    for bad in ("sched", "sched:port", ":8470", "sched:70000"):
        with pytest.raises(JoinError, match="expected HOST:PORT"):
            join_url(bad)
