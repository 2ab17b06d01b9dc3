"""``-o -`` means standard output, in every command with an output option.

Why one helper: ``config init -o -`` wrote stdout while ``trace gen -o -`` wrote a file
named ``-``. Every ``-o/--output`` resolves its value here: ``-`` is stdout (the data goes
there, the command's messages go to stderr, and ``--json``, which also prints on stdout, is
refused with it); an empty value is refused; anything else is a path (``./-`` names a file
called ``-``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from pathlib import Path

from dualpath_cli.errors import UsageError

__all__ = ["STDOUT", "output_path", "write_stdout_lines", "writes_stdout"]

#: The output value that means standard output.
STDOUT = "-"


def writes_stdout(value: str | os.PathLike[str] | None) -> bool:
    """Whether an output option's value means standard output."""
    return value is not None and os.fspath(value) == STDOUT


def output_path(value: str | os.PathLike[str], *, option: str = "-o/--output",
                as_json: bool = False) -> Path | None:
    """The file to write, or ``None`` for standard output.

    Raises:
        UsageError: an empty value, a directory, or ``-`` together with ``--json`` (both
            would be stdout).
    """
    text = os.fspath(value)
    if not text.strip():
        raise UsageError(f"{option}: empty path; name a file, or '-' for stdout")
    if text == STDOUT:
        if as_json:
            raise UsageError(f"{option} - and --json both write stdout; name a file for "
                             f"{option}, or drop --json")
        return None
    if os.path.isdir(text):  # also what a Path option makes of '' ('.')
        raise UsageError(f"{option} {text}: is a directory; name a file, or '-' for stdout")
    return Path(text)


def write_stdout_lines(lines: Iterable[str]) -> None:
    """Write lines (without their newlines) to standard output and flush."""
    out = sys.stdout
    for line in lines:
        out.write(line + "\n")
    out.flush()
