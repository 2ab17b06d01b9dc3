"""docs/cli.md is generated from the Typer app; this fails when it drifts from the code."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer

from dualpath_cli.cli import docgen

ROOT = Path(__file__).resolve().parents[1]


def test_cli_reference_is_up_to_date() -> None:
    expected = docgen.render_cli_markdown()
    actual = (ROOT / docgen.CLI_DOC).read_text(encoding="utf-8")
    assert actual == expected, f"docs/cli.md is stale: run `{docgen.REGENERATE}`"


def test_reference_covers_every_command_and_option() -> None:
    text = docgen.render_cli_markdown()
    for heading in ("## `dualpath`", "#### `dualpath tune alpha`", "#### `dualpath tune beta`",
                    "#### `dualpath plan pd-ratio`", "#### `dualpath plan working-set`",
                    "#### `dualpath plugins list`"):
        assert heading in text
    assert "| `--pd <str>` |" in text
    assert "[required]" in text  # plan working-set --aps


def test_plugin_commands_are_left_out(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    app = typer.Typer()

    @app.command("core")
    def core() -> None:
        """A core command."""

    @app.command("other")
    def other() -> None:
        """Another core command."""

    from dualpath_cli.plugins import manager

    monkeypatch.setitem(manager._INSTALLED_APPS, app, ["other"])
    text = docgen.render_cli_markdown(app)
    assert "`dualpath core`" in text and "`dualpath other`" not in text


@pytest.mark.e2e
def test_check_mode_names_stale_files(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert docgen.main(["--write", "--root", str(tmp_path)]) == 0
    assert docgen.main(["--check", "--root", str(tmp_path)]) == 0
    (tmp_path / docgen.CLI_DOC).write_text("old\n", encoding="utf-8")
    assert docgen.main(["--check", "--root", str(tmp_path)]) == 1
    assert "stale: docs/cli.md" in capsys.readouterr().err
