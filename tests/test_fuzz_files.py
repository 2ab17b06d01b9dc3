"""Fuzz the files users hand us: config files (``config validate``) and traces in both formats
(``trace stats``). Each ends in success or one clean line (tests/fuzzing.py)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
from fuzzing import Sandbox, config_text_strategy, run_cli, stubbed, trace_bytes_strategy
from hypothesis import HealthCheck, given, settings

#: Cases per target in CI (bench/reliability.py --long runs thousands).
CI_CASES = 40
_names = itertools.count()


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    sandbox = Sandbox.create(tmp_path_factory.mktemp("fuzz-files"))
    with stubbed():
        yield sandbox
    sandbox.close()


def _check(box: Sandbox, head: list[str], data: bytes) -> None:
    path = box.root / f"case-{next(_names)}"
    path.write_bytes(data)
    try:
        outcome = run_cli([*head, str(path)], box)
    finally:
        path.unlink()
    assert outcome.ok, outcome.describe()


_SETTINGS = settings(max_examples=CI_CASES, deadline=None, database=None, derandomize=True,
                     suppress_health_check=list(HealthCheck))


@pytest.mark.parametrize("as_json", [False, True])
def test_config_files(box: Sandbox, as_json: bool) -> None:
    @_SETTINGS
    @given(config_text_strategy())
    def case(data: bytes) -> None:
        _check(box, ["config", "validate", *(["--json"] if as_json else [])], data)

    case()


@pytest.mark.parametrize("as_json", [False, True])
def test_trace_files(box: Sandbox, as_json: bool) -> None:
    @_SETTINGS
    @given(trace_bytes_strategy())
    def case(data: bytes) -> None:
        _check(box, ["trace", "stats", *(["--json"] if as_json else [])], data)

    case()


def test_a_valid_config_is_valid(box: Sandbox) -> None:
    outcome = run_cli(["config", "validate", str(box.root / "cfg.yaml")], box)
    assert outcome.ok and outcome.exit_code == 0, outcome.describe()
