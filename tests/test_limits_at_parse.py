"""Every size limit is checked when the input is parsed, before anything is sized from it.

Issue 34 item 1: ``sim run --pd 99999999999999999999P1D`` built its node groups before the
node-count limit was checked (11 s, about 3 GB, then a MemoryError traceback). Each command
here runs under a 1 GiB address-space cap: an allocation sized from the input would end in
a MemoryError; the refusal is one line and exit 2.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys

import pytest

from dualpath_cli.config.model import parse_pd
from dualpath_cli.errors import UsageError
from dualpath_cli.limits import LimitError

HUGE = "99999999999999999999"
CAP = 2**30

COMMANDS = [
    ["sim", "run", "--pd", f"{HUGE}P1D", "--agents", "4", "--max-len", "1K", "--json"],
    ["sim", "compare", "--pd", f"{HUGE}P1D", "--agents", "4", "--max-len", "1K", "--json"],
    ["sim", "capacity", "--pd", f"{HUGE}P1D", "--json"],
    ["sim", "run", "--pd", "10001P1D", "--agents", "4", "--max-len", "1K"],
    ["sim", "run", "--pd", "1" * 5000 + "P1D", "--agents", "4", "--max-len", "1K"],
    ["tune", "set", "--dry-run", "--pd", f"{HUGE}P1D", "alpha=1K"],
    ["tune", "suggest", "--pd", f"{HUGE}P1D"],
    ["plan", "pd-ratio", "--pd", f"{HUGE}P1D", "--json"],
    ["bench", "--pd", f"{HUGE}P1D"],
    ["sim", "run", "--agents", HUGE, "--max-len", "1K"],
    ["sim", "capacity", "--steps", HUGE],
    ["trace", "gen", "--agents", HUGE, "-o", "unused.jsonl"],
]


def _cap() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (CAP, CAP))


@pytest.mark.e2e
@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(a)[:60])
def test_oversized_shape_or_count_is_one_line_under_a_memory_cap(args: list[str],
                                                                  tmp_path: object) -> None:
    proc = subprocess.run([sys.executable, "-m", "dualpath_cli.cli.app", *args],
                          capture_output=True, text=True, timeout=120, cwd=str(tmp_path),
                          preexec_fn=_cap, env={**os.environ, "NO_COLOR": "1"})
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "MemoryError" not in proc.stderr
    assert not os.path.exists(os.path.join(str(tmp_path), "unused.jsonl"))


def test_parse_pd_checks_the_node_limit() -> None:
    assert parse_pd("48P96D").nodes == 144
    with pytest.raises(LimitError, match="DUALPATH_LIMIT_NODES"):
        parse_pd(f"{HUGE}P1D")
    with pytest.raises(LimitError, match="10,002 exceeds"):
        parse_pd("10001P1D")
    with pytest.raises(UsageError, match="of 5,003 characters"):
        parse_pd("1" * 5000 + "P1D")


def test_node_limit_is_raised_by_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DUALPATH_LIMIT_NODES", "20000")
    assert parse_pd("10001P1D").nodes == 10_002
