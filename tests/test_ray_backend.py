"""``launch --backend ray`` on a local multi-node Ray cluster (``ray.cluster_utils.Cluster``).

A head node plus one node labelled for prefill and one for decode (custom resources), each
with little memory so it fits a 2-core CI box. The launcher places one actor per dualpath
node on the labelled Ray nodes, the agentic workload completes with the embedded run's
tokens, and the decode node's actor killed mid-run (its process, so Ray restarts it) is
detected by our heartbeats, its turns re-queued, and the restarted actor joins again.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'dualpath[ray]')")

import psutil  # noqa: E402
from ray.cluster_utils import Cluster  # type: ignore[import-not-found,unused-ignore]  # noqa: E402

from dualpath_cli.api.client import DualPathClient  # noqa: E402
from dualpath_cli.api.listen import free_port  # noqa: E402
from dualpath_cli.cluster.system import RuntimeSystem  # noqa: E402
from dualpath_cli.runtime.options import RuntimeOptions  # noqa: E402
from dualpath_cli.runtime.workloads import agentic_workload  # noqa: E402
from dualpath_cli.services.ray_backend import (  # noqa: E402
    DECODE_RESOURCE,
    NAMESPACE,
    PREFILL_RESOURCE,
    RayBackendError,
    resolve_address,
)
from dualpath_cli.services.remote_runner import run_agents_remote  # noqa: E402
from dualpath_cli.services.runner import TurnRecord, run_agents  # noqa: E402

START_S = 180.0  # a loaded 2-core CI box starts raylets, workers and engines slowly
MB = 1024 * 1024
#: Each Ray node's object store: Ray's minimum is about 75 MB; we put nothing in it.
STORE_BYTES = 80 * MB


def _ray_processes(root: str) -> list[psutil.Process]:
    """Processes whose command line names ``root`` (Ray's session files live under it)."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(root in part for part in p.info["cmdline"] or ()):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


@pytest.fixture
def ray_cluster(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """Head + a prefill-labelled node + a decode-labelled node; shut down without a trace."""
    root = tempfile.mkdtemp(prefix="dpray")  # short: Ray's unix sockets live under it
    monkeypatch.setenv("RAY_TMPDIR", root)  # the session files and the address file too
    cluster: Cluster | None = None
    try:
        cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 1, "object_store_memory": STORE_BYTES, "include_dashboard": False})
        prefill = cluster.add_node(num_cpus=0, object_store_memory=STORE_BYTES,
                                   resources={PREFILL_RESOURCE: 1})
        decode = cluster.add_node(num_cpus=0, object_store_memory=STORE_BYTES,
                                  resources={DECODE_RESOURCE: 1})
        yield {"address": cluster.address, "prefill": prefill.node_id,
               "decode": decode.node_id, "root": root}
    finally:
        if ray.is_initialized():
            ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
        deadline = time.monotonic() + 30
        left = _ray_processes(root)
        while left and time.monotonic() < deadline:
            psutil.wait_procs(left, timeout=1)
            left = _ray_processes(root)
        for p in left:  # raylet children Ray forgot (none expected)
            p.kill()
        shutil.rmtree(root, ignore_errors=True)
        assert not left, f"Ray left processes behind: {[p.pid for p in left]}"


def _semaphores(pid: int) -> set[str]:
    """Named multiprocessing semaphores the engines of actor process ``pid`` map (their NIC
    buckets' locks; the creator maps them under glibc's temporary names)."""
    found: set[str] = set()
    for child in psutil.Process(pid).children(recursive=True):
        try:
            maps = Path(f"/proc/{child.pid}/maps").read_text()
        except OSError:
            continue
        found.update(re.findall(r"/dev/shm/(sem\.mp-[\w-]+)", maps))
    return found


