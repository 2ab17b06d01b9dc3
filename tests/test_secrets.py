"""No secret in logs, ``config show``, recordings, outputs, error messages or command lines.

One launched cluster (``dualpath launch --detach --curve on``: a real launcher, its engines
and the CURVE key pair) in private XDG directories. Requests are made with no token, a
wrong token and the right one (a change, a refused change, an OpenAI call, errors), the
commands an operator runs are run (``status --json``, ``record``, ``config show`` with the
token in the environment, ``explain`` of a missing id, ``bench --url`` with a wrong token),
and the cluster is stopped. Then every file under the test's directories (state, runtime
and data dirs: the launcher's log, the store, the recording), every output and error
message, and the command line and environment of every process of the cluster are searched
for the token and the CURVE secret key. The token file and the key file hold them by
design (mode 0600) and are the only exceptions; the join answer carries the secret to an
authenticated node by design (an API response, not a log; tests/test_multinode.py).
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import pytest
from conftest import CLI, all_gone, wait_until

from dualpath_cli.api.listen import free_port
from dualpath_cli.services import statefile

pytestmark = pytest.mark.e2e  # launched clusters


def _http(method: str, url: str, body: Any = None, token: str | None = None
          ) -> tuple[int, str]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, resp.read().decode(errors="replace")
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace")


def _forms(secret: str) -> list[str]:
    """The secret and the halves of it a partial leak would show."""
    half = len(secret) // 2
    return [secret, secret[:half], secret[half:]]


def test_no_secret_in_logs_outputs_recordings_or_command_lines(tmp_path: Path) -> None:
    env = dict(os.environ)
    env.pop("DUALPATH_URL", None)
    env.pop("DUALPATH_TOKEN", None)
    (tmp_path / "run").mkdir(mode=0o700)
    env.update({"XDG_RUNTIME_DIR": str(tmp_path / "run"), "XDG_DATA_HOME": str(tmp_path / "data"),
                "XDG_STATE_HOME": str(tmp_path / "state"),
                "XDG_CONFIG_HOME": str(tmp_path / "config"),
                "DUALPATH_CONFIG_HOME": str(tmp_path / "config")})
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    outputs: list[str] = []

    def run(*args: str, extra: dict[str, str] | None = None, timeout: float = 300
            ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([*CLI, *args], env={**env, **(extra or {})},
                              capture_output=True, text=True, timeout=timeout,
                              cwd=tmp_path)
        outputs.extend([done.stdout, done.stderr])
        return done

    up = run("launch", "--detach", "--port", str(port), "--store", str(tmp_path / "store"),
             "--curve", "on")
    assert up.returncode == 0, up.stdout + up.stderr
    state = json.loads((tmp_path / "run" / "dualpath" / f"cluster-{port}.json").read_text())
    family = [state["pid"]]
    try:
        family += [c.pid for c in psutil.Process(state["pid"]).children(recursive=True)]
        token_file = Path(state["token_file"])
        token = token_file.read_text().strip()
        key_file = tmp_path / "run" / "dualpath" / f"curve-{port}.key"
        curve_secret = json.loads(key_file.read_text())["secret"]
        assert len(token) >= 32 and len(curve_secret) == 40
        secrets = {"token": token, "CURVE secret": curve_secret}

        # every process of the cluster: nothing secret in its command line or environment
        for pid in family:
            proc = psutil.Process(pid)
            seen = " ".join(proc.cmdline()) + " " + json.dumps(proc.environ())
            for name, value in secrets.items():
                assert value not in seen, f"{name} in the command line/env of pid {pid}"

        # requests: no token, a wrong one (the right one with a character changed, and a
        # longer one), the right one; changes accepted and refused; OpenAI calls; errors
        wrong = token[:-1] + ("A" if token[-1] != "A" else "B")
        answers = [
            _http("PATCH", f"{url}/api/v1/scheduler", {"alpha": "2K"}),
            _http("PATCH", f"{url}/api/v1/scheduler", {"alpha": "2K"}, wrong),
            _http("PATCH", f"{url}/api/v1/scheduler", {"alpha": "2K"}, token + "x"),
            _http("PATCH", f"{url}/api/v1/scheduler", {"alpha": "2K"}, token),
            _http("PATCH", f"{url}/api/v1/scheduler", {"alpha": "nonsense"}, token),
            _http("PATCH", f"{url}/api/v1/faults", {"faults": ["bogus:x=1"]}, token),
            _http("PATCH", f"{url}/api/v1/faults", {"faults": ["slow_compute:engine=1,factor=1"]},
                  token),
            _http("DELETE", f"{url}/api/v1/faults", None, token),
            _http("POST", f"{url}/api/v1/store/replicate", {"blocks": ["ab" * 16]}, token),
            _http("POST", f"{url}/api/v1/join", {"node": "n1", "role": "decode", "gpus": 1},
                  wrong),
            _http("POST", f"{url}/v1/completions", {"model": "tiny", "prompt": "hello",
                                                    "max_tokens": 3}, token),
            _http("POST", f"{url}/v1/completions", {"model": "tiny", "prompt": [10**9],
                                                    "max_tokens": 3}, wrong),
            _http("GET", f"{url}/api/v1/requests/999999", None, token),
            _http("GET", f"{url}/api/v1/status", None, wrong),
            _http("GET", f"{url}/metrics", None, token),
        ]
        codes = [code for code, _ in answers]
        assert codes[:4] == [401, 403, 403, 200], answers[:4]
        assert 422 in codes and 404 in codes
        outputs.extend(text for _, text in answers)

        # the operator's commands, with the token in the environment where one is read
        assert run("status", "--json").returncode == 0
        shown = run("config", "show", extra={"DUALPATH_TOKEN": token})
        assert shown.returncode == 0, shown.stderr
        assert run("config", "show", "--json", extra={"DUALPATH_TOKEN": token}).returncode == 0
        recording = tmp_path / "rec.jsonl"
        rec = run("record", "-w", "2s", "-i", "250ms", "-o", str(recording))
        assert rec.returncode == 0, rec.stderr
        assert recording.stat().st_size > 0
        missing = run("explain", "999999", "--url", url)
        assert missing.returncode != 0 and missing.stderr.strip()
        remote = run("bench", "--url", url, "--agents", "1", "--turns", "1",
                     extra={"DUALPATH_TOKEN": wrong})
        outputs.append(remote.stdout + remote.stderr)
        for bad in (["status", "--url", "http://127.0.0.1:1"],
                    ["explain", "1", "--url", url + "/nope"]):
            assert run(*bad).returncode != 0

        stopped = run("stop", "--timeout", "60s")
        assert stopped.returncode == 0, stopped.stderr
        wait_until(lambda: all_gone(family), 60, "the cluster's processes to exit")
    finally:
        for pid in family:
            try:
                psutil.Process(pid).kill()
            except psutil.NoSuchProcess:
                pass

    log = tmp_path / "run" / "dualpath" / f"launch-{port}.log"
    assert log.exists() and log.stat().st_size > 0  # the launcher's log is searched below
    by_design = {token_file.resolve(), key_file.resolve()}
    searched = 0
    for base, _dirs, files in os.walk(tmp_path):
        for name in files:
            path = Path(base, name)
            if path.is_symlink() or path.resolve() in by_design:
                continue
            raw = path.read_bytes()
            if name.endswith(".gz"):
                raw = gzip.decompress(raw)
            searched += 1
            for what, value in secrets.items():
                for form in _forms(value):
                    assert form.encode() not in raw, f"the {what} is in {path}"
    assert searched >= 3
    text = "\n".join(outputs)
    for what, value in secrets.items():
        for form in _forms(value):
            assert form not in text, f"the {what} is in a command's output or an answer"
    # the wrong tokens sent are not echoed either (a near-miss is as good as the token)
    assert wrong not in text and token + "x" not in text


@pytest.mark.parametrize("value", ["s3cret-value-123", "A" * 43])
def test_config_show_never_prints_a_token_from_the_environment(
        value: str, tmp_path: Path) -> None:
    env = {**os.environ, "DUALPATH_TOKEN": value, "DUALPATH_CONFIG_HOME": str(tmp_path)}
    for args in (["config", "show"], ["config", "show", "--json"]):
        done = subprocess.run([*CLI, *args], env=env, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr
        assert value not in done.stdout + done.stderr


def test_the_state_file_names_the_token_file_but_never_holds_the_token(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The state file names the token file (clients need it) and never holds the token."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    from dualpath_cli.api.auth import TokenAuth

    auth = TokenAuth.generate(statefile.token_path(1234))
    state = statefile.ClusterState(pid=os.getpid(), url="http://127.0.0.1:1234",
                                   host="127.0.0.1", port=1234, started_at=time.time(),
                                   token_file=str(auth.path))
    statefile.write_state(state)
    assert auth.token not in state.path.read_text()


def test_a_join_plan_never_shows_the_curve_secret_in_its_repr() -> None:
    """The join answer carries the CURVE secret to an authenticated node by design; the plan
    object holding it must not print it (a log line, an error, a traceback's locals)."""
    from dualpath_cli.cluster.join import JoinPlan
    from dualpath_cli.transfer.curve import CurveKeys

    keys = CurveKeys.generate()
    plan = JoinPlan(name="n1", node=1, role="decode", engine_ids=[3], ctl="tcp://h:1",
                    store=None, model="tiny", block_tokens=8, hbm_blocks=4, codec="fp16",
                    dram_cache_bytes=0, quota_s=0.3, flops_rate=1e9, heartbeat_s=1.0,
                    fetch_s=0.1, snic_bw=1e8, cnic_bw=1e8, curve_public=keys.public,
                    curve_secret=keys.secret)
    for text in (repr(plan), str(plan), repr(keys), f"{plan}"):
        assert keys.secret not in text
    assert plan.to_dict()["curve_secret"] == keys.secret  # the answer still carries it
    assert JoinPlan.from_dict(plan.to_dict()).curve_secret == keys.secret
