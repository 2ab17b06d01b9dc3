"""The root's lazily built commands: each line on the root page is its command's own help,
``dualpath --help`` imports no command module, and a plugin cannot take a lazy name."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import typer
import typer.main

from dualpath_cli.cli import app as app_module
from dualpath_cli.cli.roothelp import _first_paragraph
from dualpath_cli.plugins import PluginManager, hookimpl


def _root() -> tuple[object, object]:
    root = typer.main.get_command(app_module._build())
    return root, root.context_class(root, info_name="dualpath")  # type: ignore[attr-defined]


@pytest.mark.parametrize("row", app_module.COMMANDS, ids=[r[0] for r in app_module.COMMANDS])
def test_each_root_line_is_the_commands_own_help(row: tuple[str, str, str, str]) -> None:
    name, _module, _attr, line = row
    root, ctx = _root()
    command = root.get_command(ctx, name)  # type: ignore[attr-defined]
    assert command is not None and command.name == name
    assert _first_paragraph(command.short_help or command.help or "") == line


def test_the_root_page_lists_every_command_in_table_order_before_plugins() -> None:
    root, ctx = _root()
    names = root.list_commands(ctx)  # type: ignore[attr-defined]
    assert names[:len(app_module.COMMANDS)] == [r[0] for r in app_module.COMMANDS]


@pytest.mark.e2e
def test_root_help_imports_no_command_module() -> None:
    probe = ("import contextlib, io, json, sys\n"
             "from dualpath_cli.cli.app import main\n"
             "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
             "    code = main(['--help'])\n"
             "print(json.dumps({'code': code, 'page': out.getvalue(),\n"
             "                  'loaded': sorted(m for m in sys.modules\n"
             "                                   if m.startswith('dualpath_cli.cli.')\n"
             "                                   and m.endswith('_cmd'))}))\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, env={"COLUMNS": "200", "NO_COLOR": "1",
                                          "PATH": "/usr/bin:/bin"}).stdout
    got = json.loads(out)
    assert got["code"] == 0
    assert got["loaded"] == []
    for name, _module, _attr, line in app_module.COMMANDS:
        assert f"{name} " in got["page"] and line[:40] in got["page"]


def test_a_plugin_cannot_take_a_lazily_listed_name() -> None:
    class Clash:
        @hookimpl
        def dualpath_register_commands(self, app: typer.Typer) -> None:
            app.command("bench")(lambda: None)

    app = app_module._build()
    manager = PluginManager(load_entrypoints=False)
    manager.register(Clash(), name="clash")
    assert manager.install_commands(app) == []
    assert [(f.name, f.error) for f in manager.failures] == [
        ("clash", "command name already taken: bench")]
