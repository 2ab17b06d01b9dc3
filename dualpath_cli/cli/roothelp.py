"""``dualpath --help``: the root's help page, drawn with rich's panels but without Typer's
rich help module.

Why: Typer's rich help (``typer.rich_utils``) imports rich's Markdown renderer (with
markdown-it) and its traceback renderer (with Pygments) before it draws anything, about
0.1 s of the 0.3 s start-up budget of ``dualpath --help`` (bench/cli_start.py); the root page
needs neither. It keeps the look of Typer's pages (a usage line, the description, an
*Options* and a *Commands* panel), and every sub-command's page is still Typer's own.
"""

from __future__ import annotations

import inspect
from typing import Any

import typer.core

__all__ = ["RootGroup"]


def _option_row(param: Any) -> tuple[str, str, str, str]:
    """(long names, short names, metavar, help) of one option, as Typer lays them out."""
    names = [*param.opts, *param.secondary_opts]
    longs = ",".join(n for n in names if n.startswith("--"))
    shorts = ",".join(n for n in names if not n.startswith("--"))
    metavar = "" if getattr(param, "is_flag", False) else (param.make_metavar() or "")
    return longs, shorts, metavar, getattr(param, "help", None) or ""


def _first_paragraph(text: str) -> str:
    """A command's line on the page: its help's first paragraph, as Typer shows it."""
    return " ".join(inspect.cleandoc(text).split("\n\n")[0].split())


class RootGroup(typer.core.TyperGroup):
    """The root command group; only its help page differs from Typer's."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        from rich import box
        from rich.console import Console
        from rich.panel import Panel
        from rich.table import Table
        from rich.text import Text

        console = Console(highlight=False)
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
            cmd = self.get_command(ctx, name)
            if cmd is None or cmd.hidden:
                continue
            commands.add_row(name, _first_paragraph(cmd.short_help or cmd.help or ""))
        console.print(Panel(commands, title="Commands", title_align="left",
                            border_style="dim", box=box.ROUNDED, expand=True))
