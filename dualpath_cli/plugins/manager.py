"""The plugin manager: finds plugins, calls their hooks, and keeps one bad plugin contained.

Plugins come from three places: built-in modules (:data:`BUILTIN_PLUGINS`), installed
distributions exposing the setuptools entry-point group ``dualpath``, and direct
:meth:`PluginManager.register` calls (tests, embedding applications).

Entry points are loaded with the same rules as pluggy's ``load_setuptools_entrypoints``
(skip names already registered or blocked), but one at a time with errors caught: a plugin
that fails to import is recorded as a :class:`LoadFailure` and shown by ``dualpath plugins
list`` instead of breaking every command.
"""

from __future__ import annotations

import importlib
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

import pluggy

from dualpath_cli.errors import DualPathError
from dualpath_cli.plugins import hookspecs
from dualpath_cli.plugins.hookspecs import ENTRY_POINT_GROUP, PROJECT_NAME
from dualpath_cli.plugins.specs import MetricSpec, PolicyKind, PolicySpec, StoreSpec
from dualpath_cli.telemetry.metrics import METRICS

__all__ = [
    "BUILTIN_PLUGINS",
    "PluginError",
    "PluginInfo",
    "LoadFailure",
    "HookSpecInfo",
    "PluginManager",
    "get_manager",
    "reset_manager",
    "plugin_command_names",
    "load_policies",
    "policy_names",
]

#: Modules always registered, as ``(name, module path)``. Default behaviour that is written
#: as a plugin goes here; first-party optional plugins live in the top-level plugins/ folder.
BUILTIN_PLUGINS: tuple[tuple[str, str], ...] = (
    ("dualpath.builtin", "dualpath_cli.plugins.builtin"),
)

_T = TypeVar("_T")


class PluginError(DualPathError):
    """A plugin misbehaved: a clashing name, a wrong return type, or a hook that raised."""


@dataclass(frozen=True, slots=True)
class PluginInfo:
    """One registered plugin: where it came from and which hooks it implements."""

    name: str
    source: str  # "builtin", "entrypoint" or "registered"
    dist: str | None
    version: str | None
    hooks: tuple[str, ...]

    def to_dict(self) -> dict[str, object]:
        """Plain-JSON form."""
        return {"name": self.name, "source": self.source, "dist": self.dist,
                "version": self.version, "hooks": list(self.hooks)}


@dataclass(frozen=True, slots=True)
class LoadFailure:
    """A plugin that could not be loaded or whose contribution was refused."""

    name: str
    source: str
    error: str

    def to_dict(self) -> dict[str, object]:
        """Plain-JSON form."""
        return {"name": self.name, "source": self.source, "error": self.error}


@dataclass(frozen=True, slots=True)
class HookSpecInfo:
    """One hook specification: its name, arguments and the first line of its docstring."""

    name: str
    args: tuple[str, ...]
    firstresult: bool
    doc: str

    def to_dict(self) -> dict[str, object]:
        """Plain-JSON form."""
        return {"name": self.name, "args": list(self.args), "firstresult": self.firstresult,
                "doc": self.doc}


def _entry_points() -> Iterable[Any]:
    """The installed ``dualpath`` entry points (plugins/discovery.py: why not importlib's)."""
    from dualpath_cli.plugins.discovery import entry_points

    return entry_points(ENTRY_POINT_GROUP)


# Policy name -> the plugin that put it in core's table (a plugin may re-register its own).
_POLICY_OWNERS: dict[str, str] = {}

# Typer app -> command names plugins added to it (the CLI's main() may run many times).
_INSTALLED_APPS: weakref.WeakKeyDictionary[Any, list[str]] = weakref.WeakKeyDictionary()


def plugin_command_names(app: Any) -> list[str]:
    """Top-level command names that plugins added to ``app`` (docs leave these out)."""
    return list(_INSTALLED_APPS.get(app, []))


def _command_name(entry: Any) -> str:
    """The name a Typer ``CommandInfo`` or ``TyperInfo`` is invoked by."""
    if getattr(entry, "name", None):
        return str(entry.name)
    if getattr(entry, "typer_instance", None) is not None:
        return str(entry.typer_instance.info.name)
    return str(getattr(entry.callback, "__name__", "")).replace("_", "-")


def _command_names(app: Any) -> list[str]:
    """Top-level command and group names of a Typer app: registered, and listed lazily by
    its root group class (cli/lazy.py)."""
    lazy = [c.name for c in getattr(getattr(app.info, "cls", None), "lazy", ())]
    return [*lazy, *(_command_name(entry) for entry in (*app.registered_commands,
                                                          *app.registered_groups))]


