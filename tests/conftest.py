"""Fixtures shared by the test modules (pytest finds them here by name)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture()
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Private XDG dirs for this test (in-process calls and subprocesses alike), and no
    ``DUALPATH_URL`` from the caller's shell: the environment a CLI subprocess gets.

    Why: a launched cluster's state file, token and logs land under these dirs, so tests
    that launch in parallel never see each other's cluster (or the developer's own).
    """
    values = {"XDG_RUNTIME_DIR": str(tmp_path / "run"), "XDG_DATA_HOME": str(tmp_path / "data"),
              "XDG_STATE_HOME": str(tmp_path / "state")}
    (tmp_path / "run").mkdir(mode=0o700)
    for k, v in values.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("DUALPATH_URL", raising=False)
    return dict(os.environ)
