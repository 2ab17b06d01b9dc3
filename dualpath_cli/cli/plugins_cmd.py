"""`dualpath plugins`: show which plugins are loaded and which hooks they can implement."""

from __future__ import annotations

from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from dualpath_cli.cli.options import JsonOption
from dualpath_cli.cli.output import emit_json, stdout
from dualpath_cli.plugins import ENTRY_POINT_GROUP, PROJECT_NAME, PluginError, get_manager

__all__ = ["app"]

app = typer.Typer(help="Inspect plugins (pluggy hooks, entry-point group 'dualpath').",
                  no_args_is_help=True)

_SINGULAR = {"policies": "policy", "stores": "store", "metrics": "metric"}


def _report() -> dict[str, Any]:
    manager = get_manager()
    failures = [failure.to_dict() for failure in manager.failures]
    try:
        contributions: dict[str, Any] = manager.contributions()
    except PluginError as err:
        contributions = {"policies": {}, "stores": {}, "metrics": {}}
        failures.append({"name": "-", "source": "hooks", "error": str(err)})
    return {
        "project": PROJECT_NAME,
        "entry_point_group": ENTRY_POINT_GROUP,
        "plugins": [info.to_dict() for info in manager.plugins()],
        "failures": failures,
        "contributions": contributions,
        "hookspecs": [spec.to_dict() for spec in manager.hookspecs()],
    }


@app.command("list")
def list_plugins(
    as_json: JsonOption = False,
) -> None:
    """List loaded plugins, what they register, load failures, and the hook specs."""
    report = _report()
    if as_json:
        emit_json(report)
        return
    if report["plugins"]:
        table = Table(title=f"plugins (entry-point group {ENTRY_POINT_GROUP!r})",
                      title_justify="left")
        for column in ("name", "source", "distribution", "hooks"):
            table.add_column(column)
        for plugin in report["plugins"]:
            dist = f"{plugin['dist']} {plugin['version']}" if plugin["dist"] else "-"
            table.add_row(plugin["name"], plugin["source"], dist,
                          ", ".join(plugin["hooks"]) or "-")
        stdout.print(table)
    else:
        stdout.print(f"no plugins loaded (entry-point group {ENTRY_POINT_GROUP!r})",
                     highlight=False)
    for kind, names in report["contributions"].items():
        for name, plugin in names.items():
            stdout.print(f"{_SINGULAR[kind]} {name!r} from plugin {plugin!r}",
                         markup=False, highlight=False, soft_wrap=True)
    for failure in report["failures"]:
        stdout.print(f"[red]failed[/] {escape(failure['name'])} ({failure['source']}): "
                     f"{escape(failure['error'])}", highlight=False, soft_wrap=True)
    specs = Table(title=f"hook specs (pluggy project {PROJECT_NAME!r})", title_justify="left")
    for column in ("hook", "arguments", "purpose"):
        specs.add_column(column)
    for spec in report["hookspecs"]:
        specs.add_row(spec["name"], ", ".join(spec["args"]) or "-", spec["doc"])
    stdout.print(specs)