class PluginManager:
    """Loads dualpath plugins and gives typed, name-checked access to what they register.

    Args:
        load_entrypoints: scan installed distributions for the ``dualpath`` group
            (default True; tests pass False for a clean manager).
        builtins: ``(name, module)`` pairs registered first (default :data:`BUILTIN_PLUGINS`).
        entry_points: the entry-point source, for tests (default: plugins/discovery.py).
    """

    def __init__(
        self,
        *,
        load_entrypoints: bool = True,
        builtins: Iterable[tuple[str, str]] = BUILTIN_PLUGINS,
        entry_points: Callable[[], Iterable[Any]] = _entry_points,
    ) -> None:
        self.pm = pluggy.PluginManager(PROJECT_NAME)
        self.pm.add_hookspecs(hookspecs)
        self._origin: dict[str, tuple[str, str | None, str | None]] = {}
        self.failures: list[LoadFailure] = []
        for name, module in builtins:
            try:
                self._register(importlib.import_module(module), name, "builtin")
            except Exception as err:  # noqa: BLE001 - contained and reported
                self.failures.append(LoadFailure(name, "builtin", _describe(err)))
        if load_entrypoints:
            self._load_entrypoints(entry_points)

    def _register(self, plugin: object, name: str, source: str, dist: str | None = None,
                  version: str | None = None) -> str:
        registered = self.pm.register(plugin, name=name)
        assert registered is not None  # pluggy returns None only for blocked names
        self._origin[registered] = (source, dist, version)
        return registered

    def _load_entrypoints(
        self, entry_points: Callable[[], Iterable[Any]],
    ) -> None:
        for ep in entry_points():
            if self.pm.get_plugin(ep.name) is not None or self.pm.is_blocked(ep.name):
                continue
            # a discovery.FoundEntryPoint, or an importlib.metadata.EntryPoint (tests)
            dist = getattr(ep, "dist", None)
            dist_name = getattr(ep, "dist_name", None) or getattr(dist, "name", None)
            dist_version = getattr(ep, "dist_version", None) or getattr(dist, "version", None)
            try:
                self._register(ep.load(), ep.name, "entrypoint", dist_name, dist_version)
            except Exception as err:  # noqa: BLE001 - one bad plugin must not break the CLI
                self.failures.append(LoadFailure(ep.name, "entrypoint", _describe(err)))

    def register(self, plugin: object, name: str | None = None) -> str:
        """Register a plugin object or module directly; returns its name.

        Raises:
            PluginError: when the name is taken or a hook implementation does not match
                its specification.
        """
        label = name or getattr(plugin, "__name__", None) or repr(plugin)
        try:
            return self._register(plugin, label, "registered")
        except (ValueError, pluggy.PluginValidationError) as err:
            raise PluginError(f"plugin {label!r}: {err}") from None

    def plugins(self) -> list[PluginInfo]:
        """Every registered plugin, sorted by name."""
        infos = []
        for name, plugin in self.pm.list_name_plugin():
            source, dist, version = self._origin.get(name, ("registered", None, None))
            hooks = tuple(sorted(caller.name for caller in self.pm.get_hookcallers(plugin)
                                 or []))
            infos.append(PluginInfo(name, source, dist, version, hooks))
        return sorted(infos, key=lambda info: info.name)

    def hookspecs(self) -> list[HookSpecInfo]:
        """The hook specifications plugins can implement, in declaration order."""
        specs = []
        for name in vars(hookspecs):
            if not name.startswith(f"{PROJECT_NAME}_"):
                continue
            caller = getattr(self.pm.hook, name)
            spec = caller.spec
            assert spec is not None
            doc = (spec.function.__doc__ or "").strip().splitlines()
            specs.append(HookSpecInfo(name, tuple(spec.argnames),
                                      bool(spec.opts.get("firstresult")),
                                      doc[0] if doc else ""))
        return specs

    def _collect(self, hook: str, expected: type[_T], key: Callable[[_T], str],
                 **kwargs: Any) -> dict[str, tuple[str, _T]]:
        """Call ``hook`` on each plugin in registration order; check types and unique names."""
        found: dict[str, tuple[str, _T]] = {}
        for impl in getattr(self.pm.hook, hook).get_hookimpls():
            try:
                items = impl.function(**kwargs)
            except Exception as err:  # noqa: BLE001 - name the plugin, never a traceback
                raise PluginError(f"plugin {impl.plugin_name!r}: {hook} failed: "
                                  f"{_describe(err)}") from None
            for item in items or []:
                if not isinstance(item, expected):
                    raise PluginError(f"plugin {impl.plugin_name!r}: {hook} returned "
                                      f"{item!r}, expected {expected.__name__}")
                name = key(item)
                if name in found:
                    raise PluginError(f"{hook}: {name!r} is registered by both plugin "
                                      f"{found[name][0]!r} and plugin {impl.plugin_name!r}")
                found[name] = (impl.plugin_name, item)
        return found

    def policies(self, kind: PolicyKind | None = None) -> dict[str, PolicySpec]:
        """Registered policies by name, optionally only those of one ``kind``."""
        found = self._collect("dualpath_register_policies", PolicySpec, lambda p: p.name)
        return {name: spec for name, (_, spec) in found.items()
                if kind is None or spec.kind == kind}

    def install_policies(self) -> list[str]:
        """Add every plugin's ``read-path`` policy to core's one policy table; returns the
        names added (built-in rows are already there).

        Raises:
            PluginError: a factory that fails, returns something that is not a core
                ``Policy``, or a policy whose name differs from its spec's.
        """
        from dualpath_cli.core.policies import (
            BUILTIN_POLICIES,
            POLICIES,
            Policy,
            register_policy,
            unregister_policy,
        )

        added = []
        found = self._collect("dualpath_register_policies", PolicySpec, lambda p: p.name)
        for name, (plugin, spec) in found.items():
            if spec.kind != "read-path" or name in BUILTIN_POLICIES:
                continue
            try:
                policy = spec.factory()
            except Exception as err:  # noqa: BLE001 - name the plugin, never a traceback
                raise PluginError(f"plugin {plugin!r}: policy {name!r} factory failed: "
                                  f"{_describe(err)}") from None
            if not isinstance(policy, Policy) or policy.name != name:
                raise PluginError(f"plugin {plugin!r}: policy {name!r} factory returned "
                                  f"{policy!r}, expected a core Policy named {name!r}")
            if _POLICY_OWNERS.get(name) == plugin and POLICIES.get(name) is not policy:
                unregister_policy(name)  # the same plugin, its module loaded anew: replace
            try:
                register_policy(policy)
            except DualPathError as err:
                raise PluginError(f"plugin {plugin!r}: {err}") from None
            _POLICY_OWNERS[name] = plugin
            added.append(name)
        return added

    def stores(self) -> dict[str, StoreSpec]:
        """Registered KV-store backends by name."""
        found = self._collect("dualpath_register_stores", StoreSpec, lambda s: s.name)
        return {name: spec for name, (_, spec) in found.items()}

    def metrics(self) -> dict[str, MetricSpec]:
        """Metrics contributed by plugins, by name; none may reuse a name of the core table."""
        found = self._collect("dualpath_register_metrics", MetricSpec, lambda m: m.name)
        core = {metric.name for metric in METRICS}
        for name, (plugin, _) in found.items():
            if name in core:
                raise PluginError(f"plugin {plugin!r}: metric {name!r} is already in the core "
                                  "metrics table (dualpath_cli/telemetry/metrics.py)")
        return {name: spec for name, (_, spec) in found.items()}

    def contributions(self) -> dict[str, dict[str, str]]:
        """Which plugin registered each policy, store and metric (for ``plugins list``)."""
        return {
            "policies": {name: plugin for name, (plugin, _) in self._collect(
                "dualpath_register_policies", PolicySpec, lambda p: p.name).items()},
            "stores": {name: plugin for name, (plugin, _) in self._collect(
                "dualpath_register_stores", StoreSpec, lambda s: s.name).items()},
            "metrics": {name: plugin for name, (plugin, _) in self._collect(
                "dualpath_register_metrics", MetricSpec, lambda m: m.name).items()},
        }

    def install_commands(self, app: Any) -> list[str]:
        """Let every plugin add sub-commands to the Typer ``app``; returns the names added.

        Runs once per app. A plugin whose hook raises, or that reuses a command name already
        taken, has its additions removed and is recorded in :attr:`failures`.
        """
        if app in _INSTALLED_APPS:
            return []
        added: list[str] = []
        _INSTALLED_APPS[app] = added
        for impl in self.pm.hook.dualpath_register_commands.get_hookimpls():
            commands, groups = list(app.registered_commands), list(app.registered_groups)
            taken = set(_command_names(app))
            try:
                impl.function(app=app)
                new = [_command_name(entry) for entry in
                       (*app.registered_commands[len(commands):],
                        *app.registered_groups[len(groups):])]
                clash = sorted({n for n in new if n in taken or new.count(n) > 1})
                if clash:
                    raise PluginError(f"command name already taken: {', '.join(clash)}")
            except Exception as err:  # noqa: BLE001 - undo and report this plugin only
                app.registered_commands[:] = commands
                app.registered_groups[:] = groups
                self.failures.append(LoadFailure(impl.plugin_name, "commands",
                                                 _describe(err)))
                continue
            added.extend(new)
        return list(added)


def _describe(err: BaseException) -> str:
    text = str(err)
    if isinstance(err, DualPathError):
        return text
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


_manager: PluginManager | None = None


def get_manager() -> PluginManager:
    """The process-wide manager, created (and entry points loaded) on first use."""
    global _manager
    if _manager is None:
        _manager = PluginManager()
    return _manager


def load_policies(*names: str) -> None:
    """Make plugins' policies selectable: register them into core's policy table.

    Cheap when every name in ``names`` is already in the table (built-in, or registered
    before): plugins are then not loaded. With no names, or an unknown one, the plugins'
    policies are registered, and the caller's lookup reports a name still missing.

    Raises:
        PluginError: a plugin's policy could not be registered.
    """
    from dualpath_cli.core.policies import ALIASES, POLICIES

    if names and all(n in POLICIES or n in ALIASES for n in names):
        return
    get_manager().install_policies()


def policy_names() -> list[str]:
    """Every selectable policy name: core's table after loading the plugins' policies."""
    from dualpath_cli.core.policies import POLICIES

    load_policies()
    return list(POLICIES)


def reset_manager(manager: PluginManager | None = None) -> None:
    """Replace the process-wide manager (None: build a fresh one on next use). For tests."""
    global _manager
    _manager = manager
