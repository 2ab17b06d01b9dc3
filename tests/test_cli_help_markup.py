"""Help texts survive Rich markup: ``--help`` renders with ``rich_markup_mode="rich"``, where
a bracketed phrase such as ``[default: hopper]`` is read as a style tag and silently dropped
(``tune suggest --help`` printed "a model profile ." for "[default: hopper]").

And every ``--help`` at 80 columns reads as paragraphs: no mid-sentence line break, nothing
cut. A docstring's line breaks used to reach the terminal (Typer's rich help keeps them), so
a description wrapped at 100 columns broke mid-sentence at 80 ("...full-block prefix it" /
"starts with"); cli/helptext.py joins them. A break is mid-sentence when the line does not
end a clause and the next line's first word would have fit on it: rich would not have
wrapped there. A cell that rich cuts short ends in an ellipsis.

And every command that talks to a cluster lists the options cli/options.py defines once:
``--url``, ``--port``, ``--token-file`` (how cli/source.py finds the cluster and its token) and
``--json`` where it prints data."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import click
import pytest
import typer.main
from rich.text import Text

from dualpath_cli.cli.app import app


def _commands(command: Any, ctx: click.Context) -> Iterator[tuple[str, Any]]:
    yield ctx.command_path, command
    if hasattr(command, "list_commands"):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is not None:
                yield from _commands(sub, sub.context_class(sub, info_name=name, parent=ctx))


def _swallowed(text: str) -> bool:
    """True when Rich's markup parser would drop part of ``text`` as a tag."""
    return Text.from_markup(text).plain != text


def test_no_help_text_loses_a_bracketed_phrase_to_rich_markup() -> None:
    root = typer.main.get_command(app)
    bad: list[str] = []
    for path, command in _commands(root, root.context_class(root, info_name="dualpath")):
        if command.help and _swallowed(command.help):
            bad.append(f"{path}: {command.help[:60]!r}")
        for param in command.params:
            text = getattr(param, "help", None)
            if text and _swallowed(text):
                bad.append(f"{path} {param.name}: {text!r}")
    assert not bad, "help text Rich would eat (write '(default: ...)'):\n" + "\n".join(bad)


def test_the_check_catches_a_default_in_brackets() -> None:
    assert _swallowed("Hardware profile [default: hopper].")
    assert not _swallowed("Hardware profile (default: hopper).")


WIDTH = 80

_PROBE = textwrap.dedent("""
    import contextlib, io, json
    from dualpath_cli.cli.app import app, main
    from dualpath_cli.plugins.manager import plugin_command_names
    import typer
    root = typer.main.get_command(app)
    ctx = root.context_class(root, info_name="dualpath")
    plugins = set(plugin_command_names(app))
    calls = [["--help"]]
    for name in root.list_commands(ctx):
        if name in plugins:
            continue
        calls.append([name, "--help"])
        sub = root.get_command(ctx, name)
        if hasattr(sub, "list_commands"):
            sub_ctx = sub.context_class(sub, info_name=name, parent=ctx)
            calls += [[name, leaf, "--help"] for leaf in sub.list_commands(sub_ctx)]
    pages = {}
    for argv in calls:
        with contextlib.redirect_stdout(io.StringIO()) as out:
            main(argv)
        pages[" ".join(argv[:-1]) or "dualpath"] = out.getvalue()
    from dualpath_cli.cli.monitor_cmd import main as monitor_main
    with contextlib.redirect_stdout(io.StringIO()) as out:
        monitor_main(["--help"])
    pages["dualpath-monitor"] = out.getvalue()
    print(json.dumps(pages))
""")


@pytest.fixture(scope="module")
def pages() -> dict[str, str]:
    env = {**os.environ, "COLUMNS": str(WIDTH), "NO_COLOR": "1", "TERM": "dumb"}
    proc = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got: dict[str, str] = json.loads(proc.stdout.strip().splitlines()[-1])
    return got


def _description(page: str) -> list[str]:
    """The lines between the usage line and the first panel (the command's docstring)."""
    lines = page.splitlines()
    start = next(i for i, line in enumerate(lines) if "Usage:" in line) + 1
    end = next((i for i, line in enumerate(lines) if line.lstrip().startswith("╭")),
               len(lines))
    return [line.rstrip() for line in lines[start:end]]


