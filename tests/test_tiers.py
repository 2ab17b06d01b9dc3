"""The test tiers' guard (tests/tiers.py): a quick test that starts a process or a server
fails; an ``e2e`` test may; one-shot helpers such as git are fine everywhere."""

from __future__ import annotations

import multiprocessing
import shutil
import socket
import subprocess
import sys

import pytest
from tiers import StartsAProcess, refused_starts


def test_a_quick_test_may_not_start_a_process_or_a_server() -> None:
    with refused_starts() as refused:
        with pytest.raises(StartsAProcess, match="not marked e2e"):
            subprocess.run([sys.executable, "-c", "pass"], check=True)
        with pytest.raises(StartsAProcess, match="starts the process"):
            multiprocessing.get_context("spawn").Process(target=print).start()
        with socket.socket() as sock, pytest.raises(StartsAProcess, match="listens"):
            sock.bind(("127.0.0.1", 0))
            sock.listen()
    assert len(refused) == 3, refused


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_a_quick_test_may_run_git() -> None:
    assert subprocess.run(["git", "--version"], capture_output=True).returncode == 0


@pytest.mark.e2e
def test_an_e2e_test_may_start_a_process() -> None:
    subprocess.run([sys.executable, "-c", "pass"], check=True)
