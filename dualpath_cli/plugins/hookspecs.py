"""The pluggy hook specifications of the ``dualpath`` project.

A plugin is any module or object with functions decorated by :data:`hookimpl` whose names
match these specs; it is found through the setuptools entry-point group ``dualpath`` or
registered directly. Every hook is optional for a plugin to implement.
"""

from __future__ import annotations

from typing import Any

import pluggy

from dualpath_cli.plugins.specs import MetricSpec, PolicySpec, StoreSpec

__all__ = ["PROJECT_NAME", "ENTRY_POINT_GROUP", "hookspec", "hookimpl"]

#: pluggy project name; hook implementations must use the marker of the same name.
PROJECT_NAME = "dualpath"
#: setuptools entry-point group scanned for installed plugins.
ENTRY_POINT_GROUP = "dualpath"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec
def dualpath_register_policies() -> list[PolicySpec]:  # type: ignore[empty-body]
    """Return scheduling policies (e.g. read-path rules) this plugin provides.

    Names must be unique across all plugins, built-in ones included; a clash is an error.
    """


@hookspec
def dualpath_register_stores() -> list[StoreSpec]:  # type: ignore[empty-body]
    """Return KV-store backends this plugin provides."""


@hookspec
def dualpath_register_metrics() -> list[MetricSpec]:  # type: ignore[empty-body]
    """Return metrics this plugin records (rows like the core metrics table's)."""


@hookspec
def dualpath_register_commands(app: Any) -> None:
    """Add CLI sub-commands to the root Typer ``app`` (``app.add_typer`` / ``app.command``).

    Called once per process, just before the command line is parsed.
    """
