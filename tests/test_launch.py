"""``dualpath launch``/``status``/``stop`` end to end: real launcher processes on loopback,
temporary XDG directories and ports, exit codes as the contract (0 running, 2 unhealthy, 3
none)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from conftest import CLI, all_gone, communicate_or_explain, run_cli, wait_until

from dualpath_cli.api.listen import free_port
from dualpath_cli.cli.app import main
from dualpath_cli.services import statefile
from dualpath_cli.storage import PosixStore
from dualpath_cli.storage.inspect import verify_store

pytestmark = pytest.mark.e2e  # dualpath launch as a subprocess


# --- no cluster, stale files, bad flags (fast: in-process) -----------------------------------
def test_status_and_stop_without_a_cluster_exit_3(env: dict[str, str],
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status"]) == 3
    assert "no cluster running" in capsys.readouterr().out
    assert main(["stop"]) == 3
    assert main(["status", "--json"]) == 3
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["state"] == "none"


def test_stale_state_file_is_detected_and_removed(env: dict[str, str],
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    state = statefile.ClusterState(pid=dead.pid, url="http://127.0.0.1:9", host="127.0.0.1",
                                   port=9, started_at=time.time(),
                                   token_file=str(statefile.token_path(9)))
    statefile.write_state(state)
    statefile.token_path(9).write_text("secret\n")
    assert main(["status"]) == 3
    out = capsys.readouterr().out
    assert "stale" in out and str(dead.pid) in out
    assert not state.path.exists() and not statefile.token_path(9).exists()
    statefile.write_state(state)
    assert main(["stop"]) == 3
    assert not state.path.exists()


def _fake_launch(port: int, token: str) -> statefile.ClusterState:
    """A live state file for ``port`` (this test process is its "launcher") and its token."""
    state = statefile.ClusterState(pid=os.getpid(), url=f"http://127.0.0.1:{port}",
                                   host="127.0.0.1", port=port, started_at=time.time(),
                                   token_file=str(statefile.token_path(port)),
                                   pid_start=statefile.process_start_time(os.getpid()))
    statefile.write_state(state)
    fd = os.open(statefile.token_path(port), os.O_WRONLY | os.O_CREAT, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(token + "\n")
    return state


def test_the_cluster_a_command_names_url_then_port_then_env_then_the_one_running(
        env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """cli/source.py's one rule, on fake state files (no process is started): --url beats
    --port beats DUALPATH_URL beats the one live state file; --token-file beats
    DUALPATH_TOKEN beats the state file's token file."""
    from dualpath_cli.cli.source import (
        AmbiguousCluster,
        ClusterRef,
        NotRunning,
        read_token_file,
        resolve,
        running,
    )
    from dualpath_cli.errors import UsageError

    assert running(ClusterRef()) is None  # none: tune set edits the config file instead
    with pytest.raises(NotRunning, match="no cluster running"):
        resolve(ClusterRef())
    a, b = _fake_launch(18101, "tok-a"), _fake_launch(18102, "tok-b")
    with pytest.raises(AmbiguousCluster, match="ports 18101, 18102.*--port") as err:
        resolve(ClusterRef())
    assert err.value.exit_code == 3
    with pytest.raises(AmbiguousCluster):  # not "none running": no config file edit
        running(ClusterRef())
    got = resolve(ClusterRef(port=18102))
    assert (got.url, got.token, got.state and got.state.port) == (b.url, "tok-b", 18102)
    got = resolve(ClusterRef(url=a.url + "/", port=18102))  # --url wins; its own state file
    assert (got.url, got.token) == (a.url, "tok-a")
    monkeypatch.setenv("DUALPATH_URL", b.url)
    assert resolve(ClusterRef()).url == b.url
    assert resolve(ClusterRef(port=18101)).url == a.url  # a flag beats the environment
    monkeypatch.delenv("DUALPATH_URL")
    monkeypatch.setenv("DUALPATH_TOKEN", "tok-env")
    assert resolve(ClusterRef(port=18101)).token == "tok-env"
    given = tmp_path / "token"
    given.write_text("tok-file\n")
    assert resolve(ClusterRef(port=18101, token_file=given)).token == "tok-file"
    monkeypatch.delenv("DUALPATH_TOKEN")
    far = resolve(ClusterRef(url="http://10.9.9.9:8000"))  # not launched here: no token
    assert far.token is None and far.state is None and "--token-file" in far.token_note
    with pytest.raises(NotRunning, match="on port 18103"):
        resolve(ClusterRef(port=18103))
    with pytest.raises(NotRunning):  # a named port with nothing on it is no file edit
        running(ClusterRef(port=18103))
    with pytest.raises(UsageError, match="--token-file .*cannot read"):
        read_token_file(tmp_path / "missing")
    statefile.remove_state(b.port)
    assert resolve(ClusterRef()).token == "tok-a"  # the one running
    statefile.remove_state(a.port)


