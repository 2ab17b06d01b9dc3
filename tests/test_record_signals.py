"""``dualpath record`` under real signals, and ``dualpath stop`` when the drain cut turns off.

The recorder runs as a subprocess against a served cluster (an in-process LiveCluster behind
the real API server): Ctrl-C (SIGINT) and SIGTERM finish its file (exit 130 / 143, "interrupted
after N samples"); SIGKILL leaves a file that reads up to its last flush, in ``diagnose
--from`` too. ``stop`` of a launched cluster whose short drain timeout cuts a long turn
off counts it and exits 1 (and, with a stand-in launcher that leaves a given drain in its
state file, prints exactly the line).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import CLI, run_cli, wait_until
from served_cluster import serve_with_token
from test_api_server import run_turns

from dualpath_cli.api.listen import free_port
from dualpath_cli.cli.app import main
from dualpath_cli.runtime.options import RuntimeOptions
from dualpath_cli.services import statefile
from dualpath_cli.services.live import LiveCluster
from dualpath_cli.services.recording import read_recording
from dualpath_cli.telemetry.gpu import FakeGpuBackend
from dualpath_cli.telemetry.recording import RecordingError

pytestmark = pytest.mark.e2e  # an API server, the recorder and a launcher stand-in as processes


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveCluster, str]]:
    with serve_with_token(RuntimeOptions(policy="dualpath", block_tokens=8),
                          tmp_path_factory.mktemp("run") / "token", FakeGpuBackend(())) as s:
        run_turns(s.live, "warm", 2)
        yield s.live, s.url


def _recorded(path: Path) -> int:
    """Samples readable in ``path`` now (0 before its first flush)."""
    try:
        return len(read_recording(path).samples)
    except RecordingError:
        return 0


def _start_recording(url: str, path: Path, tmp_path: Path,
                     *extra: str) -> subprocess.Popen[str]:
    env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path)}
    env.pop("DUALPATH_URL", None)
    # SIGINT's default disposition in the child: a suite run as a shell's background job
    # (``pytest &``) inherits SIGINT ignored, and Python then installs no handler for it
    return subprocess.Popen([*CLI, "record", "--window", "10m", "--interval", "250ms",
                             "-o", str(path), "--url", url, *extra], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


@pytest.mark.parametrize("signum,code,suffix,as_json", [
    (signal.SIGINT, 130, ".jsonl.zst", False),
    (signal.SIGTERM, 143, ".jsonl.gz", True),
])
def test_an_interrupted_recording_is_finished_and_says_so(
        served: tuple[LiveCluster, str], tmp_path: Path, signum: int, code: int,
        suffix: str, as_json: bool) -> None:
    live, url = served
    path = tmp_path / f"incident{suffix}"
    proc = _start_recording(url, path, tmp_path, *(["--json"] if as_json else []))
    try:
        wait_until(lambda: proc.poll() is not None or _recorded(path) >= 1, 60,
                   "the first sample on disk")
        run_turns(live, f"during-{signum}", 2, seed=signum)  # inside the window
        after = _recorded(path) + 1  # a sample taken after the turns (it fetched them)
        wait_until(lambda: proc.poll() is not None or _recorded(path) >= max(4, after), 60,
                   "samples after the turns on disk")
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == code, err
    said = [line for line in err.splitlines() if "interrupted after" in line]
    assert len(said) == 1, err
    samples = int(said[0].split("interrupted after ")[1].split()[0])
    rec = read_recording(path)
    assert rec.complete and len(rec.samples) == samples >= 4
    assert rec.header["dropped_bytes"] == 0
    assert rec.decisions and rec.trace_lines  # the window's turns, and as a trace
    if as_json:  # one object, with what the file holds
        doc = json.loads(out)
        assert doc["interrupted"] and doc["samples"] == samples and doc["output"] == str(path)


def test_a_killed_recording_reads_up_to_its_last_flush(
        served: tuple[LiveCluster, str], tmp_path: Path) -> None:
    live, url = served
    path = tmp_path / "incident.jsonl"
    proc = _start_recording(url, path, tmp_path)
    try:
        wait_until(lambda: proc.poll() is not None or _recorded(path) >= 1, 60,
                   "the first sample on disk")
        run_turns(live, "during-kill", 2, seed=9)
        after = _recorded(path) + 1  # a sample taken after the turns (it fetched them)
        wait_until(lambda: proc.poll() is not None or _recorded(path) >= max(4, after), 60,
                   "samples after the turns on disk")
        flushed = _recorded(path)
        proc.kill()
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    rec = read_recording(path)
    assert not rec.complete and len(rec.samples) >= flushed
    assert rec.decisions and rec.trace_lines  # the served turns rebuilt from the decisions
    diag = run_cli({**os.environ, "XDG_RUNTIME_DIR": str(tmp_path)}, "diagnose", "all",
                   "--from", str(path), "--json")
    assert diag.returncode in (0, 1, 2), diag.stderr  # a verdict, not UNKNOWN
    assert 2 <= json.loads(diag.stdout)["samples"] <= len(rec.samples)  # strided by --window
    assert diag.stderr.count("cut short") <= 1  # said once, when a tail was dropped


def test_stop_of_a_launched_cluster_whose_drain_cuts_a_long_turn_exits_1(
        env: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A real launcher with a short --drain-timeout and a long turn in flight (the most
    tokens the server takes: seconds here): stop (called in-process, so its SIGTERM lands at
    once) reports the cut turn and exits 1; the turn was answered 503 (retryable)."""
    from test_launch import Launched, _http, _in_flight

    cluster = Launched(env, free_port(), "--store", str(tmp_path / "store"),
                       "--drain-timeout", "0.2s")
    answers: list[int] = []
    try:
        assert cluster.ready_line.startswith("ready in "), cluster.ready_line
        long_turn = threading.Thread(target=lambda: answers.append(_http(
            f"{cluster.url}/v1/completions", {"model": "tiny", "prompt": list(range(1, 65)),
                                              "max_tokens": 1024, "temperature": 0},
            timeout=120)[0]))
        long_turn.start()
        wait_until(lambda: cluster.proc.poll() is not None or _in_flight(cluster) > 0, 30,
                   "the long turn to be in flight")
        code = main(["stop", "--port", str(cluster.port), "--timeout", "60s"])
        long_turn.join(60)
        out = capsys.readouterr()
        assert code == 1, out.out + out.err
        assert "1 turns cut off by the drain timeout; stopped" in out.out, out.out
        assert answers == [503]
        cluster.finish()
    finally:
        if cluster.proc.poll() is None:
            cluster.kill()


_DRAIN_CUT = """
import signal, sys, time
from dualpath_cli.services import statefile
port = int(sys.argv[1])

def stopped(signum, frame):
    state = statefile.read_state(statefile.state_path(port))
    state.stopped = True
    state.drain = {"drained": 3, "abandoned": 2, "seconds": 0.4}
    statefile.write_state(state)
    sys.exit(0)

signal.signal(signal.SIGTERM, stopped)
print("ready", flush=True)
time.sleep(600)
"""


def test_stop_counts_the_turns_the_drain_cut_off_and_exits_1(env: dict[str, str]) -> None:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", _DRAIN_CUT, str(port)], env=env,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        statefile.write_state(statefile.ClusterState(
            pid=proc.pid, url=f"http://127.0.0.1:{port}", host="127.0.0.1", port=port,
            started_at=time.time(), token_file=str(statefile.token_path(port)),
            pid_start=statefile.process_start_time(proc.pid)))
        done = run_cli(env, "stop", "--port", str(port), "--timeout", "30s")
        assert done.returncode == 1, done.stdout + done.stderr
        assert done.stdout.strip() == ("drained 3 turns in 0.4 s; 2 turns cut off by the "
                                       "drain timeout; stopped")
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
