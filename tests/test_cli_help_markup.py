"""Help texts survive Rich markup: ``--help`` renders with ``rich_markup_mode="rich"``, where
a bracketed phrase such as ``[default: hopper]`` is read as a style tag and silently dropped
(``tune suggest --help`` printed "a model profile ." for "[default: hopper]")."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import click
import typer.main
from rich.text import Text

from dualpath_cli.cli.app import app


def _commands(command: Any, ctx: click.Context) -> Iterator[tuple[str, Any]]:
    yield ctx.command_path, command
    if hasattr(command, "list_commands"):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is not None:
                yield from _commands(sub, sub.context_class(sub, info_name=name, parent=ctx))


def _swallowed(text: str) -> bool:
    """True when Rich's markup parser would drop part of ``text`` as a tag."""
    return Text.from_markup(text).plain != text


def test_no_help_text_loses_a_bracketed_phrase_to_rich_markup() -> None:
    root = typer.main.get_command(app)
    bad: list[str] = []
    for path, command in _commands(root, root.context_class(root, info_name="dualpath")):
        if command.help and _swallowed(command.help):
            bad.append(f"{path}: {command.help[:60]!r}")
        for param in command.params:
            text = getattr(param, "help", None)
            if text and _swallowed(text):
                bad.append(f"{path} {param.name}: {text!r}")
    assert not bad, "help text Rich would eat (write '(default: ...)'):\n" + "\n".join(bad)


def test_the_check_catches_a_default_in_brackets() -> None:
    assert _swallowed("Hardware profile [default: hopper].")
    assert not _swallowed("Hardware profile (default: hopper).")
