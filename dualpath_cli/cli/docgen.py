"""Generate docs/cli.md and the shell completions from the Typer app, so neither can drift.

Run from the repository root::

    python -m dualpath_cli.cli.docgen --write   # regenerate docs/cli.md and completions/
    python -m dualpath_cli.cli.docgen --check   # exit 1 and name the stale files

The reference walks the click command tree of :data:`dualpath_cli.cli.app.app` (help text,
usage, options with type and default). Commands that plugins add at run time are not part
of it: they are installed by ``main()``, not at import. The completion scripts are exactly
what the program prints for ``_DUALPATH_COMPLETE=source_<shell> dualpath``.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import io
import os
import sys
from pathlib import Path
from typing import Any

import typer

from dualpath_cli.plugins.manager import plugin_command_names

__all__ = [
    "PROG_NAME",
    "COMPLETE_VAR",
    "COMPLETION_FILES",
    "CLI_DOC",
    "render_cli_markdown",
    "completion_script",
    "generated_files",
    "stale_files",
    "main",
]

PROG_NAME = "dualpath"
COMPLETE_VAR = "_DUALPATH_COMPLETE"
CLI_DOC = "docs/cli.md"
#: Shell -> file, named as each shell's completion directories expect.
COMPLETION_FILES: dict[str, str] = {
    "bash": "completions/dualpath.bash",
    "zsh": "completions/_dualpath",
    "fish": "completions/dualpath.fish",
}
REGENERATE = "python -m dualpath_cli.cli.docgen --write"


def _app(app: typer.Typer | None) -> typer.Typer:
    if app is None:
        from dualpath_cli.cli.app import app as default_app

        return default_app
    return app


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _params_table(params: list[Any], ctx: Any) -> list[str]:
    """One row per parameter, from the same help record ``--help`` prints."""
    rows = ["| option | description |", "|---|---|"]
    for param in params:
        record = param.get_help_record(ctx) or (param.human_readable_name, "")
        rows.append(f"| `{record[0]}` | {_cell(record[1])} |")
    return rows


def _walk(command: Any, ctx: Any, lines: list[str], skip: frozenset[str] = frozenset()) -> None:
    path = ctx.command_path
    depth = min(path.count(" ") + 1, 4)
    lines += [f"{'#' * (depth + 1)} `{path}`", ""]
    help_text = inspect.cleandoc(command.help or "")
    if help_text:
        lines += [help_text, ""]
    usage = " ".join([path, *command.collect_usage_pieces(ctx)])
    lines += ["```", usage, "```", ""]
    visible = [p for p in command.params  # an Argument may have no ``hidden``
               if not getattr(p, "hidden", False)]
    if visible:
        lines += _params_table(visible, ctx) + [""]
    if hasattr(command, "list_commands"):
        names = [n for n in command.list_commands(ctx)
                 if n not in skip and not command.get_command(ctx, n).hidden]
        if names:
            lines += ["Commands: " + ", ".join(f"`{n}`" for n in names), ""]
        for name in names:
            sub = command.get_command(ctx, name)
            _walk(sub, sub.context_class(sub, info_name=name, parent=ctx), lines)


def render_cli_markdown(app: typer.Typer | None = None) -> str:
    """The command reference in Markdown, generated from the click tree of ``app``."""
    typer_app = _app(app)
    root = typer.main.get_command(typer_app)
    skip = frozenset(plugin_command_names(typer_app))
    lines = [
        "# Command reference",
        "",
        f"Generated from the Typer app by `{REGENERATE}`; do not edit by hand "
        "(tests/test_docs_cli.py fails when this file drifts from the code).",
        "",
        "Every command prints human output by default and one JSON object with `--json`. "
        "Bad input prints one `error:` line on stderr and exits with code 2.",
        "",
    ]
    _walk(root, root.context_class(root, info_name=PROG_NAME), lines, skip)
    return "\n".join(lines).rstrip() + "\n"


def completion_script(shell: str, app: typer.Typer | None = None) -> str:
    """What ``_DUALPATH_COMPLETE=source_<shell> dualpath`` prints, generated in-process."""
    if shell not in COMPLETION_FILES:
        raise ValueError(f"unsupported shell {shell!r}: expected one of "
                         f"{', '.join(COMPLETION_FILES)}")
    root = typer.main.get_command(_app(app))
    buffer = io.StringIO()
    previous = os.environ.get(COMPLETE_VAR)
    os.environ[COMPLETE_VAR] = f"source_{shell}"
    try:
        with contextlib.redirect_stdout(buffer), contextlib.suppress(SystemExit):
            root.main(args=[], prog_name=PROG_NAME, standalone_mode=False)
    finally:
        if previous is None:
            del os.environ[COMPLETE_VAR]
        else:
            os.environ[COMPLETE_VAR] = previous
    text = buffer.getvalue()
    if not text.strip():
        raise RuntimeError(f"the app printed no {shell} completion script")
    return text


def generated_files(app: typer.Typer | None = None) -> dict[str, str]:
    """Every generated file, as repository-relative path -> content."""
    files = {CLI_DOC: render_cli_markdown(app)}
    for shell, path in COMPLETION_FILES.items():
        files[path] = completion_script(shell, app)
    return files


def stale_files(root: Path, app: typer.Typer | None = None) -> list[str]:
    """Generated files under ``root`` that are missing or differ from what the code makes."""
    stale = []
    for rel, content in generated_files(app).items():
        target = root / rel
        if not target.is_file() or target.read_text(encoding="utf-8") != content:
            stale.append(rel)
    return stale


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, content in files.items():
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_text(content, encoding="utf-8")
        tmp.replace(target)


def main(argv: list[str] | None = None) -> int:
    """Write (``--write``) or check (``--check``) the generated files; returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m dualpath_cli.cli.docgen",
                                     description=__doc__.splitlines()[0] if __doc__ else None)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="regenerate the files")
    mode.add_argument("--check", action="store_true", help="exit 1 if any file is stale")
    parser.add_argument("--root", type=Path, default=Path("."),
                        help="repository root (default: current directory)")
    args = parser.parse_args(argv)
    if args.write:
        files = generated_files()
        _write(args.root, files)
        for rel in files:
            print(f"wrote {rel}", file=sys.stderr)
        return 0
    stale = stale_files(args.root)
    for rel in stale:
        print(f"stale: {rel} (run `{REGENERATE}`)", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
