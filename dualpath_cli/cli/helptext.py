"""Help texts as paragraphs: a docstring's line breaks do not reach the terminal.

Why: Typer's rich help keeps the single line breaks of a command's description after its
first paragraph, so a docstring wrapped at 100 columns broke mid-sentence in an 80-column
terminal ("...full-block prefix it / starts with"). :func:`reflow` joins each paragraph's
lines; a list item (``* ``, ``- ``, ``1. ``) starts a line of its own, an indented block (an
example) and a ``\\b`` paragraph (click's "do not rewrap") stay as written.
tests/test_cli_help_markup.py renders every command's help at 80 columns to check it.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

__all__ = ["reflow", "reflow_command"]

_ITEM = re.compile(r"([*•-]|\d+\.) ")


def _paragraph(text: str) -> str:
    lines = text.split("\n")
    if text.startswith("\b") or all(line.startswith(" ") for line in lines):
        return text
    out: list[str] = []
    for line in lines:
        if not out or _ITEM.match(line):
            out.append(line.rstrip())
        else:
            out[-1] += " " + line.strip()
    return "\n".join(out)


def reflow(text: str | None) -> str | None:
    """``text`` (a docstring or a help string) with each paragraph's lines joined."""
    if not text:
        return text
    head, mark, tail = inspect.cleandoc(text).partition("\f")  # click: after \f is hidden
    return "\n\n".join(_paragraph(p) for p in head.split("\n\n")) + mark + tail


def reflow_command(command: Any) -> Any:
    """Reflow ``command``'s help and its options' help, and its sub-commands' (in place);
    ``command`` is any click Command (a Group has ``commands``, an Option ``help``)."""
    command.help = reflow(command.help)
    for param in getattr(command, "params", ()):
        if getattr(param, "help", None):
            param.help = reflow(param.help)
    for sub in getattr(command, "commands", {}).values():
        reflow_command(sub)
    return command
