"""completions/ holds what the app itself prints for each shell; this fails when they drift."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dualpath_cli.cli import docgen

pytestmark = pytest.mark.e2e  # shells and the CLI as subprocesses

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("shell", sorted(docgen.COMPLETION_FILES))
def test_completion_file_matches_the_app(shell: str) -> None:
    expected = docgen.completion_script(shell)
    actual = (ROOT / docgen.COMPLETION_FILES[shell]).read_text(encoding="utf-8")
    assert actual == expected, f"{docgen.COMPLETION_FILES[shell]} is stale: run " \
                               f"`{docgen.REGENERATE}`"
    assert "_DUALPATH_COMPLETE=complete_" in actual


def test_generation_leaves_the_environment_alone() -> None:
    before = os.environ.get(docgen.COMPLETE_VAR)
    docgen.completion_script("bash")
    assert os.environ.get(docgen.COMPLETE_VAR) == before
    with pytest.raises(ValueError, match="unsupported shell"):
        docgen.completion_script("tcsh")


def _complete(words: str, cword: int) -> list[str]:
    env = {**os.environ, "COMP_WORDS": words, "COMP_CWORD": str(cword),
           docgen.COMPLETE_VAR: "complete_bash"}
    done = subprocess.run([sys.executable, "-m", "dualpath_cli.cli.app"], env=env,
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_the_program_answers_completion_requests() -> None:
    """The scripts call the program back with these variables; it must answer."""
    assert _complete("dualpath pl", 1) == ["plan", "plugins"]
    assert "pd-ratio" in _complete("dualpath plan ", 2)


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("dualpath") is None,
                    reason="needs bash and the installed dualpath console script")
def test_bash_script_completes_in_bash() -> None:
    script = ROOT / docgen.COMPLETION_FILES["bash"]
    command = (f"source {script}; COMP_WORDS=(dualpath tu); COMP_CWORD=1; "
               "_dualpath_completion dualpath; echo \"${COMPREPLY[@]}\"")
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["tune"]
