"""`dualpath config show|validate|init`: inspect, check and write deployment configuration.

Thin front-end over :mod:`dualpath_cli.config`: parse options, load, render, exit code.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich import box
from rich.table import Table

from dualpath_cli.cli.options import JsonOption
from dualpath_cli.cli.output import emit_json, fail, stderr, stdout
from dualpath_cli.errors import EXIT_USAGE, ConfigError, UsageError

# config/ (yaml, the key table, the core registries) is imported inside the commands so that
# ``dualpath --help`` stays fast (tests/test_cli_import_graph.py).

__all__ = ["app", "PRESET_NAMES"]

#: The names of config.PRESETS, for the --preset help (a test checks they agree).
PRESET_NAMES: tuple[str, ...] = ("embedded", "small", "medium", "large", "paper")

app = typer.Typer(help="Show, validate and write the deployment configuration.",
                  no_args_is_help=True)

_PRESET_HELP = f"Preset to start from: {', '.join(PRESET_NAMES)}."


@app.command("show")
def show(
    preset: Annotated[str | None, typer.Option("--preset", help=_PRESET_HELP)] = None,
    config: Annotated[Path | None, typer.Option(
        "--config", "-c", help="Config file layered over env and user/system files.")] = None,
    overrides: Annotated[list[str] | None, typer.Option(
        "--set", help="Override one key, e.g. --set scheduler.alpha=8KiB (repeatable).")] = None,
    as_json: JsonOption = False,
) -> None:
    """Print every effective value with its source; alpha, beta and quota also resolved."""
    from dualpath_cli.config import load_config
    from dualpath_cli.config.render import display_value, resolved_text

    loaded = load_config(preset=preset, config_file=config, overrides=overrides or ())
    if as_json:
        emit_json(loaded.to_dict())
        return
    table = Table(title=f"dualpath config (preset {loaded.config.preset})",
                  title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    table.add_column("key")
    table.add_column("value (-> resolved)", overflow="fold")
    table.add_column("source", overflow="fold")
    for key, setting in loaded.settings.items():
        value = display_value(key, setting.value, setting.raw)
        resolved = resolved_text(loaded, key)
        table.add_row(key, f"{value} -> {resolved}" if resolved else value, str(setting.source))
    _fit_words(table, stdout.width)
    stdout.print(table)
    for name in ("alpha", "beta", "compute_quota"):
        value = getattr(loaded.resolved, name)
        resolved = resolved_text(loaded, f"scheduler.{name}")
        stdout.print(f"{name}: {value.given} ({value.form}) -> {resolved}: {value.derivation}",
                     highlight=False, soft_wrap=True)


def _fit_words(table: Table, width: int) -> None:
    """Give every column at least its longest word, so a narrow terminal wraps cells between
    words instead of cutting ``profile:reference`` to ``profile:refer``. Columns are set
    three spaces apart, or one where that needs the room; a word that cannot fit even then
    (a long ``env:`` name or path) folds onto the next line, and the first column, the key,
    never does."""
    cols = table.columns
    words = [max((len(word) for cell in (col.header, *col.cells)
                  for word in str(cell).split()), default=0) for col in cols]
    gap = 3 if sum(words) + 3 * (len(cols) - 1) <= width else 1
    spare = width - gap * (len(cols) - 1) - words[0]
    while sum(words[1:]) > spare and max(words[1:]) > 1:
        widest = max(range(1, len(cols)), key=lambda i: words[i])
        words[widest] -= 1
    for col, least in zip(cols, words, strict=True):
        col.min_width = least
    cols[0].no_wrap = True
    table.padding = (0, 1) if gap == 3 else (0, 0)


@app.command("validate")
def validate(
    file: Annotated[Path, typer.Argument(help="YAML config file to check (over the defaults).")],
    as_json: JsonOption = False,
) -> None:
    """Check FILE: exit 0 when valid, 2 with one line naming file, line, key and reason."""
    from dualpath_cli.config import load_file

    try:
        loaded = load_file(file)
    except ConfigError as err:
        if not as_json:
            raise
        emit_json({"path": str(file), "valid": False, "error": str(err)})
        fail(str(err))
        raise typer.Exit(EXIT_USAGE) from None
    if as_json:
        emit_json({"path": str(file), "valid": True, "preset": loaded.config.preset,
                   "resolved": loaded.resolved.to_dict()})
    else:
        stderr.print(f"{file}: valid", highlight=False, soft_wrap=True)


@app.command("init")
def init(
    preset: Annotated[str, typer.Option("--preset", help=_PRESET_HELP)] = "embedded",
    output: Annotated[str | None, typer.Option(
        "--output", "-o", help="File to write ('-' for stdout) (default: the user config file, "
        "$XDG_CONFIG_HOME/dualpath/config.yaml).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing file.")] = False,
    as_json: JsonOption = False,
) -> None:
    """Write a commented YAML config for a preset; it loads back to the same values."""
    from dualpath_cli.cli.output_target import output_path, writes_stdout
    from dualpath_cli.config import default_user_file, load_preset
    from dualpath_cli.config.render import atomic_write_text, render_yaml

    text = render_yaml(load_preset(preset))
    if writes_stdout(output):
        sys.stdout.write(text)
        return
    path = (output_path(output) if output is not None else None) or default_user_file(
        os.environ)
    if path.exists() and not force:
        raise UsageError(f"{path}: already exists; use --force to overwrite")
    try:
        atomic_write_text(path, text)
    except OSError as err:
        raise UsageError(f"{path}: cannot write: {err.strerror or err}") from None
    if as_json:
        emit_json({"path": str(path), "preset": preset})
    else:
        stderr.print(f"wrote {path} (preset {preset})", highlight=False, soft_wrap=True)