def _hard_breaks(lines: list[str]) -> list[str]:
    found = []
    for line, after in zip(lines, lines[1:], strict=False):
        text, nxt = line.strip(), after.strip()
        if not text or not nxt:
            continue
        word = nxt.split()[0]
        if text[-1] in ".:;,!?)" or not word[0].islower():
            continue
        if len(line) + 1 + len(word) <= WIDTH - 1:  # it would have fit: not rich's wrap
            found.append(f"{text!r} / {nxt!r}")
    return found


@pytest.mark.e2e  # pages: the help rendered in a subprocess
def test_probe_rendered_every_command(pages: dict[str, str]) -> None:
    assert {"trace convert", "storage warm", "launch", "tune set", "sim run"} <= set(pages)
    assert len(pages) >= 30


@pytest.mark.e2e  # pages: the help rendered in a subprocess
def test_no_description_breaks_mid_sentence(pages: dict[str, str]) -> None:
    broken = {name: _hard_breaks(_description(page)) for name, page in pages.items()}
    broken = {name: lines for name, lines in broken.items() if lines}
    assert not broken, f"help descriptions broken mid-sentence at {WIDTH} columns: {broken}"


@pytest.mark.e2e  # pages: the help rendered in a subprocess
def test_nothing_is_cut_short(pages: dict[str, str]) -> None:
    cut = {name: [line for line in page.splitlines() if "…" in line]
           for name, page in pages.items()}
    cut = {name: lines for name, lines in cut.items() if lines}
    assert not cut, f"help cells cut short at {WIDTH} columns: {cut}"


@pytest.mark.e2e  # pages: the help rendered in a subprocess
def test_launch_lists_every_inject_example_whole(pages: dict[str, str]) -> None:
    page = pages["launch"]
    for spec in ("snic_throttle:node=1,fraction=0.25", "read_latency:node=1,latency=20ms",
                 "read_errors:node=1,rate=0.1", "hot_blocks:node=0,count=4,rate=20",
                 "hbm_frag:engine=2,stride=4", "slow_compute:engine=1,factor=4"):
        assert spec in page


def test_the_checker_finds_the_old_break() -> None:
    old = [" A request continues the conversation whose last request's whole full-block",
           " prefix it", " starts with (shared leading hash ids) and whose input it extends;"]
    assert _hard_breaks(old) == ["'prefix it' / 'starts with (shared leading hash ids) and "
                                 "whose input it extends;'"]


#: The commands that talk to a cluster (found by cli/source.py's rules); the test finds them
#: as the commands with a ``--url``, so a new one is checked without being listed here.
CLUSTER_COMMANDS = {"monitor", "record", "diagnose", "explain", "top", "tune set", "tune show",
                    "tune rollback", "tune auto", "tune suggest", "storage warm", "status",
                    "stop", "bench", "faults list", "faults inject", "faults clear",
                    "drill"}
#: Exceptions: ``top`` is a full screen (no data to print as JSON); ``stop`` signals the
#: launcher's pid on this host and needs no token.
NO_JSON = {"top"}
NO_TOKEN = {"stop"}


def _flags(command: Any) -> set[str]:
    return {opt for param in command.params for opt in getattr(param, "opts", ())}


@pytest.mark.e2e  # pages: the help rendered in a subprocess
def test_every_cluster_command_lists_the_shared_options(pages: dict[str, str]) -> None:
    root = typer.main.get_command(app)
    found = {path.removeprefix("dualpath ").removeprefix("dualpath"): command
             for path, command in _commands(root, root.context_class(root, info_name="dualpath"))
             if "--url" in _flags(command)}
    assert set(found) == CLUSTER_COMMANDS
    missing: dict[str, list[str]] = {}
    for name, command in sorted(found.items()):
        want = ["--url", "--port"] + ([] if name in NO_TOKEN else ["--token-file"])
        want += [] if name in NO_JSON else ["--json"]
        gone = [flag for flag in want if flag not in _flags(command) or flag not in pages[name]]
        if gone:
            missing[name] = gone
    monitor = pages["dualpath-monitor"]
    gone = [f for f in ("--url", "--port", "--token-file", "--json") if f not in monitor]
    if gone:
        missing["dualpath-monitor"] = gone
    assert not missing, f"cluster commands without the shared options: {missing}"
