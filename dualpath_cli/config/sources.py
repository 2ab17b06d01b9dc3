"""Where an effective configuration value came from, and how errors point at it.

Labels (``str(source)``): ``default``, ``preset:NAME``, ``profile:NAME``,
``system:PATH:LINE``, ``user:PATH:LINE``, ``file:PATH:LINE`` (``--config``),
``env:DUALPATH_...``, ``flag:--set`` / ``flag:--preset``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from dualpath_cli.errors import ConfigError

__all__ = ["SourceKind", "Source", "Entry", "field_error"]

SourceKind = Literal["default", "preset", "profile", "system", "user", "file", "env", "flag"]


@dataclass(frozen=True, slots=True)
class Source:
    """Origin of one value: a layer kind plus its detail (name, path+line, variable, flag)."""

    kind: SourceKind
    detail: str = ""
    line: int | None = None

    def __str__(self) -> str:
        if not self.detail:
            return self.kind
        if self.line is not None:
            return f"{self.kind}:{self.detail}:{self.line}"
        return f"{self.kind}:{self.detail}"

    @property
    def where(self) -> str:
        """The prefix of an error message: ``PATH:LINE``, ``env VAR``, ``--set`` ..."""
        if self.kind in ("system", "user", "file"):
            return f"{self.detail}:{self.line}" if self.line is not None else self.detail
        if self.kind == "env":
            return f"env {self.detail}"
        if self.kind == "flag":
            return self.detail
        return str(self)


@dataclass(frozen=True, slots=True)
class Entry:
    """A raw value (as written in YAML, env or a flag) with its source."""

    raw: object
    source: Source


def field_error(source: Source, key: str, reason: str) -> ConfigError:
    """The one-line error every bad value produces: ``WHERE: key: reason``."""
    return ConfigError(f"{source.where}: {key}: {reason}")
