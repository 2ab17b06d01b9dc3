"""The way a person uses ``dualpath top``: in a real terminal (tmux), keys in, screen out.

tmux runs ``dualpath top --from FILE`` (a recording, so no cluster is needed), ``send-keys``
moves between screens and ``capture-pane`` must show each screen's text; ``q`` ends it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import wait_until
from test_tui import recording

TMUX = shutil.which("tmux")
pytestmark = [pytest.mark.e2e,  # dualpath top in tmux
              pytest.mark.skipif(TMUX is None, reason="tmux is not installed (apt-get install "
                                 "tmux); the terminal smoke test needs a real terminal")]


class Terminal:
    """One tmux server on a private socket with one session."""

    def __init__(self, socket: Path) -> None:
        self.socket = socket  # under tmp_path: removed with it, no server shared with anyone

    def tmux(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        assert TMUX is not None
        return subprocess.run([TMUX, "-S", str(self.socket), "-f", "/dev/null", *args],
                              capture_output=True, text=True, timeout=30, check=check)

    def screen(self) -> str:
        done = self.tmux("capture-pane", "-p", "-t", "top", check=False)
        return done.stdout

    def alive(self) -> bool:
        return self.tmux("has-session", "-t", "top", check=False).returncode == 0

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", "top", *keys)

    def wait(self, text: str, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            screen = self.screen()
            if text in screen:
                return screen
            if time.monotonic() > deadline or not self.alive():
                raise AssertionError(f"{text!r} not on the terminal:\n{screen}")
            time.sleep(0.1)  # polling a terminal for a condition, with a deadline


@pytest.fixture()
def terminal(tmp_path: Path) -> Iterator[Terminal]:
    term = Terminal(tmp_path / "tmux.sock")
    try:
        yield term
    finally:
        term.tmux("kill-server", check=False)


def test_top_in_tmux_moves_between_screens(tmp_path: Path, terminal: Terminal) -> None:
    rec = recording(tmp_path)
    cmd = f"{sys.executable} -m dualpath_cli.cli.app top --from {rec} --ascii"
    env = {**os.environ, "TERM": "xterm-256color"}
    assert TMUX is not None
    subprocess.run([TMUX, "-S", str(terminal.socket), "-f", "/dev/null", "new-session", "-d",
                    "-s", "top", "-x", "100", "-y", "30", cmd], env=env, check=True,
                   timeout=30)
    screen = terminal.wait("cluster  2P4D ready")
    assert "long-rq" in screen and "overloaded" in screen and "replay" in screen
    terminal.keys("2")
    terminal.wait("DE storage NIC")
    terminal.keys("3")
    terminal.wait("slack median")
    terminal.keys("4")
    terminal.wait("decision #")
    terminal.keys("5")
    screen = terminal.wait("snic-imbalance")
    assert "CRITICAL" in screen
    terminal.keys("Home")
    terminal.wait("1/20")
    terminal.keys("?")
    terminal.wait("dualpath top: keys")
    terminal.keys("Escape")
    terminal.wait("12345 screens")  # the help closed (a lone Escape, not ESC q = alt+q)
    wait_until(lambda: "dualpath top: keys" not in terminal.screen(), 30, "the help to close",
               interval=0.1)
    terminal.keys("q")
    wait_until(lambda: not terminal.alive(), 30, "dualpath top to quit", interval=0.1)
