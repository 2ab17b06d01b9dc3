"""Fuzz every ``dualpath`` command's arguments: success or one clean line, never a traceback
or a hang (tests/fuzzing.py has the harness and the verdict rules)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fuzzing import Sandbox, argv_strategy, commands, run_cli, stubbed
from hypothesis import HealthCheck, given, settings

#: Cases per command in CI (the long run is bench/reliability.py --long).
CI_CASES = 10


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    sandbox = Sandbox.create(tmp_path_factory.mktemp("fuzz"))
    with stubbed():
        yield sandbox
    sandbox.close()


#: The commands whose fuzzed lines can start engine processes or a server: e2e cases.
STARTS_PROCESSES = {"bench", "launch"}


@pytest.mark.parametrize("command", [
    pytest.param(c, marks=pytest.mark.e2e) if c.words[0] in STARTS_PROCESSES else c
    for c in commands()], ids=lambda c: " ".join(c.words))
def test_every_command_line_ends_cleanly(command, box: Sandbox) -> None:  # type: ignore[no-untyped-def]
    @settings(max_examples=CI_CASES, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(argv_strategy(command, box))
    def case(argv: list[str]) -> None:
        outcome = run_cli(argv, box)
        assert outcome.ok, outcome.describe()

    case()


def test_the_harness_sees_a_traceback(box: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    """The verdict can fail: an uncaught error inside a command is reported, not passed."""
    import dualpath_cli.config as config

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(config, "load_config", broken)
    outcome = run_cli(["config", "show"], box)
    assert not outcome.ok and "RuntimeError" in outcome.reason


def test_the_harness_sees_a_hang(box: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    import dualpath_cli.config as config

    monkeypatch.setattr(config, "load_config",
                        lambda *a, **k: threading.Event().wait(10))
    outcome = run_cli(["config", "show"], box, deadline_s=0.3)
    assert not outcome.ok and outcome.reason.startswith("hang")


def test_sandbox_paths_exist(box: Sandbox) -> None:
    assert Path(box.env["XDG_RUNTIME_DIR"]).is_dir()
