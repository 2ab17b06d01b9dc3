"""Output helpers shared by every command: data on stdout, messages on stderr.

Human mode renders with rich; ``--json`` prints exactly one JSON object (or JSON Lines for
streams) on stdout. NO_COLOR is honoured by rich itself.
"""

from __future__ import annotations

import errno
import json
import math
import sys
from typing import Any

from rich.console import Console

__all__ = ["OutputConsole", "stdout", "stderr", "emit_json", "to_jsonable", "fail"]


class OutputConsole(Console):
    """A rich console whose closed pipe raises :class:`BrokenPipeError` (rich's own answer
    is a silent exit 1), so the entry point reports it as every lost write
    (:mod:`dualpath_cli.cli.lost_output`)."""

    def on_broken_pipe(self) -> None:
        """Raise, so the console script's guard prints its one line."""
        raise BrokenPipeError(errno.EPIPE, "Broken pipe")


stdout = OutputConsole()
stderr = OutputConsole(stderr=True)


def to_jsonable(value: Any) -> Any:
    """Convert dataclasses, tuples and non-finite floats into plain JSON values."""
    if hasattr(value, "to_dict"):
        return to_jsonable(value.to_dict())
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def emit_json(payload: Any) -> None:
    """Print one JSON document on stdout (no colour, no wrapping)."""
    sys.stdout.write(json.dumps(to_jsonable(payload), sort_keys=False) + "\n")
    sys.stdout.flush()


def fail(message: str) -> None:
    """Print a one-line error on stderr (the caller then exits with its code)."""
    stderr.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)


def warn(message: str) -> None:
    """Print a one-line warning on stderr (the command goes on)."""
    stderr.print(f"[yellow]warning:[/] {message}", markup=True, highlight=False,
                 soft_wrap=True)
