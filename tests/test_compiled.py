"""The scheduler compiled at install (mypyc): used when current, never when its source
changed since, and not at all when ``DUALPATH_PURE_PYTHON=1``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import dualpath_cli
from dualpath_cli import compiled
from dualpath_cli.runtime import scheduler

PACKAGE = Path(dualpath_cli.__file__).resolve().parent
PROBE = ("import dualpath_cli.compiled as c, dualpath_cli.runtime.scheduler as s; "
         "print(c.state()); print(s.__file__)")


def _probe(root: Path | None = None, **env: str) -> tuple[str, str, str]:
    """``(state, the scheduler's file, stderr)`` in a fresh interpreter."""
    run_env = {k: v for k, v in os.environ.items() if k != compiled.PURE_ENV} | env
    if root is not None:
        run_env["PYTHONPATH"] = str(root)
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         env=run_env, cwd=root or Path.cwd(), timeout=120, check=True)
    state, path = out.stdout.strip().splitlines()
    return state, path, out.stderr


def test_the_state_says_how_the_scheduler_was_loaded() -> None:
    assert compiled.state().startswith("compiled") == compiled.is_compiled(scheduler)


def test_the_install_compiled_the_scheduler() -> None:
    """Where a C compiler is, ``pip install`` builds the scheduler with mypyc (a silent
    fallback to Python would leave the benchmarks measuring what no one ships)."""
    if os.environ.get(compiled.PURE_ENV, "") not in ("", "0"):
        pytest.skip(f"{compiled.PURE_ENV} is set")
    if shutil.which("gcc") is None and shutil.which("cc") is None:
        pytest.skip("no C compiler: the install runs the scheduler as Python")
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").exists():
        pytest.skip("no Python headers: the install runs the scheduler as Python")
    assert compiled.is_compiled(scheduler), compiled.state()


def test_pure_python_on_request() -> None:
    state, path, err = _probe(**{compiled.PURE_ENV: "1"})
    assert state.startswith("python") and path.endswith("scheduler.py")
    assert not err  # asked for: nothing to warn about


def test_a_changed_source_runs_as_source_not_as_the_stale_binary(tmp_path: Path) -> None:
    if not compiled.is_compiled(scheduler):
        pytest.skip("the scheduler is not compiled in this install")
    copy = tmp_path / "dualpath_cli"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    state, path, _ = _probe(tmp_path)
    assert state.startswith("compiled") and Path(path).parent == copy / "runtime"
    src = copy / "runtime" / "scheduler.py"
    src.write_text(src.read_text() + "\nEDITED = True\n")
    state, path, err = _probe(tmp_path)
    assert state.startswith("python") and "changed since it was compiled" in state
    assert Path(path) == src
    assert "rebuild: pip install -e ." in err  # one line says why, and what to do
