"""``dualpath top`` against a real launched cluster with faults injected: the alert appears.

A real ``dualpath launch --inject`` (engine processes over ZeroMQ, the HTTP API), found the
way the command finds it (the state file under a private XDG_RUNTIME_DIR, its token file);
the cockpit polls it through the API client, the alerts panel shows the diagnose rules'
findings for the throttled storage NIC and the fragmented HBM, and a tune through the dialog
reaches the running scheduler and its audit trail.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from test_tui import Pilot, run, screen_text, wait_for, wait_text
from textual.widgets import Input

from dualpath_cli.api.listen import free_port
from dualpath_cli.cli import top_cmd
from dualpath_cli.tui.app import TopApp

CLI = [sys.executable, "-m", "dualpath_cli.cli.app"]
FAULTS = ["hbm_frag:engine=1,stride=4", "snic_throttle:node=1,fraction=0.25"]


@pytest.fixture()
def faulted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A launched 1P2D with the faults on; its URL. Stopped (and its processes gone) after."""
    (tmp_path / "run").mkdir(mode=0o700)
    for key, sub in (("XDG_RUNTIME_DIR", "run"), ("XDG_DATA_HOME", "data"),
                     ("XDG_STATE_HOME", "state")):
        monkeypatch.setenv(key, str(tmp_path / sub))
    monkeypatch.delenv("DUALPATH_URL", raising=False)
    monkeypatch.delenv("DUALPATH_TOKEN", raising=False)
    env = dict(os.environ)
    port = free_port()
    args = [*CLI, "launch", "--port", str(port), "--store", str(tmp_path / "store")]
    for spec in FAULTS:
        args += ["--inject", spec]
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    family = ([c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
              if proc.poll() is None else [])
    try:
        assert line.startswith("ready in "), line + (proc.stderr.read()  # type: ignore[union-attr]
                                                      if proc.poll() is not None else "")
        yield f"http://127.0.0.1:{port}"
        stop = subprocess.run([*CLI, "stop", "--port", str(port)], env=env,
                              capture_output=True, text=True, timeout=120)
        assert stop.returncode == 0, stop.stderr
        proc.communicate(timeout=60)
    finally:
        for pid in [proc.pid, *family]:
            try:
                psutil.Process(pid).kill()
            except psutil.NoSuchProcess:
                pass
        if proc.poll() is None:
            proc.communicate(timeout=10)


def test_injected_faults_show_as_alerts_and_tune_reaches_the_cluster(faulted: str) -> None:
    source = top_cmd.make_source(None, None)  # found through the state file, with its token
    assert source.label == faulted and source.token_id is not None
    app = TopApp(source, interval_s=0.5)

    async def scenario(pilot: Pilot) -> None:
        await wait_text(pilot, "1P2D ready", timeout=30)
        await pilot.press("5")
        await wait_text(pilot, "node D1", timeout=60)  # snic-imbalance: the throttled NIC
        await wait_text(pilot, "engine 1", timeout=60)  # hbm-frag
        text = screen_text(app)
        assert "snic-imbalance" in text and "hbm-frag" in text
        await pilot.press("t")
        await wait_text(pilot, "tune the running scheduler")
        app.screen.query_one("#in-alpha", Input).value = "4K"
        await pilot.press("enter")
        await wait_text(pilot, "-> 4K")
        await pilot.press("y")
        await wait_text(pilot, "scheduler: alpha", timeout=30)
        await pilot.press("escape")
        await wait_for(pilot, lambda: "alpha 4K" in screen_text(app), "the new alpha live",
                       timeout=30)
    run(app, scenario, size=(120, 36))
