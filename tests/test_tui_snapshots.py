"""Snapshots of every cockpit screen at a fixed size (pytest-textual-snapshot).

The app replays a recording (test_tui's faulted 2P4D), so each picture is the same on every
run: no wall clock, no polling race. Update after an intended change with
``pytest tests/test_tui_snapshots.py --snapshot-update`` and look at the SVGs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_tui import recording

from dualpath_cli.services.recording import read_recording
from dualpath_cli.tui.app import TopApp
from dualpath_cli.tui.source import ReplaySource

SnapCompare = Callable[..., bool]


def _app(tmp_path: Path, **kw: Any) -> TopApp:
    path = recording(tmp_path)
    return TopApp(ReplaySource(read_recording(path), "incident.jsonl"), **kw)


async def _first_frame(pilot: Any) -> None:
    while pilot.app.frames < 1:
        await pilot.pause(0.02)


async def _tune_open(pilot: Any) -> None:
    """Open the tune dialog with its inputs' cursors still (a blinking cursor is a race)."""
    from textual.widgets import Input

    await _first_frame(pilot)
    await pilot.press("t")
    while not pilot.app.screen.query(Input):
        await pilot.pause(0.02)
    for box in pilot.app.screen.query(Input):
        box.cursor_blink = False


def test_tune_snapshot(tmp_path: Path, snap_compare: SnapCompare) -> None:
    assert snap_compare(_app(tmp_path), terminal_size=(100, 30), run_before=_tune_open)


@pytest.mark.parametrize("keys", [
    pytest.param(["1"], id="cluster"), pytest.param(["2"], id="nic"),
    pytest.param(["3"], id="layers"), pytest.param(["4", "down"], id="requests"),
    pytest.param(["5"], id="alerts"), pytest.param(["question_mark"], id="help"),
    pytest.param(["home", "right", "right"], id="replay_scrubbed"),
])
def test_screen_snapshot(keys: list[str], tmp_path: Path,
                         snap_compare: SnapCompare) -> None:
    assert snap_compare(_app(tmp_path), press=keys, terminal_size=(100, 30),
                        run_before=_first_frame)


@pytest.mark.parametrize("key", ["1", "2"])
def test_small_terminal_snapshot(key: str, tmp_path: Path, snap_compare: SnapCompare) -> None:
    assert snap_compare(_app(tmp_path), press=[key], terminal_size=(80, 24),
                        run_before=_first_frame)


def test_ascii_light_snapshot(tmp_path: Path, snap_compare: SnapCompare) -> None:
    assert snap_compare(_app(tmp_path, ascii_only=True, theme="light"), press=["2"],
                        terminal_size=(100, 30), run_before=_first_frame)
