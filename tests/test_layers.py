"""The layer rules hold: every import-linter contract in pyproject.toml is kept.

CI runs `lint-imports` too; this keeps the README's test command honest on its own. On a
failure, import-linter's report (printed to stdout, which pytest shows) names the contract
and the chain of imports that breaks it."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_every_layer_contract_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("importlinter", reason="import-linter is in the test extra")
    from importlinter import configuration
    from importlinter.application import use_cases

    configuration.configure()
    monkeypatch.chdir(ROOT)
    monkeypatch.syspath_prepend(str(ROOT))
    assert use_cases.lint_imports(config_filename=str(ROOT / "pyproject.toml"), cache_dir=None,
                                  no_logo=True)