def _first_line(p: subprocess.Popen[str], timeout: float) -> dict[str, Any]:
    """The launcher's ``--json`` ready line, or fail with its stderr."""
    out: list[str] = []
    stream: IO[str] | None = p.stdout
    assert stream is not None
    reader = threading.Thread(target=lambda: out.append(stream.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    if not out or not out[0].strip():
        p.kill()
        err = p.stderr.read() if p.stderr is not None else ""
        pytest.fail(f"no ready line within {timeout:g} s: {err[-3000:]}")
    data: dict[str, Any] = json.loads(out[0])
    return data


def _embedded_tokens(agents: int, turns: int) -> dict[tuple[int, int], tuple[int, ...]]:
    with RuntimeSystem(RuntimeOptions(fetch_s=0.005)) as system:
        return run_agents(system, agentic_workload(agents, turns=turns)).tokens_by_turn()


def _stop(p: subprocess.Popen[str]) -> None:
    if p.poll() is None:
        os.killpg(p.pid, signal.SIGTERM)
    try:
        p.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(10)
    for stream in (p.stdout, p.stderr):
        if stream is not None:
            stream.close()


def test_ray_backend_places_serves_and_survives_a_killed_actor(
        ray_cluster: dict[str, Any], tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    env = dict(os.environ, XDG_RUNTIME_DIR=str(run), XDG_STATE_HOME=str(tmp_path / "state"),
               XDG_DATA_HOME=str(tmp_path / "data"), DUALPATH_URL="", DUALPATH_TOKEN="",
               RAY_ADDRESS="")
    port = free_port()
    launcher = subprocess.Popen(
        [sys.executable, "-m", "dualpath_cli.cli.app", "launch", "--backend", "ray",
         "--address", ray_cluster["address"], "--pd", "1P1D", "--port", str(port),
         "--store", str(tmp_path / "store"), "--start-timeout", f"{START_S:g}s", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        start_new_session=True)
    try:
        state = _first_line(launcher, START_S + 30)
        placed = {a["role"]: a for a in state["ray"]}
        # each dualpath node's actor runs on the Ray node labelled for its role
        assert placed["prefill"]["node_id"] == ray_cluster["prefill"]
        assert placed["decode"]["node_id"] == ray_cluster["decode"]
        assert "as 2 Ray actors" in state["line"]
        url, token = state["url"], Path(state["token_file"]).read_text().strip()
        old_decode = placed["decode"]["engines"]

        ray.init(address=ray_cluster["address"], namespace=NAMESPACE,
                 logging_level="WARNING", log_to_driver=False)
        victim = ray.get_actor(placed["decode"]["name"], namespace=NAMESPACE)
        client = DualPathClient(url, token, timeout=10.0)
        killed = threading.Event()
        victim_sems: set[str] = set()
        lock = threading.Lock()
        done: list[TurnRecord] = []

        def on_turn(rec: TurnRecord) -> None:
            with lock:
                done.append(rec)
                if killed.is_set() or len(done) < 2:
                    return
                # a turn placed on the decode node and not finished: killing the node now
                # must re-queue it (its decoding is slowed below, so it stays in flight)
                rows = client.requests("inflight")["requests"]
                if any(r["de"] in old_decode and r["phase"] in ("prefill", "decode")
                       for r in rows):
                    victim_sems.update(_semaphores(placed["decode"]["pid"]))
                    ray.kill(victim, no_restart=False)  # its process dies; Ray restarts it
                    killed.set()

        # the decode engines decode 20x slower until they are killed, so a turn is in
        # flight on them when on_turn looks (on the tiny model a decode is over in ms)
        client.set_faults([f"slow_compute:engine={eid},factor=20" for eid in old_decode])
        agents, turns = 4, 4
        result, _ = run_agents_remote(url, agentic_workload(agents, turns=turns),
                                      token=token, on_turn=on_turn, timeout=150)
        assert killed.is_set(), "no turn was ever in flight on the decode node"
        assert not result.errors
        assert len(result.turns) == agents * turns
        assert result.tokens_by_turn() == _embedded_tokens(agents, turns)

        # our heartbeats (or the restarted actor's leave) took the old engines out and
        # re-queued their turns; Ray restarted the actor on the decode-labelled node
        view = client.view()
        states = {e.engine_id: e.state for e in view.engines}
        assert all(states[eid] == "dead" for eid in old_decode)
        assert view.scheduler.requeued_total >= 1
        again = ray.get(victim.info.remote(), timeout=60)
        assert again["restarted"] and again["pid"] != placed["decode"]["pid"]
        assert again["node_id"] == ray_cluster["decode"]
        assert all(states[eid] == "ready" for eid in again["engines"])
        # Ray killed the old worker's children, multiprocessing's resource tracker with
        # them; the restarted actor unlinked the named semaphores it left
        assert victim_sems
        assert not [n for n in victim_sems if Path("/dev/shm", n).exists()]
        client.close()
    finally:
        _stop(launcher)
    assert launcher.returncode == 0, launcher.returncode
    # the actors' notes of their semaphores went with their clean stop
    assert not (Path(ray_cluster["root"]) / f"dualpath-ray-{os.getuid()}").exists()


def test_resolve_address_errors(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(RayBackendError, match="no Ray cluster runs on this machine"):
        resolve_address(None)
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "ray_current_cluster").write_text("10.0.0.1:6379\n")
    assert resolve_address("auto") == "10.0.0.1:6379"
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.2:6380")
    assert resolve_address(None) == "10.0.0.2:6380"
    for bad in ("head", "head:port", "ray://head:10001"):
        with pytest.raises(RayBackendError):
            resolve_address(bad)


def test_unreachable_ray_is_one_line(tmp_path: Path) -> None:
    env = dict(os.environ, XDG_RUNTIME_DIR=str(tmp_path), RAY_TMPDIR=str(tmp_path))
    port = free_port()  # nothing listens there
    p = subprocess.run([sys.executable, "-m", "dualpath_cli.cli.app", "launch", "--backend",
                        "ray", "--address", f"127.0.0.1:{port}", "--port", str(free_port())],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == RayBackendError.exit_code
    assert f"the Ray cluster at 127.0.0.1:{port} is unreachable" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1  # one line, no traceback


@pytest.mark.parametrize(("args", "message"), [
    (["--backend", "k8s"], "--backend 'k8s': expected local or ray"),
    (["--address", "auto"], "--address is for --backend ray"),
    (["--backend", "ray", "--role", "decode", "--join", "h:1"], "no --role prefill|decode"),
    (["--backend", "ray", "--engines", "emulated"], "--engines emulated"),
])
def test_backend_usage_errors(args: list[str], message: str,
                              capsys: pytest.CaptureFixture[str]) -> None:
    from dualpath_cli.cli.app import main

    assert main(["launch", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
