"""Top-level commands whose modules are imported only when the command is used.

Why: ``dualpath --help`` (and a shell completion, and every command) would otherwise import
every command module, and with them rich tables, the core and the config schema, for the one
line each shows on the root page. A :class:`LazyCommand` carries that line; the root group
(cli/roothelp.py) builds the real command from its module on first use (running it, its own
``--help``, completion, docs/cli.md). tests/test_cli_lazy.py checks every line against the
real command's help, so the two cannot drift.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

__all__ = ["LazyCommand"]


@dataclass(frozen=True)
class LazyCommand:
    """A root command built from ``module`` on first use.

    ``attr`` says how the module provides it: ``"register"`` (``module.register(app)`` adds
    it, possibly with siblings), a Typer app's name (a command group, e.g. ``"app"``), or a
    function's name (a single command).
    """

    name: str
    module: str
    attr: str
    help: str  # its line on the root page: the first paragraph of the command's help

    def build(self, parent: Any, ctx: Any) -> Any:
        """The click command, built the way the root app would have built it."""
        import typer
        import typer.main

        from dualpath_cli.cli.helptext import reflow_command

        source = importlib.import_module(self.module)
        scratch = typer.Typer(rich_markup_mode="rich", pretty_exceptions_enable=False,
                              add_completion=False)
        target = getattr(source, self.attr)
        if self.attr == "register":
            target(scratch)
        elif isinstance(target, typer.Typer):
            scratch.add_typer(target, name=self.name)
        else:
            scratch.command(self.name)(target)
        scratch.callback()(lambda: None)  # a group, so the command keeps its own name
        command = typer.main.get_group(scratch).get_command(ctx, self.name)
        if command is None:
            raise LookupError(f"{self.module}.{self.attr} did not provide {self.name!r}")
        return reflow_command(command)
