"""The exit-code contract of check-style commands: 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN.

Why one module: ``status``, ``diagnose`` and ``storage verify`` are run by cron, CI and
monitoring agents that branch on the code (Nagios' convention). A check that cannot look (a
missing path, an unreachable cluster, two clusters and no ``--port``, a bad argument) must
say UNKNOWN (3), never Click's usage code 2, which reads as CRITICAL; and ``--json`` prints
one object whatever happens, the error included, so a log of them keeps the reason.
docs/troubleshooting.md has the table.
"""

from __future__ import annotations

from typing import Any, ClassVar

import typer.core

from dualpath_cli.errors import DualPathError

__all__ = ["EXIT_OK", "EXIT_WARNING", "EXIT_CRITICAL", "EXIT_UNKNOWN", "Unknown",
           "CheckCommand", "emit_unknown"]

EXIT_OK = 0
EXIT_WARNING = 1
EXIT_CRITICAL = 2
EXIT_UNKNOWN = 3


class Unknown(DualPathError):
    """A check could not reach a verdict (bad arguments, nothing to look at, no answer)."""

    exit_code = EXIT_UNKNOWN


def emit_unknown(message: str, **fields: Any) -> None:
    """The one ``--json`` object of a check that could not look (the error line still goes
    to stderr): ``severity`` UNKNOWN, ``exit_code`` 3, ``error``, and the command's own
    empty fields (``fields``) so a reader of the usual object finds its keys."""
    from dualpath_cli.cli.output import emit_json

    emit_json({"severity": "UNKNOWN", "exit_code": EXIT_UNKNOWN, "error": message, **fields})


def _click() -> Any:
    return getattr(typer.core, "_click", None) or __import__("click")  # Typer >= 0.29 vendors it


class CheckCommand(typer.core.TyperCommand):
    """A check-style command: Click's usage errors (exit 2 = CRITICAL) become UNKNOWN (3),
    with the ``--json`` object when ``--json`` was given. ``unknown_fields``: the command's
    own empty fields for that object."""

    unknown_fields: ClassVar[dict[str, Any]] = {}

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        given = list(args)  # Click consumes ``args`` as it parses
        try:
            return super().parse_args(ctx, args)
        except _click().exceptions.UsageError as err:
            err.exit_code = EXIT_UNKNOWN
            if "--json" in given:
                emit_unknown(err.format_message(), **self.unknown_fields)
            raise
