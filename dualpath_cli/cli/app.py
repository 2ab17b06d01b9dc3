"""The ``dualpath`` command: assembles the sub-apps and maps errors to exit codes.

Start time matters (cron and CI call the CLI many times): command modules import their heavy
dependencies inside the commands, groups are built only when used (:func:`deferred`), and
``--version`` answers before the plugins load. tests/test_cli_import_graph.py guards this;
bench/cli_start.py times it.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType
from typing import Any, ClassVar

import typer
import typer.core
import typer.models

from dualpath_cli import __version__
from dualpath_cli.cli import (
    bench_cmd,
    config_cmd,
    launch_cmd,
    monitor_cmd,
    plan_cmd,
    plugins_cmd,
    sim_cmd,
    storage_cmd,
    trace_cmd,
    tune_cmd,
)
from dualpath_cli.cli.output import fail
from dualpath_cli.errors import EXIT_USAGE, DualPathError
from dualpath_cli.plugins import get_manager

__all__ = ["app", "main", "deferred"]


class _DeferredGroup(typer.core.TyperGroup):
    """A group whose sub-commands Typer builds from :attr:`source` on first use.

    Typer turns every command of every group into click objects (inspecting signatures,
    evaluating annotations) before it parses the command line; for ``dualpath --help`` and
    ``dualpath sim run`` that is wasted on the other groups. This group is registered with
    its name, help and no-args behaviour only, and builds the real group when a sub-command
    is listed or looked up.
    """

    source: ClassVar[typer.Typer]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._built: Any = None

    def _real(self) -> Any:
        if self._built is None:
            self._built = typer.main.get_group(self.source)
        return self._built

    def list_commands(self, ctx: Any) -> list[str]:
        return list(self._real().list_commands(ctx))

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        return self._real().get_command(ctx, cmd_name)


def deferred(sub: typer.Typer) -> typer.Typer:
    """``sub`` as a group for :meth:`typer.Typer.add_typer` that is built only when used.

    ``sub`` may have commands but no callback of its own (a group's options would have to be
    parsed before the group is built).
    """
    own_callback = not isinstance(sub.info.callback, typer.models.DefaultPlaceholder)
    if sub.registered_callback is not None or own_callback:
        raise ValueError("deferred(): the group has a callback; register it with add_typer")
    group_cls = type("DeferredGroup", (_DeferredGroup,), {"source": sub})
    return typer.Typer(cls=group_cls, help=sub.info.help,
                       no_args_is_help=sub.info.no_args_is_help, add_completion=False)

app = typer.Typer(
    name="dualpath",
    help="Operate DualPath-style LLM inference: config, tuning, planning, traces.",
    no_args_is_help=True,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"dualpath {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version_callback, is_eager=True,
        help="Print the version and exit.",
    ),
) -> None:
    """DualPath operations toolkit."""


app.command("bench")(bench_cmd.bench)
app.add_typer(deferred(config_cmd.app), name="config")
app.add_typer(deferred(tune_cmd.app), name="tune")
app.add_typer(deferred(plan_cmd.app), name="plan")
app.add_typer(deferred(trace_cmd.app), name="trace")
app.add_typer(deferred(plugins_cmd.app), name="plugins")
app.add_typer(deferred(storage_cmd.app), name="storage")
app.add_typer(deferred(sim_cmd.app), name="sim")
launch_cmd.register(app)  # launch, status, stop
monitor_cmd.register(app)  # monitor, record, diagnose


def _click_module() -> ModuleType:
    """The click that Typer really uses: Typer >= 0.29 vendors its own copy as typer._click."""
    return getattr(typer.core, "_click", None) or importlib.import_module("click")


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point: run the app, print errors as one line, return the code."""
    if (sys.argv[1:] if argv is None else argv) == ["--version"]:  # before plugins load
        typer.echo(f"dualpath {__version__}")
        return 0
    click_mod = _click_module()
    click_error = click_mod.exceptions.ClickException
    abort = (getattr(click_mod.exceptions, "Abort", typer.Abort), typer.Abort)
    get_manager().install_commands(app)  # plugin sub-commands; idempotent per app
    command = typer.main.get_command(app)
    try:
        code = command.main(args=argv, prog_name="dualpath", standalone_mode=False)
    except DualPathError as err:
        fail(str(err))
        return err.exit_code
    except click_error as err:
        ctx = getattr(err, "ctx", None)
        where = f"{ctx.command_path}: " if ctx is not None else ""
        hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
        message = err.format_message()
        if message:  # an empty message is click's "no arguments: help was shown"
            fail(f"{where}{message}{hint}")
        return int(getattr(err, "exit_code", EXIT_USAGE) or EXIT_USAGE)
    except abort:
        fail("aborted")
        return 130
    except KeyboardInterrupt:
        return 130
    return code if isinstance(code, int) else 0


if __name__ == "__main__":
    sys.exit(main())
