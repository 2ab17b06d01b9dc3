"""Typed errors with the exit code each maps to.

Front-ends catch :class:`DualPathError` and print ``str(err)`` as one line on stderr,
then exit with ``err.exit_code``. Nothing below the CLI ever calls ``sys.exit``.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import TypeVar

__all__ = [
    "pick",
    "EXIT_OK",
    "EXIT_FAILURE",
    "EXIT_USAGE",
    "DualPathError",
    "UsageError",
    "ConfigError",
    "TraceError",
    "UnitError",
    "NoAvailableEngine",
]

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2


class DualPathError(Exception):
    """Base of every error the toolkit reports to a user as one line."""

    exit_code: int = EXIT_FAILURE


class UsageError(DualPathError):
    """A bad command-line argument or value (exit 2)."""

    exit_code = EXIT_USAGE


class UnitError(UsageError, ValueError):
    """A value with a unit that could not be parsed; names the value and accepted forms."""


class ConfigError(UsageError):
    """A bad configuration value; the message names file, line, field and reason."""


class TraceError(UsageError):
    """An unreadable trace file or line; the message names file, line and reason."""


class NoAvailableEngine(DualPathError):
    """No healthy engine can take a request (the seed's NoAvailableEngineError)."""


_T = TypeVar("_T")


def pick(table: Mapping[str, _T], name: str, kind: str,
         error: type[UsageError] = UsageError) -> _T:
    """``table[name]``, or ``error`` naming the closest choice and all of them.

    One rule for every named registry (policies, profiles, codecs): the message reads
    ``unknown KIND 'NAME' (did you mean 'X'?); choose one of: A, B``.
    """
    try:
        return table[name]
    except KeyError:
        close = difflib.get_close_matches(name, list(table), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise error(f"unknown {kind} {name!r}{hint}; choose one of: "
                    f"{', '.join(table)}") from None
