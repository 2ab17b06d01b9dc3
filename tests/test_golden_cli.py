"""Golden output: the human rendering of ``sim compare``, ``trace stats`` and ``config show``
at 80 and 120 columns, byte for byte.

Each case runs ``dualpath`` in a fresh interpreter with ``COLUMNS`` fixed, ``NO_COLOR=1``,
no TTY and no user, system or ``DUALPATH_*`` configuration, from tests/golden/inputs/ (so
titles name the input files relatively), and compares stdout with
``tests/golden/<case>_<width>.txt``. A layout change shows here as a diff.

Regenerate after an intended change, then review the diff of tests/golden/::

    DUALPATH_UPDATE_GOLDEN=1 python -m pytest tests/test_golden_cli.py
"""

from __future__ import annotations

import difflib
import os
import subprocess
import sys
from pathlib import Path

import pytest

GOLDEN = Path(__file__).resolve().parent / "golden"
INPUTS = GOLDEN / "inputs"
UPDATE = os.environ.get("DUALPATH_UPDATE_GOLDEN") == "1"
WIDTHS = (80, 120)

#: case name -> arguments after ``dualpath``; inputs are relative to tests/golden/inputs/.
CASES: dict[str, list[str]] = {
    "sim_compare": ["sim", "compare", "--agents", "8", "--max-len", "32K"],
    "trace_stats": ["trace", "stats", "trace.jsonl"],
    "trace_stats_mooncake": ["trace", "stats", "mooncake.jsonl"],
    "config_show": ["config", "show", "--set", "scheduler.alpha=8KiB"],
    "config_show_paper": ["config", "show", "--preset", "paper"],
}


def _env(width: int, home: Path) -> dict[str, str]:
    """The environment of one run: fixed width, no colour, nothing configured."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DUALPATH_", "XDG_", "COLUMNS", "LINES", "FORCE_COLOR",
                                "TTY_COMPATIBLE", "TTY_INTERACTIVE"))}
    env.update({"COLUMNS": str(width), "NO_COLOR": "1", "TERM": "dumb", "HOME": str(home),
                "DUALPATH_CONFIG_HOME": str(home / "config"),
                "DUALPATH_SYSTEM_CONFIG": str(home / "system.yaml")})
    return env


def render(args: list[str], width: int, home: Path) -> str:
    """stdout of ``dualpath ARGS`` at ``width`` columns (fails on a non-zero exit)."""
    proc = subprocess.run([sys.executable, "-m", "dualpath_cli.cli.app", *args],
                          cwd=INPUTS, env=_env(width, home), capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.e2e
def test_human_output_matches_golden(case: str, width: int, tmp_path: Path) -> None:
    out = render(CASES[case], width, tmp_path)
    path = GOLDEN / f"{case}_{width}.txt"
    if UPDATE or not path.exists():
        if not UPDATE:
            pytest.fail(f"{path.name} is missing: run DUALPATH_UPDATE_GOLDEN=1 python -m pytest "
                        f"{Path(__file__).name}")
        path.write_text(out, encoding="utf-8")
    want = path.read_text(encoding="utf-8")
    diff = "".join(difflib.unified_diff(want.splitlines(keepends=True),
                                        out.splitlines(keepends=True),
                                        f"golden/{path.name}", "now"))
    assert out == want, (f"`dualpath {' '.join(CASES[case])}` at {width} columns changed; "
                         "if intended, run DUALPATH_UPDATE_GOLDEN=1 python -m pytest "
                         f"tests/test_golden_cli.py and review the diff:\n{diff}")


#: Lines printed with soft wrap (prose the terminal wraps), exempt from the width check.
_PROSE = ("alpha:", "beta:", "compute_quota:")


@pytest.mark.parametrize("case", sorted(CASES))
def test_nothing_is_cropped_at_80_columns(case: str) -> None:
    """At 80 columns every table line fits the terminal (rich crops what does not fit)."""
    lines = (GOLDEN / f"{case}_80.txt").read_text(encoding="utf-8").splitlines()
    wide = [line for line in lines if len(line.rstrip()) > 80 and not line.startswith(_PROSE)]
    assert lines and not wide
