"""Plugin system: pluggy hook specs (project ``dualpath``) and the manager that loads them.

Write a plugin as a module with functions marked ``@hookimpl`` and expose it through the
entry-point group ``dualpath`` in its pyproject::

    [project.entry-points.dualpath]
    my_plugin = "my_package.plugin"

See docs/architecture.md (Plugins) and plugins/ for a first-party example.
"""

from __future__ import annotations

from dualpath_cli.plugins.hookspecs import ENTRY_POINT_GROUP, PROJECT_NAME, hookimpl, hookspec
from dualpath_cli.plugins.manager import (
    LoadFailure,
    PluginError,
    PluginInfo,
    PluginManager,
    get_manager,
    reset_manager,
)
from dualpath_cli.plugins.specs import POLICY_KINDS, MetricSpec, PolicySpec, StoreSpec

__all__ = [
    "ENTRY_POINT_GROUP",
    "PROJECT_NAME",
    "hookimpl",
    "hookspec",
    "LoadFailure",
    "PluginError",
    "PluginInfo",
    "PluginManager",
    "get_manager",
    "reset_manager",
    "POLICY_KINDS",
    "MetricSpec",
    "PolicySpec",
    "StoreSpec",
]
