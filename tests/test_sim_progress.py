"""Long simulator commands show how far they are on a terminal, and stop cleanly on Ctrl-C.

The simulator reports through a callback every simulated second (sim/progress.py), which
changes nothing about the run; the CLI draws a bar on stderr only on a terminal and never
with --json; a Ctrl-C prints one line and exits 130.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import threading
from pathlib import Path

import pytest
from conftest import CLI, wait_until
from rich.console import Console

from dualpath_cli.cli import output
from dualpath_cli.cli.app import main
from dualpath_cli.sim import (
    RunProgress,
    make_setup,
    simulate_capacity,
    simulate_offline,
    simulate_online,
    synthetic_plans,
)

_WALL = ("wall_s", "turns_per_s")  # wall-clock figures, the only ones that may differ


def _same(a: dict[str, object], b: dict[str, object]) -> bool:
    return ({k: v for k, v in a.items() if k not in _WALL}
            == {k: v for k, v in b.items() if k not in _WALL})


def test_reports_change_nothing_about_a_run() -> None:
    setup = make_setup("ds27b", "1P1D", "dualpath")
    plans = synthetic_plans(8000, 16, 1)
    reports: list[RunProgress] = []
    plain = simulate_offline(setup, plans)
    told = simulate_offline(setup, plans, progress=reports.append)
    assert _same(plain.to_dict(), told.to_dict())  # events included: ticks are not counted
    assert len(reports) >= int(told.sim_time) - 1 > 0  # one per simulated second
    fractions = [r.fraction for r in reports]
    assert fractions == sorted(fractions) and 0 < fractions[-1] <= 1
    assert reports[-1].turns_total == told.turns
    online: list[RunProgress] = []
    plans = synthetic_plans(8000, 100, 1)
    a = simulate_online(setup, 0.5, horizon=60, plans=plans, early_stop=False)
    b = simulate_online(setup, 0.5, horizon=60, plans=plans, early_stop=False,
                        progress=online.append)
    assert _same(a.to_dict(), b.to_dict())
    assert online and all(r.horizon_s == 60 for r in online)
    assert online[-1].fraction == pytest.approx(online[-1].sim_s / 60)


def test_capacity_reports_each_probe_as_a_run() -> None:
    setup = make_setup("ds27b", "1P1D", "dualpath")
    reports: list[RunProgress] = []
    res = simulate_capacity(setup, lo=0.05, hi=0.2, horizon=60, steps=1,
                            plans=synthetic_plans(8000, 200, 1), progress=reports.append)
    runs = sorted({r.run for r in reports})
    assert runs == list(range(len(res.probes)))
    assert all(r.runs == 3 and r.label.startswith(f"probe {r.run + 1}: ") for r in reports)


@pytest.fixture
def terminal(monkeypatch: pytest.MonkeyPatch, clean_config: Path) -> io.StringIO:
    """stderr as a terminal (what a user at a shell has), captured."""
    buf = io.StringIO()
    monkeypatch.setattr(output, "stderr", Console(file=buf, force_terminal=True, width=120))
    return buf


def test_a_terminal_shows_progress(terminal: io.StringIO,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", "compare", "--model", "ds27b", "--pd", "1P1D", "--agents", "16",
                 "--max-len", "8K", "--policies", "basic,dualpath"]) == 0
    drawn = terminal.getvalue()
    assert "sim compare: " in drawn and "%" in drawn  # the bar, labelled with a policy
    assert "sim compare" not in capsys.readouterr().out  # the table alone on stdout


def test_json_and_a_pipe_show_none(terminal: io.StringIO,
                                   capsys: pytest.CaptureFixture[str],
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    assert main(["sim", "run", "--model", "ds27b", "--pd", "1P1D", "--agents", "16",
                 "--max-len", "8K", "--json"]) == 0
    assert terminal.getvalue() == ""
    assert json.loads(capsys.readouterr().out)["turns"] > 0
    pipe = io.StringIO()
    monkeypatch.setattr(output, "stderr", Console(file=pipe))  # not a terminal
    assert main(["sim", "run", "--model", "ds27b", "--pd", "1P1D", "--agents", "16",
                 "--max-len", "8K"]) == 0
    assert pipe.getvalue() == ""


@pytest.mark.e2e  # a long `sim capacity` as a subprocess, interrupted
def test_ctrl_c_stops_a_long_capacity_search_with_one_line(tmp_path: Path) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    # a terminal for rich (the bar tells the test the search is running), own temp dir
    env = {**os.environ, "TTY_COMPATIBLE": "1", "TMPDIR": str(tmp), "COLUMNS": "120",
           "XDG_RUNTIME_DIR": str(tmp_path)}
    proc = subprocess.Popen(
        [*CLI, "sim", "capacity", "--model", "ds660b", "--pd", "4P8D"], env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        # a shell's background job inherits SIGINT ignored; a user's Ctrl-C is not
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    err: list[str] = []
    assert proc.stderr is not None
    reader = threading.Thread(target=lambda: err.extend(iter(
        lambda: proc.stderr.read(256), "")), daemon=True)  # type: ignore[union-attr]
    reader.start()
    try:
        wait_until(lambda: proc.poll() is not None or "probe 1" in "".join(err), 120,
                   "the search's progress")
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
        reader.join(timeout=30)  # stderr to its end (the reader alone reads it)
        assert proc.stdout is not None
        out = proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", "".join(err))
    assert proc.returncode == 130, text
    lines = [ln for ln in text.replace("\r", "\n").splitlines()
             if ln.strip() and "━" not in ln and "probe" not in ln]
    assert lines == [lines[0]] and lines[0].startswith("interrupted: sim capacity stopped"), text
    assert "Traceback" not in text and out == ""
    assert not list(tmp.iterdir())  # no temp files left behind
