"""``dualpath --help``: the root's help page, drawn with rich's panels but without Typer's
rich help module.

Why: Typer's rich help (``typer.rich_utils``) imports rich's Markdown renderer (with
markdown-it) and its traceback renderer (with Pygments) before it draws anything, about
0.1 s of the 0.3 s start-up budget of ``dualpath --help`` (bench/cli_start.py); the root page
needs neither. It keeps the look of Typer's pages (a usage line, the description, an
*Options* and a *Commands* panel), and every sub-command's page is still Typer's own.

The root group also holds the :class:`~dualpath_cli.cli.lazy.LazyCommand` table: commands
listed by name and help line, built from their modules on first use.
"""

from __future__ import annotations

import inspect
from typing import Any, ClassVar

import typer.core

from dualpath_cli.cli.lazy import LazyCommand

__all__ = ["RootGroup"]


def _option_row(param: Any) -> tuple[str, str, str, str]:
    """(long names, short names, metavar, help) of one option, as Typer lays them out
    (``is_flag``, ``help`` and ``hidden`` belong to click's Option, not every Parameter)."""
    names = [*param.opts, *param.secondary_opts]
    longs = ",".join(n for n in names if n.startswith("--"))
    shorts = ",".join(n for n in names if not n.startswith("--"))
    metavar = "" if getattr(param, "is_flag", False) else (param.make_metavar() or "")
    return longs, shorts, metavar, getattr(param, "help", None) or ""


def _first_paragraph(text: str) -> str:
    """A command's line on the page: its help's first paragraph, as Typer shows it."""
    return " ".join(inspect.cleandoc(text).split("\n\n")[0].split())


class RootGroup(typer.core.TyperGroup):
    """The root command group: Typer's, plus lazily built commands and its own help page."""

    lazy: ClassVar[tuple[LazyCommand, ...]] = ()

    def list_commands(self, ctx: Any) -> list[str]:
        eager = [n for n in super().list_commands(ctx) if n not in self._lazy_names()]
        return [*(c.name for c in self.lazy), *eager]

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name not in self.commands:
            entry = next((c for c in self.lazy if c.name == cmd_name), None)
            if entry is not None:
                self.add_command(entry.build(self, ctx), cmd_name)
        return super().get_command(ctx, cmd_name)

    @classmethod
    def _lazy_names(cls) -> set[str]:
        return {c.name for c in cls.lazy}

    def _help_line(self, ctx: Any, name: str) -> str | None:
        """A command's line on the page, without building a lazy one (None: hidden)."""
        if name not in self.commands:
            entry = next((c for c in self.lazy if c.name == name), None)
            if entry is not None:
                return entry.help
        cmd = self.get_command(ctx, name)
        if cmd is None or cmd.hidden:
            return None
        return _first_paragraph(cmd.short_help or cmd.help or "")

    def format_help(self, ctx: Any, formatter: Any) -> None:
        from rich import box
        from rich.panel import Panel
        from rich.table import Table
        from rich.text import Text

        from dualpath_cli.cli.output import OutputConsole

        console = OutputConsole(highlight=False)
        console.print()
        pieces = " ".join(self.collect_usage_pieces(ctx))
        console.print(Text.assemble(" ", ("Usage: ", "yellow"),
                                    (f"{ctx.command_path} {pieces}", "bold")))
        console.print()
        if self.help:
            console.print(Text(" " + self.help.strip().split("\n\n")[0]))
            console.print()

        options = Table(show_header=False, box=None, padding=(0, 1), pad_edge=False,
                        expand=False)
        for style in ("bold cyan", "bold green", "bold yellow", ""):
            options.add_column(style=style, no_wrap=style != "")
        for param in self.get_params(ctx):
            if param.param_type_name == "option" and not getattr(param, "hidden", False):
                options.add_row(*_option_row(param))
        console.print(Panel(options, title="Options", title_align="left",
                            border_style="dim", box=box.ROUNDED, expand=True))

        commands = Table(show_header=False, box=None, padding=(0, 1), pad_edge=False,
                         expand=False)
        commands.add_column(style="bold cyan", no_wrap=True)
        commands.add_column()
        for name in self.list_commands(ctx):
            line = self._help_line(ctx, name)
            if line is not None:
                commands.add_row(name, line)
        console.print(Panel(commands, title="Commands", title_align="left",
                            border_style="dim", box=box.ROUNDED, expand=True))
