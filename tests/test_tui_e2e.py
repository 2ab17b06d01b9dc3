"""``dualpath top`` against a real launched cluster with faults injected: the alert appears.

A real ``dualpath launch --inject`` (engine processes over ZeroMQ, the HTTP API), found the
way the command finds it (the state file under a private XDG_RUNTIME_DIR, its token file);
the cockpit polls it through the API client, the alerts panel shows the diagnose rules'
findings for the throttled storage NIC and the fragmented HBM, and a tune through the dialog
reaches the running scheduler and its audit trail.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from test_tui import Pilot, run, screen_text, wait_for, wait_text
from textual.widgets import Input

from dualpath_cli.cli import top_cmd
from dualpath_cli.cli.source import ClusterRef
from dualpath_cli.tui.app import TopApp

if TYPE_CHECKING:
    from conftest import Launched

FAULTS = ["hbm_frag:engine=1,stride=4", "snic_throttle:node=1,fraction=0.25"]


@pytest.fixture()
def faulted(launch_cluster: Callable[..., Launched], tmp_path: Path) -> str:
    """A launched 1P2D with the faults on; its URL. Stopped (and its processes gone) after."""
    args = ["--store", str(tmp_path / "store")]
    for spec in FAULTS:
        args += ["--inject", spec]
    return launch_cluster(*args).url


def test_injected_faults_show_as_alerts_and_tune_reaches_the_cluster(faulted: str) -> None:
    source = top_cmd.make_source(ClusterRef(), None)  # found by the state file, with its token
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
