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
from dualpath_cli.cli.lost_output import guard_stdout

if TYPE_CHECKING:
    import typer

__all__ = ["app", "main"]

app: typer.Typer  # declared only: module __getattr__ builds it on first use
_app: typer.Typer | None = None


#: Every built-in command, built from its module on first use (cli/lazy.py says why); the
#: line is what ``dualpath --help`` shows (tests/test_cli_lazy.py checks it is the command's).
COMMANDS = (
    ("bench", "bench_cmd", "bench",
     "Run the embedded 1P2D system on an agentic workload and compare policies."),
    ("launch", "launch_cmd", "launch",
     "Serve the configured cluster (default: embedded 1P2D) until SIGINT/SIGTERM."),
    ("status", "status_cmd", "register",
     "One line about the launched cluster. Exit 0 running, 2 unhealthy, 3 none found."),
    ("stop", "status_cmd", "stop",
     "Stop the launched cluster: SIGTERM, wait for its drain, report. Exit 3 if none runs."),
    ("monitor", "monitor_cmd", "monitor",
     "Watch metrics of a live cluster (or a recording), redrawn in place in a terminal."),
    ("record", "record_cmd", "record",
     "Record views, decisions and served turns of a live cluster over a window."),
    ("diagnose", "diagnose_cmd", "register",
     "Troubleshooting workflows (seed section 6). Exit 0 OK, 1 WARNING, 2 CRITICAL, "
     "3 UNKNOWN."),
    ("explain", "explain_cmd", "explain",
     "Why one request went where it went: PE and DE with their classes and the thresholds, "
     "the read side and the queues that chose it, blocks hit per tier and missed per "
     "reason, bytes per NIC, per-layer slack, and its TTFT as queueing + loading + transfer "
     "+ prefill."),
    ("top", "top_cmd", "top",
     "A live cockpit for the cluster (or a recording): engines, NICs, layers, decisions, "
     "alerts, tuning. NO_COLOR is honoured; ? shows the keys, q quits."),
    ("config", "config_cmd", "app", "Show, validate and write the deployment configuration."),
    ("tune", "tune_cmd", "app",
     "Compute the scheduler thresholds from hardware facts, and set them."),
    ("plan", "plan_cmd", "app",
     "Plan deployments: bottleneck-free P/D ratios and KV working sets."),
    ("trace", "trace_cmd", "app",
     "Generate and inspect agent traces (Table 2 calibrated, or Mooncake)."),
    ("plugins", "plugins_cmd", "app",
     "Inspect plugins (pluggy hooks, entry-point group 'dualpath')."),
    ("faults", "faults_cmd", "app",
     "List, inject and clear faults on the running cluster (audited)."),
    ("drill", "drill_cmd", "register",
     "Rehearse every incident under load: one scorecard. Exit 0 all passed, 2 not, 3 no "
     "verdict."),
    ("storage", "storage_cmd", "app",
     "Inspect, verify, clean, benchmark and warm a KV block store."),
    ("sim", "sim_cmd", "app",
     "Simulate a DualPath cluster in simulated time with the core scheduler."),
)


def _build() -> typer.Typer:
    """The ``dualpath`` Typer app: the root, with every built-in command listed lazily.

    Register a new command by adding a row to :data:`COMMANDS`.
    """
    import typer

    from dualpath_cli.cli.lazy import LazyCommand
    from dualpath_cli.cli.roothelp import RootGroup

    lazy = tuple(LazyCommand(name, f"dualpath_cli.cli.{module}", attr, line)
                 for name, module, attr, line in COMMANDS)
    app = typer.Typer(
        cls=type("DualpathRoot", (RootGroup,), {"lazy": lazy}),
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

    # the one option in the old default style: typer is imported here, not at module level,
    # so an Annotated string annotation could not be evaluated in the module's globals
    @app.callback()
    def _root(
        version: bool = typer.Option(
            False, "--version", callback=_version_callback, is_eager=True,
            help="Print the version and exit.",
        ),
    ) -> None:
        """DualPath operations toolkit."""

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


def _unwind_on_termination() -> None:
    """SIGTERM and SIGHUP clean up like SIGINT: ``finally`` blocks run, engines are stopped,
    per-run stores and temp directories removed. A second signal of either kind is not
    caught (the default action ends the process at once). A signal, SIGINT included, that
    lands in an import or a :func:`~dualpath_cli.termination.deferred` section (a temp
    directory being created) is raised when that ends (:mod:`dualpath_cli.termination`).
    Commands that drain instead (``launch``) install their own handlers over these."""
    import signal
    from types import FrameType

    from dualpath_cli import termination

    def restore_defaults(signum: int) -> None:
        if signum != signal.SIGINT:
            for sig in (signal.SIGTERM, signal.SIGHUP):
                signal.signal(sig, signal.SIG_DFL)

    def handler(signum: int, frame: FrameType | None) -> None:
        global _signalled
        _signalled = signum  # Typer turns the interrupt into a bare exit 130: remember why
        termination.deliver(signum, frame)

    termination.on_act = restore_defaults
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) == signal.SIG_DFL:
            signal.signal(sig, handler)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, termination.deliver)  # KeyboardInterrupt, as Python's


#: The signal that ended this run (set by the handler above), else None.
_signalled: int | None = None


def _terminated(err: BaseException | None) -> int | None:
    """The exit code of a run ended by :class:`~dualpath_cli.termination.Terminated`
    (128 + signal), else None."""
    from dualpath_cli.termination import Terminated

    if _signalled is not None:
        return 128 + _signalled
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, Terminated):
            return 128 + seen.signum
        seen = seen.__cause__ or seen.__context__
    return None


@guard_stdout
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
    abort = (getattr(click_mod.exceptions, "Abort", typer.Abort), typer.Abort)  # by version
    get_manager().install_commands(app)  # plugin sub-commands; idempotent per app
    command = typer.main.get_command(app)
    _unwind_on_termination()
    try:
        code = command.main(args=argv, prog_name="dualpath", standalone_mode=False)
    except DualPathError as err:
        fail(str(err))
        return err.exit_code
    except click_error as err:
        ctx = getattr(err, "ctx", None)  # a UsageError's; other ClickExceptions have none
        where = f"{ctx.command_path}: " if ctx is not None else ""
        hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
        message = err.format_message()
        if message:  # an empty message is click's "no arguments: help was shown"
            fail(f"{where}{message}{hint}")
        return int(err.exit_code or EXIT_USAGE)
    except abort as err:
        code = _terminated(err)
        fail("aborted" if code is None else f"terminated by signal {code - 128}; cleaned up")
        return 130 if code is None else code
    except KeyboardInterrupt as err:
        code = _terminated(err)
        return 130 if code is None else code
    ended = _terminated(None)
    if ended is not None:
        fail(f"terminated by signal {ended - 128}; cleaned up")
        return ended
    return code if isinstance(code, int) else 0


if __name__ == "__main__":
    sys.exit(main())
