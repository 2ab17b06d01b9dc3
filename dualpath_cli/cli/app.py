"""The ``dualpath`` command: assembles the sub-apps and maps errors to exit codes."""

from __future__ import annotations

import sys

import click
import typer

from dualpath_cli import __version__
from dualpath_cli.cli import config_cmd, plan_cmd, plugins_cmd, storage_cmd, trace_cmd, tune_cmd
from dualpath_cli.cli.output import fail
from dualpath_cli.errors import EXIT_USAGE, DualPathError

__all__ = ["app", "main"]

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


app.add_typer(config_cmd.app, name="config")
app.add_typer(tune_cmd.app, name="tune")
app.add_typer(plan_cmd.app, name="plan")
app.add_typer(trace_cmd.app, name="trace")
app.add_typer(plugins_cmd.app, name="plugins")
app.add_typer(storage_cmd.app, name="storage")


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point: run the app, print errors as one line, return the code."""
    command = typer.main.get_command(app)
    try:
        code = command.main(args=argv, prog_name="dualpath", standalone_mode=False)
    except DualPathError as err:
        fail(str(err))
        return err.exit_code
    except click.exceptions.Exit as done:
        return int(done.exit_code or 0)
    except click.ClickException as err:
        err.show()
        return err.exit_code if err.exit_code else EXIT_USAGE
    except click.exceptions.Abort:
        fail("aborted")
        return 130
    except KeyboardInterrupt:
        return 130
    return code if isinstance(code, int) else 0


if __name__ == "__main__":
    sys.exit(main())