def test_two_clusters_and_none_named_is_unknown_not_a_guess(
        env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Exit 3 (cannot look) with one line naming both ports, in every kind of command; tune
    set edits no config file; stop signals nothing."""
    from dualpath_cli.cli.monitor_cmd import main as monitor_main

    monkeypatch.setenv("DUALPATH_CONFIG_HOME", str(tmp_path / "home"))
    _fake_launch(18111, "tok-a")
    _fake_launch(18112, "tok-b")
    for argv in (["status"], ["stop"], ["tune", "set", "alpha=1s"], ["tune", "show"],
                 ["diagnose", "all"], ["explain", "1"], ["record", "-w", "1s"]):
        assert main(argv) == 3, argv
        err = capsys.readouterr().err
        assert "ports 18111, 18112" in err and "--port" in err, (argv, err)
    assert monitor_main(["--once"]) == 3
    assert main(["status", "--json"]) == 3
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["state"] == "unknown"
    assert main(["stop", "--json"]) == 3
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["stopped"] is False
    assert main(["tune", "set", "--port", "18113", "alpha=1s"]) == 3  # nothing on it
    assert main(["stop", "--url", "http://10.9.9.9:8000"]) == 3  # not launched here
    assert "no cluster launched on this host" in capsys.readouterr().out
    assert not (tmp_path / "home").exists()
    assert statefile.live_states()[0]  # both still "running": nothing was signalled
    for port in (18111, 18112):
        statefile.remove_state(port)


def test_non_loopback_host_is_refused_without_allow_remote(
        env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["launch", "--host", "0.0.0.0", "--port", str(free_port())]) == 2
    err = capsys.readouterr().err
    assert "--allow-remote" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_launch_on_a_taken_port_fails_fast_before_engines(
        env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        t0 = time.monotonic()
        assert main(["launch", "--port", str(port)]) == 1
        assert time.monotonic() - t0 < 5
    err = capsys.readouterr().err
    assert f"port {port}" in err and "in use" in err
    assert not list(Path(env["XDG_RUNTIME_DIR"], "dualpath").glob("cluster-*"))


def test_launch_refuses_a_port_whose_launcher_is_alive(
        env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()
    me = statefile.ClusterState(pid=os.getpid(), url=f"http://127.0.0.1:{port}",
                                host="127.0.0.1", port=port, started_at=time.time(),
                                token_file="t",
                                pid_start=statefile.process_start_time(os.getpid()))
    statefile.write_state(me)
    assert main(["launch", "--port", str(port)]) == 1
    assert "already running" in capsys.readouterr().err
    assert me.path.exists()  # someone else's live file is left alone


# --- a real launched cluster ----------------------------------------------------------------
class Launched:
    """A foreground ``dualpath launch`` subprocess and what it printed."""

    def __init__(self, env: dict[str, str], port: int, *extra: str) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        # Python's stacks on a SIGABRT: what a launcher stuck in its drain was doing
        self.proc = subprocess.Popen([*CLI, "launch", "--port", str(port), *extra],
                                     env={**env, "PYTHONFAULTHANDLER": "1"},
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        assert self.proc.stdout is not None
        self.ready_line = self.proc.stdout.readline()
        self.family: list[int] = []
        if self.proc.poll() is None and self.ready_line:
            self.family = [c.pid for c in
                           psutil.Process(self.proc.pid).children(recursive=True)]

    def finish(self, timeout: float = 60) -> tuple[int, str, str]:
        out, err = communicate_or_explain(self.proc, timeout)
        return self.proc.returncode, self.ready_line + out, err

    def kill(self) -> None:
        for pid in [self.proc.pid, *self.family]:
            try:
                psutil.Process(pid).kill()
            except psutil.NoSuchProcess:
                pass
        self.proc.communicate(timeout=10)


@pytest.fixture()
def launched(env: dict[str, str], tmp_path: Path) -> Iterator[Launched]:
    cluster = Launched(env, free_port(), "--store", str(tmp_path / "store"),
                       "--drain-timeout", "120s")
    try:
        assert cluster.ready_line.startswith("ready in "), (
            cluster.ready_line + (cluster.proc.stderr.read()  # type: ignore[union-attr]
                                  if cluster.proc.poll() is not None else ""))
        yield cluster
    finally:
        if cluster.proc.poll() is None:
            cluster.kill()


def _http(url: str, body: dict[str, Any] | None = None, token: str | None = None,
          timeout: float = 60) -> tuple[int, dict[str, str], Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method="POST" if body is not None else "GET",
                                 headers={"Content-Type": "application/json"})
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, dict(resp.headers), json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as err:
        raw = err.read()
        try:
            payload = json.loads(raw)
        except ValueError:
            payload = raw.decode(errors="replace")
        return err.code, dict(err.headers), payload
    except (urllib.error.URLError, ConnectionError) as err:
        reason = getattr(err, "reason", err)
        if isinstance(reason, ConnectionRefusedError | ConnectionResetError):
            return 0, {}, None  # not listening (any more): nothing was admitted
        raise


def test_launch_status_stop_status(launched: Launched, env: dict[str, str],
                                   tmp_path: Path) -> None:
    line = launched.ready_line
    assert "1P2D (1 prefill, 2 decode engines)" in line and launched.url in line
    assert "token in" in line
    state_file = statefile.state_path(launched.port)
    state = json.loads(state_file.read_text())
    assert state["pid"] == launched.proc.pid and state["url"] == launched.url
    token_file = Path(state["token_file"])
    assert token_file.stat().st_mode & 0o777 == 0o600
    assert _http(f"{launched.url}/readyz")[0] == 200
    engines = [c for c in launched.family
               if "spawn_main" in " ".join(psutil.Process(c).cmdline())]
    assert len(engines) >= 3

    done = run_cli(env, "status")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("running  1P2D  3/3 engines healthy  queue 0")
    js = run_cli(env, "status", "--json")
    assert js.returncode == 0 and json.loads(js.stdout)["healthy"] == 3
    # alpha as the config gives it (scheduler.alpha's default, 3 s of reading at a node's
    # storage NICs), its tokens beside; a flat scheduler, one node per group: no more words
    summary = json.loads(js.stdout)
    assert summary["alpha_s"] == pytest.approx(3.0, rel=1e-3) and summary["alpha"] == "3s"
    assert summary["alpha_tokens"] > 0 and summary["alpha_source"] == "default"
    assert "  alpha 3s (default)  beta " in done.stdout
    assert (summary["hierarchical"], summary["sub_schedulers"], summary["nodes_per_group"]) == (
        False, 1, 1) and "hierarchy" not in done.stdout and "groups of" not in done.stdout
    by_url = run_cli({**env, "DUALPATH_URL": launched.url}, "status", "--url", launched.url)
    assert by_url.returncode == 0

    # a second launch on the same port fails fast, in one line, and leaves the first alone
    t0 = time.monotonic()
    second = run_cli(env, "launch", "--port", str(launched.port), "--store",
                     str(tmp_path / "store2"))
    assert second.returncode == 1 and time.monotonic() - t0 < 30
    assert "already running" in second.stderr and "Traceback" not in second.stderr
    assert len(second.stderr.strip().splitlines()) == 1
    assert launched.proc.poll() is None and _http(f"{launched.url}/readyz")[0] == 200

    # an engine that dies is restarted by the launcher (cluster.restart, on by default):
    # a new process, and the cluster healthy again; stop still drains and exits
    os.kill(engines[-1], signal.SIGKILL)

    def restarted() -> bool:
        for c in psutil.Process(launched.proc.pid).children(recursive=True):
            try:  # the killed engine is a zombie until the launcher reaps it
                if c.pid not in engines and "spawn_main" in " ".join(c.cmdline()):
                    return True
            except psutil.Error:
                continue
        return False

    wait_until(restarted, 60, "the killed engine to be restarted")
    wait_until(lambda: run_cli(env, "status").returncode == 0, 60, "status to say healthy")
    assert "3/3 engines healthy" in run_cli(env, "status").stdout

    stopped = run_cli(env, "stop", "--timeout", "60s")
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout.startswith("drained 0 turns in ") and "stopped" in stopped.stdout
    code, _, err = launched.finish()
    assert code == 0, err
    wait_until(lambda: all_gone([launched.proc.pid, *launched.family]), 10,
               "the launcher and its engines to exit")
    assert not state_file.exists() and not token_file.exists()
    assert run_cli(env, "status").returncode == 3
    assert run_cli(env, "stop").returncode == 3


def test_detach_status_then_sigkill_leaves_a_stale_file(env: dict[str, str],
                                                        tmp_path: Path) -> None:
    port = free_port()
    up = run_cli(env, "launch", "--detach", "--port", str(port), "--store",
                 str(tmp_path / "store"), timeout=300)
    family: list[int] = []
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert up.stdout.startswith("ready in ") and f"127.0.0.1:{port}" in up.stdout
        state = json.loads(statefile.state_path(port).read_text())
        pid = state["pid"]
        family = [pid, *(c.pid for c in psutil.Process(pid).children(recursive=True))]
        assert psutil.Process(pid).ppid() != os.getpid()  # re-parented: it runs on its own
        log = Path(state["log_file"])
        assert log.parent == statefile.state_dir() and "ready in" in log.read_text()
        assert run_cli(env, "status").returncode == 0
        # killed outright, the launcher takes its engines with it and leaves a stale state
        # file, which the next status reports as "none" (exit 3) and removes
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: all_gone(family), 15, "the launcher and its engines")
        done = run_cli(env, "status")
        assert done.returncode == 3 and "stale" in done.stdout, done.stdout + done.stderr
        assert not statefile.state_path(port).exists()
        # the killed launcher left its scheduler checkpoint: the token stays for the
        # restart (tests/test_scheduler_restart.py), and goes with the checkpoint
        assert statefile.checkpoint_path(port).exists()
        assert statefile.token_path(port).exists()
    finally:
        for p in family:
            try:
                psutil.Process(p).kill()
            except psutil.NoSuchProcess:
                pass


def test_sigterm_with_turns_in_flight(launched: Launched, tmp_path: Path) -> None:
    """Every admitted turn completes or gets a retryable error; later ones get 503."""
    url = f"{launched.url}/v1/completions"
    results: list[tuple[int, dict[str, str], Any]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def one(i: int) -> None:
        try:
            _one(i)
        except BaseException as err:  # a hung or broken request fails the test below
            errors.append(err)

    def _one(i: int) -> None:
        got = _http(url, {"model": "tiny", "prompt": list(range(1 + i, 161 + i)),
                          "max_tokens": 24, "temperature": 0, "user": f"agent-{i}"},
                    timeout=300)
        with lock:
            results.append(got)

    workers = [threading.Thread(target=one, args=(i,)) for i in range(6)]
    for w in workers:
        w.start()
    status = _http(f"{launched.url}/api/v1/status")
    assert status[0] == 200
    wait_until(lambda: launched.proc.poll() is not None or _in_flight(launched) > 0, 30,
               "turns to be in flight")
    launched.proc.send_signal(signal.SIGTERM)
    wait_until(lambda: _http(f"{launched.url}/readyz", timeout=30)[0] != 200, 30,
               "the cluster to stop being ready")
    late = _http(url, {"model": "tiny", "prompt": [1, 2, 3], "max_tokens": 2})
    if late[0] != 0:  # the listener may already be closed: then nothing was admitted
        assert late[0] == 503 and "retry-after" in {k.lower() for k in late[1]}
    for w in workers:
        w.join(300)
    assert not errors and len(results) == 6
    for code, headers, body in results:
        if code == 200:
            assert body["usage"]["completion_tokens"] == 24
        elif code != 0:  # 0: refused after the drain, so never admitted
            assert code == 503 and "retry-after" in {k.lower() for k in headers}, body
    code, _, err = launched.finish()
    assert code == 0, err
    drained = re.search(r"drained (\d+) turns", err)
    assert drained and int(drained.group(1)) >= 1, err
    wait_until(lambda: all_gone([launched.proc.pid, *launched.family]), 10,
               "the launcher and its engines to exit")
    store = tmp_path / "store"
    assert not list(store.rglob("*.tmp"))
    report = verify_store(PosixStore(store))
    assert report.checked > 0 and report.corrupt == [] and report.ok == report.checked
    assert not list(statefile.state_dir().iterdir())


def _in_flight(launched: Launched) -> int:
    code, _, body = _http(f"{launched.url}/api/v1/status", timeout=5)
    return int(body["queue"]["in_flight"]) if code == 200 else 0


_STUBBORN = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(child.pid, flush=True)
time.sleep(600)
"""


def test_stop_force_kills_a_launcher_that_does_not_exit(env: dict[str, str]) -> None:
    """A launcher stuck past --timeout: plain stop says so (1); --force kills it and its
    children and cleans the state file."""
    proc = subprocess.Popen([sys.executable, "-c", _STUBBORN], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None
    child = int(proc.stdout.readline())
    try:
        port = free_port()
        statefile.write_state(statefile.ClusterState(
            pid=proc.pid, url=f"http://127.0.0.1:{port}", host="127.0.0.1", port=port,
            started_at=time.time(), token_file=str(statefile.token_path(port)),
            pid_start=statefile.process_start_time(proc.pid)))
        soft = run_cli(env, "stop", "--timeout", "0.3s")
        assert soft.returncode == 1 and "--force" in soft.stderr
        assert proc.poll() is None
        hard = run_cli(env, "stop", "--timeout", "0.3s", "--force")
        assert hard.returncode == 0 and "killed" in hard.stdout, hard.stderr
        proc.wait(10)
        wait_until(lambda: all_gone([child]), 10, "the child to be killed")
        assert not statefile.state_path(port).exists()
    finally:
        for pid in (proc.pid, child):
            try:
                psutil.Process(pid).kill()
            except psutil.NoSuchProcess:
                pass
        proc.stdout.close()
