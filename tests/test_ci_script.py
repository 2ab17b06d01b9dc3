"""``.ci/run`` runs the README's test command and installs nothing beyond it.

Why: the README's command must pass on a fresh machine as written; CI installing more (a
plugin, an extra) than a developer does once hid a collection error.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _readme_test_command() -> str:
    readme = (ROOT / "README.md").read_text()
    (command,) = re.findall(r"^\s*(pip install -e '\.\[test\]' && .+)$", readme, re.M)
    return command.strip()


def test_ci_runs_the_readmes_command_and_installs_nothing_else() -> None:
    install, tests = (part.strip() for part in _readme_test_command().split("&&"))
    assert (install, tests) == ("pip install -e '.[test]'", "python -m pytest -q")
    script = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines()
              if ln.strip() and not ln.lstrip().startswith("#")]
    installs = [ln for ln in script if re.search(r"\bpip\b.*\binstall\b", ln)]
    assert installs == [f"python -m {install}"], installs
    assert tests in script
    assert script.index(f"python -m {install}") < script.index(tests)
    assert "export DUALPATH_REQUIRE_NATIVE=1" in script
