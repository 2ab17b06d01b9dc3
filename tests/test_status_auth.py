"""``dualpath status`` when the API refuses the token (401/403): the state is not known,
so the exit code is 3 (UNKNOWN) with one line naming the token problem, not 2 (CRITICAL).

Quick: a state file names this test process as the launcher and the client's ``status``
call is replaced by one that raises the client's own auth errors (no server runs)."""

from __future__ import annotations

import json
import os
import time

import pytest

from dualpath_cli.api.client import DualPathClient
from dualpath_cli.api.errors import ApiError, Forbidden, Unauthorized
from dualpath_cli.cli.app import main
from dualpath_cli.services import statefile

PORT = 18131


def _fake_launch() -> None:
    state = statefile.ClusterState(pid=os.getpid(), url=f"http://127.0.0.1:{PORT}",
                                   host="127.0.0.1", port=PORT, started_at=time.time(),
                                   token_file=str(statefile.token_path(PORT)),
                                   pid_start=statefile.process_start_time(os.getpid()))
    statefile.write_state(state)
    fd = os.open(statefile.token_path(PORT), os.O_WRONLY | os.O_CREAT, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write("not-the-token\n")


@pytest.mark.parametrize(("error", "what"), [
    (Unauthorized("http://127.0.0.1:18131: HTTP 401: needs the token", 401), "not sent"),
    (Forbidden("http://127.0.0.1:18131: HTTP 403: does not match", 403), "not the cluster's"),
])
def test_status_refused_token_is_unknown(env: dict[str, str], monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str],
                                         error: ApiError, what: str) -> None:
    _fake_launch()

    def refused(self: DualPathClient) -> None:
        raise error

    monkeypatch.setattr(DualPathClient, "status", refused)
    try:
        assert main(["status"]) == 3
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1, err
        assert what in err and "--token-file" in err and f"HTTP {error.status}" in err
        assert main(["status", "--json"]) == 3
        got = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert got["severity"] == "UNKNOWN" and got["running"] is False
        assert what in got["error"]
    finally:
        statefile.remove_state(PORT)


def test_status_names_a_draining_node(env: dict[str, str], monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    """A node that is leaving gets its own line under the status line (and ``draining``
    in ``--json``); the cluster still runs."""
    from dualpath_cli.telemetry.membership import Membership, NodeMember
    from dualpath_cli.telemetry.status import Status
    from dualpath_cli.telemetry.view import Thresholds

    _fake_launch()
    st = Status(state="ready", pd="1P2D", model="tiny", policy="dualpath",
                engines_healthy=3, engines_total=3, queue={"fifo": 0, "in_flight": 1},
                thresholds=Thresholds(1, 1, 1.05, 0.3, "dualpath"), decisions=0,
                ready_s=1.0, uptime_s=2.0, ready=True,
                membership=Membership("1P2D", "1P2D", (
                    NodeMember("P0", 0, "prefill", "serving", 1, 1),
                    NodeMember("D0", 1, "decode", "draining", 1, 0),
                    NodeMember("D1", 2, "decode", "serving", 1, 1))))
    monkeypatch.setattr(DualPathClient, "status", lambda self: st)
    try:
        assert main(["status"]) == 0
        lines = capsys.readouterr().out.strip().splitlines()
        assert lines[0].startswith("running  1P2D  3/3 engines healthy"), lines
        assert lines[1].startswith("node D0 draining: leaving"), lines
        assert main(["status", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["draining"] == ["D0"]
    finally:
        statefile.remove_state(PORT)
