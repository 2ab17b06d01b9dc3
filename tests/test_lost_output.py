"""Standard output that cannot be written ends in one line on stderr and exit 1.

Issue 34 item 2: ``dualpath config show --json > /dev/full`` (and ``--version``, ``plan
pd-ratio --json``, ``tune alpha ...``, ``config init -o -``) ended in an OSError traceback;
a closed pipe ended in Click's silent exit 1. Both console scripts run through
``cli/lost_output.guard_stdout``.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from dualpath_cli.cli.lost_output import guard_stdout, is_lost_output

COMMANDS = [
    ["dualpath", "config", "show", "--json"],
    ["dualpath", "config", "show"],
    ["dualpath", "--version"],
    ["dualpath", "--help"],
    ["dualpath", "plan", "pd-ratio", "--json"],
    ["dualpath", "tune", "alpha", "--window", "1", "--model", "ds660b"],
    ["dualpath", "config", "init", "-o", "-"],
    ["dualpath", "trace", "gen", "--agents", "3", "-o", "-"],
    ["dualpath-monitor", "--help"],
]

_SCRIPTS = {"dualpath": "dualpath_cli.cli.app", "dualpath-monitor": "dualpath_cli.cli.monitor_cmd"}


def _run(argv: list[str], stdout: int, cwd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", _SCRIPTS[argv[0]], *argv[1:]], stdout=stdout,
                          stderr=subprocess.PIPE, text=True, timeout=120,
                          env={**os.environ, "NO_COLOR": "1"}, cwd=cwd)


def _assert_one_line(proc: subprocess.CompletedProcess[str], reason: str) -> None:
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert proc.stderr == f"error: cannot write standard output: {reason}\n", proc.stderr[-2000:]


@pytest.mark.e2e
@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
@pytest.mark.parametrize("argv", COMMANDS, ids=" ".join)
def test_full_stdout_is_one_line_and_exit_1(argv: list[str], tmp_path: Path) -> None:
    fd = os.open("/dev/full", os.O_WRONLY)
    try:
        _assert_one_line(_run(argv, fd, str(tmp_path)), "No space left on device")
    finally:
        os.close(fd)


@pytest.mark.e2e
@pytest.mark.parametrize("argv", COMMANDS, ids=" ".join)
def test_closed_pipe_is_one_line_and_exit_1(argv: list[str], tmp_path: Path) -> None:
    read, write = os.pipe()
    os.close(read)
    try:
        _assert_one_line(_run(argv, write, str(tmp_path)), "Broken pipe")
    finally:
        os.close(write)
    assert not list(tmp_path.iterdir())  # "-" is stdout, never a file named "-"


def _raising(err: BaseException) -> Callable[[], int]:
    def main() -> int:
        raise err
    return main


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EPIPE, errno.EIO])
def test_guard_reports_each_lost_write(code: int, capsys: pytest.CaptureFixture[str]) -> None:
    assert guard_stdout(_raising(OSError(code, os.strerror(code))))() == 1
    assert capsys.readouterr().err == f"error: cannot write standard output: {os.strerror(code)}\n"


def test_guard_leaves_other_errors_alone() -> None:
    named = OSError(errno.ENOSPC, "No space left on device", "/store/block")
    assert not is_lost_output(named)  # a named file's error is the command's to report
    with pytest.raises(OSError):
        guard_stdout(_raising(named))()
    with pytest.raises(SystemExit):
        guard_stdout(_raising(SystemExit(1)))()  # an exit 1 not caused by a lost write
    assert guard_stdout(lambda: 3)() == 3
