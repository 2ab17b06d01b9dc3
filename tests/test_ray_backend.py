"""``launch --backend ray`` on a local multi-node Ray cluster (``ray.cluster_utils.Cluster``).

One Ray cluster for the module: a head plus a node offering the prefill resource and
carrying the labels ``dualpath.role=prefill`` and ``dualpath.sched=yes``, and a node with
the decode resource and ``dualpath.role=decode``; each with little memory so it fits a 2-core
CI box. The launcher (the Ray driver) starts the scheduler's actor (on its own node, the
head, or on the node ``--ray-scheduler-label`` names) and one actor per dualpath node, by
custom resource or by label; the agentic workload completes with the embedded run's tokens;
the decode node's actor killed mid-run (its process, so Ray restarts it) is detected by our
heartbeats, its turns re-queued, and the restarted actor joins again; the scheduler's actor
killed mid-run is restarted by Ray on its node and resumes from its checkpoint.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.e2e  # a local Ray cluster

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'dualpath[ray]')")

import psutil  # noqa: E402
from ray.cluster_utils import Cluster  # type: ignore[import-not-found,unused-ignore]  # noqa: E402
from test_fault_matrix import AGENTS as KEYED_AGENTS  # noqa: E402
from test_fault_matrix import reference  # noqa: E402
from test_multinode import (  # noqa: E402
    Procs,
    _embedded_tokens,
    _json_line,
    engine_semaphores,
)
from test_scheduler_restart import TURN_DEADLINE_S, Clients  # noqa: E402

from dualpath_cli.api.client import DualPathClient  # noqa: E402
from dualpath_cli.api.listen import free_port, listen  # noqa: E402
from dualpath_cli.errors import UsageError  # noqa: E402
from dualpath_cli.runtime.workloads import agentic_workload  # noqa: E402
from dualpath_cli.services.ray_backend import (  # noqa: E402
    DECODE_RESOURCE,
    PREFILL_RESOURCE,
    resolve_address,
)
from dualpath_cli.services.ray_common import (  # noqa: E402
    NAMESPACE,
    RayBackendError,
    scheduler_actor_name,
)
from dualpath_cli.services.ray_labels import label_matches, parse_label  # noqa: E402
from dualpath_cli.services.remote_runner import run_agents_remote  # noqa: E402
from dualpath_cli.services.runner import TurnRecord  # noqa: E402

START_S = 180.0  # a loaded 2-core CI box starts raylets, workers and engines slowly
MB = 1024 * 1024
#: Each Ray node's object store: Ray's minimum is about 75 MB; we put nothing in it.
STORE_BYTES = 80 * MB
AGENTS, TURNS = 4, 4
#: Ray Client (``ray://``) needs grpcio (``pip install 'ray[client]'``); without it the
#: labels test drives through the GCS address instead.
HAS_CLIENT = importlib.util.find_spec("grpc") is not None


def _ray_processes(root: str) -> list[psutil.Process]:
    """Live processes whose command line names ``root`` (Ray's session files live under it;
    a zombie has exited and holds nothing but its pid until its parent reaps it)."""
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        try:
            if p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if any(root in part for part in p.info["cmdline"] or ()):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[dict[str, Any]]:
    """Head + a prefill node (also labelled for the scheduler) + a decode node, shared by
    the module's launches (each launch names its actors by its own port); shut down
    without a trace."""
    root = tempfile.mkdtemp(prefix="dpray")  # short: Ray's unix sockets live under it
    cluster: Cluster | None = None
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_TMPDIR", root)  # the session files and the address file too
        # the head's Ray Client proxy starts one server process per driver and waits 30 s
        # for it by default: a loaded 2-core CI box can take longer to import Ray there
        mp.setenv("RAY_CLIENT_SERVER_CHECK_CHANNEL_TIMEOUT_S", "120")
        try:
            client = {"ray_client_server_port": free_port()} if HAS_CLIENT else {}
            cluster = Cluster(initialize_head=True, head_node_args={
                "num_cpus": 1, "object_store_memory": STORE_BYTES,
                "include_dashboard": False, **client})
            prefill = cluster.add_node(
                num_cpus=0, object_store_memory=STORE_BYTES, resources={PREFILL_RESOURCE: 1},
                labels={"dualpath.role": "prefill", "dualpath.sched": "yes"})
            decode = cluster.add_node(
                num_cpus=0, object_store_memory=STORE_BYTES, resources={DECODE_RESOURCE: 1},
                labels={"dualpath.role": "decode"})
            head = cluster.head_node
            assert head is not None
            yield {"address": cluster.address, "head": head.node_id,
                   "client": f"ray://127.0.0.1:{client['ray_client_server_port']}"
                   if client else None,
                   "prefill": prefill.node_id, "decode": decode.node_id, "root": root}
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


@pytest.fixture(scope="module")
def tokens() -> dict[tuple[int, int], tuple[int, ...]]:
    """The embedded run's tokens of the module's workload (computed once)."""
    return _embedded_tokens(AGENTS, TURNS)


def _env(tmp_path: Path) -> dict[str, str]:
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    return dict(os.environ, XDG_RUNTIME_DIR=str(run), XDG_STATE_HOME=str(tmp_path / "state"),
                XDG_DATA_HOME=str(tmp_path / "data"), DUALPATH_URL="", DUALPATH_TOKEN="",
                RAY_ADDRESS="")


def _launch(procs: Procs, ray_cluster: dict[str, Any], tmp_path: Path, *more: str,
            address: str | None = None) -> subprocess.Popen[str]:
    return procs.start("--backend", "ray", "--address", address or ray_cluster["address"],
                       "--pd",
                       "1P1D", "--port", str(free_port()), "--store", str(tmp_path / "store"),
                       "--start-timeout", f"{START_S:g}s", "--json", *more)


def _connect(ray_cluster: dict[str, Any]) -> None:
    """This test process as a second Ray driver (to find and kill the launch's actors)."""
    if not ray.is_initialized():
        ray.init(address=ray_cluster["address"], namespace=NAMESPACE,
                 logging_level="WARNING", log_to_driver=False)


def test_ray_backend_places_serves_and_survives_a_killed_actor(
        ray_cluster: dict[str, Any], tokens: dict[tuple[int, int], tuple[int, ...]],
        tmp_path: Path) -> None:
    procs = Procs(_env(tmp_path))
    launcher = _launch(procs, ray_cluster, tmp_path)
    try:
        state = _json_line(launcher, START_S + 30)
        placed = {a["role"]: a for a in state["ray"]}
        # each dualpath node's actor runs on the Ray node with its role's resource
        assert placed["prefill"]["node_id"] == ray_cluster["prefill"]
        assert placed["decode"]["node_id"] == ray_cluster["decode"]
        # the scheduler is an actor too, by default on the driver's node (the head here)
        sched = state["ray_scheduler"]
        assert sched["node_id"] == state["ray_driver_node"] == ray_cluster["head"]
        assert sched["pid"] != launcher.pid and state["url"] == sched["url"]
        assert "as 2 Ray actors" in state["line"]
        url, token = state["url"], Path(state["token_file"]).read_text().strip()
        old_decode = placed["decode"]["engines"]

        _connect(ray_cluster)
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
                rows = client.requests("inflight").turns
                if any(r.de in old_decode and r.phase in ("prefill", "decode")
                       for r in rows):
                    victim_sems.update(engine_semaphores(placed["decode"]["pid"]))
                    ray.kill(victim, no_restart=False)  # its process dies; Ray restarts it
                    killed.set()

        # the decode engines decode 20x slower until they are killed, so a turn is in
        # flight on them when on_turn looks (on the tiny model a decode is over in ms)
        client.set_faults([f"slow_compute:engine={eid},factor=20" for eid in old_decode])
        result, _ = run_agents_remote(url, agentic_workload(AGENTS, turns=TURNS),
                                      token=token, on_turn=on_turn, timeout=150)
        assert killed.is_set(), "no turn was ever in flight on the decode node"
        assert not result.errors
        assert len(result.turns) == AGENTS * TURNS
        assert result.tokens_by_turn() == tokens

        # our heartbeats (or the restarted actor's leave) took the old engines out and
        # re-queued their turns; Ray restarted the actor on the decode-labelled node
        view = client.view()
        states = {e.engine_id: e.state for e in view.engines}
        # (dead when the heartbeat timeout caught them first and nothing else yet; left
        # once the restarted actor's leave took its old name out of the cluster)
        assert all(states[eid] in ("dead", "left") for eid in old_decode)
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
        procs.close()
    assert launcher.returncode == 0, launcher.returncode
    # the clean stop killed every actor of the launch, the scheduler's too
    for name in (sched["name"], placed["prefill"]["name"], placed["decode"]["name"]):
        with pytest.raises(ValueError):
            ray.get_actor(name, namespace=NAMESPACE)
    # the actors' notes of their semaphores went with their clean stop
    assert not (Path(ray_cluster["root"]) / f"dualpath-ray-{os.getuid()}").exists()


def test_labels_place_every_actor_and_the_scheduler_actor_resumes_after_a_kill(
        ray_cluster: dict[str, Any], tmp_path: Path) -> None:
    """Placement by node labels (scheduler, prefill and decode), the launcher driving
    through Ray Client (``ray://``) when grpcio is installed; the scheduler's actor killed
    mid-run is restarted by Ray on its node, resumes from its checkpoint on the same ports,
    and every turn of clients that resend with their ``Idempotency-Key`` is answered once
    with the reference model's tokens."""
    procs = Procs(_env(tmp_path))
    launcher = _launch(procs, ray_cluster, tmp_path,
                       "--ray-scheduler-label", "dualpath.sched=yes",
                       "--ray-prefill-label", "dualpath.role=prefill",
                       "--ray-decode-label", "dualpath.role=decode",
                       address=ray_cluster["client"])
    clients: Clients | None = None
    try:
        state = _json_line(launcher, START_S + 30)
        sched = state["ray_scheduler"]
        # the scheduler's actor on the labelled node (not the driver's), the API its own
        assert sched["node_id"] == ray_cluster["prefill"] != state["ray_driver_node"]
        if ray_cluster["client"]:  # a Ray Client driver is on no node of the cluster
            assert state["ray_driver_node"] is None
            assert f"(Ray cluster {ray_cluster['client']})" in state["line"]
        assert state["url"] == sched["url"] and not sched["restarted"]
        placed = {a["role"]: a for a in state["ray"]}
        assert placed["prefill"]["node_id"] == ray_cluster["prefill"]
        assert placed["decode"]["node_id"] == ray_cluster["decode"]
        url, token = state["url"], Path(state["token_file"]).read_text().strip()

        _connect(ray_cluster)
        handle = ray.get_actor(scheduler_actor_name(state["port"]), namespace=NAMESPACE)
        clients = Clients(url, token, "ray")
        threads = clients.start()
        wanted = sum(len(t.turns) for t in KEYED_AGENTS)
        assert clients.wait_answered(3, TURN_DEADLINE_S), "no turn answered"
        ray.kill(handle, no_restart=False)  # its process dies; Ray restarts it
        assert clients.wait_answered(wanted, TURN_DEADLINE_S * 2)
        for th in threads:
            th.join(TURN_DEADLINE_S)
        assert not clients.errors
        assert clients.tokens == reference()
        assert all(n == 1 for n in clients.answers.values())
        assert clients.retries >= 1  # the kill cut (or refused) some request
        again = ray.get(handle.info.remote(), timeout=60)
        assert again["restarted"] and again["pid"] != sched["pid"]
        assert again["node_id"] == ray_cluster["prefill"] and again["url"] == url
        # the node actors' engines reconnected to the restored scheduler: no re-join
        assert again["restored"]["engines"] == 2
        assert again["restored"]["control_port_kept"]

        # killed for good (as when its restarts are used up): the launcher says so in one
        # line, stops the node actors and exits 1
        ray.kill(handle, no_restart=True)
        assert launcher.wait(60) == 1
        assert launcher.stderr is not None
        err = launcher.stderr.read().strip().splitlines()
        assert err[-1].startswith("error: the scheduler's Ray actor died and Ray will not "
                                  "restart it: "), err
        assert any(line.startswith("the scheduler's Ray actor restarted (pid "
                                   f"{again['pid']} on Ray node") for line in err), err
        with pytest.raises(ValueError):  # gone: no actor of this launch is left
            ray.get_actor(placed["decode"]["name"], namespace=NAMESPACE)
    finally:
        if clients is not None:
            clients.http.close()
        procs.close()


@pytest.mark.parametrize("flag", ["--ray-decode-label", "--ray-scheduler-label"])
def test_a_label_no_node_carries_is_one_line(ray_cluster: dict[str, Any], tmp_path: Path,
                                             flag: str) -> None:
    procs = Procs(_env(tmp_path))
    p = _launch(procs, ray_cluster, tmp_path, flag, "dualpath.role=nowhere")
    try:
        _, err = p.communicate(timeout=120)  # at once: Ray would wait for ever
    finally:
        procs.close()
    role = flag.split("-")[3]
    assert p.returncode == RayBackendError.exit_code
    assert (f"carries the label dualpath.role=nowhere (--ray-{role}-label); start one with "
            "ray start --labels=dualpath.role=nowhere") in err
    assert len(err.strip().splitlines()) == 1, err  # one line, no traceback


def test_a_taken_api_port_is_one_line(ray_cluster: dict[str, Any], tmp_path: Path) -> None:
    """The scheduler's actor binds the API on its node: a taken port fails its creation
    (Ray does not restart an actor whose constructor raised) and the launch says why."""
    procs = Procs(_env(tmp_path))
    squatter = listen("127.0.0.1", 0)
    port = squatter.getsockname()[1]
    try:
        p = procs.start("--backend", "ray", "--address", ray_cluster["address"], "--port",
                        str(port), "--pd", "1P1D", "--store", str(tmp_path / "store"))
        _, err = p.communicate(timeout=120)
    finally:
        procs.close()
        squatter.close()
    assert p.returncode == RayBackendError.exit_code
    assert "the scheduler's Ray actor on Ray node " in err
    assert f"port {port} on 127.0.0.1 is already in use" in err
    assert len(err.strip().splitlines()) == 1, err  # one line, no traceback


def test_parse_and_match_labels() -> None:
    sel = parse_label("--x", "dualpath.role=prefill, example.com/zone=in(a, b),gpu=!none")
    assert sel == {"dualpath.role": "prefill", "example.com/zone": "in(a, b)",
                   "gpu": "!none"}
    assert label_matches({"dualpath.role": "prefill", "example.com/zone": "b"}, sel)
    assert not label_matches({"dualpath.role": "prefill", "example.com/zone": "c"}, sel)
    assert not label_matches({"dualpath.role": "prefill", "example.com/zone": "a",
                              "gpu": "none"}, sel)
    assert not label_matches({}, {"dualpath.role": "prefill"})
    for bad in ("role", "=x", "role=", "role=-x", "a b=c", "role=in()"):
        with pytest.raises(UsageError, match="expected KEY=VALUE"):
            parse_label("--ray-prefill-label", bad)


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
    assert resolve_address("ray://head:10001") == "ray://head:10001"  # Ray Client
    for bad in ("head", "head:port", "ray://head", "ray://:10001", "ray://head:0"):
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
    (["--ray-prefill-label", "a=b"], "--ray-prefill-label is for --backend ray"),
    (["--backend", "ray", "--ray-decode-label", "role"], "expected KEY=VALUE"),
])
def test_backend_usage_errors(args: list[str], message: str,
                              capsys: pytest.CaptureFixture[str]) -> None:
    from dualpath_cli.cli.app import main

    assert main(["launch", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
