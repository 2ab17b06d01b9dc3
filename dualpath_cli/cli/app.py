"""The ``dualpath`` command: assembles the sub-apps and maps errors to exit codes.

Start time matters (cron and CI call the CLI many times): ``--version`` answers before
anything else is imported; the Typer app is built on first use of :data:`app`; command
modules import their heavy dependencies inside the commands; groups are built only when used
(:mod:`dualpath_cli.cli.deferred`). tests/test_cli_import_graph.py guards this;
bench/cli_start.py times it. Register a new command in :func:`_build`.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType
from typing import TYPE_CHECKING

from dualpath_cli import __version__

if TYPE_CHECKING:
    import typer

__all__ = ["app", "main"]

app: typer.Typer  # declared only: module __getattr__ builds it on first use
_app: typer.Typer | None = None


def _build() -> typer.Typer:
    """The ``dualpath`` Typer app with every built-in command registered."""
    import typer

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
    from dualpath_cli.cli.deferred import deferred

    from dualpath_cli.cli.roothelp import RootGroup

    app = typer.Typer(
        cls=RootGroup,
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
    importlib.import_module("dualpath_cli.cli.explain_cmd").register(app)  # explain
    return app


def _get_app() -> typer.Typer:
    global _app
    if _app is None:
        _app = _build()
    return _app


def __getattr__(name: str) -> typer.Typer:
    """``app``, built on first use (PEP 562), so that ``--version`` imports nothing."""
    if name == "app":
        return _get_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _click_module() -> ModuleType:
    """The click that Typer really uses: Typer >= 0.29 vendors its own copy as typer._click."""
    import typer.core

    return getattr(typer.core, "_click", None) or importlib.import_module("click")


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised in the main thread so it unwinds like Ctrl-C does."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _unwind_on_termination() -> None:
    """SIGTERM and SIGHUP clean up like SIGINT: ``finally`` blocks run, engines are stopped,
    per-run stores and temp directories removed. A second signal of either kind is not
    caught (the default action ends the process at once). Commands that drain instead
    (``launch``) install their own handlers over these."""
    import signal

    def handler(signum: int, frame: object) -> None:
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        raise Terminated(signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) == signal.SIG_DFL:
            signal.signal(sig, handler)


def _terminated(err: BaseException) -> int | None:
    """The exit code of a run ended by :class:`Terminated` (128 + signal), else None."""
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, Terminated):
            return 128 + seen.signum
        seen = seen.__cause__ or seen.__context__
    return None


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point: run the app, print errors as one line, return the code."""
    if (sys.argv[1:] if argv is None else argv) == ["--version"]:  # before any import
        sys.stdout.write(f"dualpath {__version__}\n")
        return 0
    import typer
    import typer.main

    from dualpath_cli.cli.output import fail
    from dualpath_cli.errors import EXIT_USAGE, DualPathError
    from dualpath_cli.plugins import get_manager

    app = _get_app()
    click_mod = _click_module()
    click_error = click_mod.exceptions.ClickException
    abort = (getattr(click_mod.exceptions, "Abort", typer.Abort), typer.Abort)
    get_manager().install_commands(app)  # plugin sub-commands; idempotent per app
    command = typer.main.get_command(app)
    _unwind_on_termination()
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
    except abort as err:
        code = _terminated(err)
        fail("aborted" if code is None else f"terminated by signal {code - 128}; cleaned up")
        return 130 if code is None else code
    except KeyboardInterrupt as err:
        code = _terminated(err)
        return 130 if code is None else code
    return code if isinstance(code, int) else 0


if __name__ == "__main__":
    sys.exit(main())
