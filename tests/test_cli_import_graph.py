"""The CLI entry point's import graph: ``--version`` and every ``--help`` load no heavy module.

Cron and CI scripts call ``dualpath`` many times, so start time matters; importing numpy,
ml_dtypes, the simulator or the HTTP stack costs most of it. Command modules import those
inside their commands, and the groups are built on first use (cli/app.py); ``--version``
imports nothing at all. The time itself is measured by bench/cli_start.py, not here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from dualpath_cli import __version__
from dualpath_cli.cli import app as app_module
from dualpath_cli.cli.app import app, main
from dualpath_cli.cli.deferred import deferred

#: Third-party modules that only some commands need; importing any takes tens of ms to seconds.
HEAVY_THIRD_PARTY = ("numpy", "ml_dtypes", "matplotlib", "plotext", "zmq", "fastapi",
                     "uvicorn", "httpx", "psutil", "starlette", "yaml", "pynvml",
                     "prometheus_client", "textual", "openai")
#: Typer itself imports pydantic to coerce the values of any command that has options (so
#: every sub-command pays it); ``dualpath --help`` and ``--version`` do not.
ROOT_ONLY = ("pydantic",)
#: Our packages that pull numpy or the HTTP stack in.
HEAVY_OURS = ("dualpath_cli.sim", "dualpath_cli.runtime", "dualpath_cli.storage",
              "dualpath_cli.cluster", "dualpath_cli.transfer", "dualpath_cli.workload",
              "dualpath_cli.api", "dualpath_cli.services.bench", "dualpath_cli.services.live")

_PROBE = textwrap.dedent("""
    import contextlib, io, json, sys
    from dualpath_cli.cli.app import app, main
    from dualpath_cli.plugins.manager import plugin_command_names
    import typer
    calls = [["--version"], ["--help"]]
    with contextlib.redirect_stdout(io.StringIO()):
        codes = [main(argv) for argv in calls]
        root_modules = sorted(sys.modules)
        root = typer.main.get_command(app)
        ctx = root.context_class(root, info_name="dualpath")
        plugins = set(plugin_command_names(app))
        for name in root.list_commands(ctx):
            if name in plugins:
                continue  # a plugin's imports are its own
            calls.append([name, "--help"])
            sub = root.get_command(ctx, name)
            if hasattr(sub, "list_commands"):
                sub_ctx = sub.context_class(sub, info_name=name, parent=ctx)
                calls += [[name, leaf, "--help"] for leaf in sub.list_commands(sub_ctx)]
        codes += [main(argv) for argv in calls[2:]]
    print(json.dumps({"calls": calls, "codes": codes, "root_modules": root_modules,
                      "modules": sorted(sys.modules)}))
""")


def _importer_chain(importtime: str, module: str) -> str:
    """``a <- b <- c``: who imported ``module``, from ``python -X importtime`` output.

    importtime prints a module after the modules it imported, indented one level deeper
    than its importer, so the importer is the next line printed with less indentation.
    """
    rows = []
    for line in importtime.splitlines():
        if line.startswith("import time:") and "|" in line:
            name = line.rsplit("|", 1)[1]
            rows.append((len(name) - len(name.lstrip()), name.strip()))
    for i, (depth, name) in enumerate(rows):
        if name != module:
            continue
        chain = [name]
        for later_depth, later in rows[i + 1:]:
            if later_depth < depth:
                chain.append(later)
                depth = later_depth
        return " <- ".join(chain)
    return module


@pytest.fixture(scope="module")
def probe() -> tuple[dict[str, Any], str]:
    """Run every ``--help`` and ``--version`` in one fresh interpreter."""
    env = {**os.environ, "COLUMNS": "80", "NO_COLOR": "1"}
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", _PROBE], env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def _heavy(modules: list[str], names: tuple[str, ...], importtime: str) -> str:
    """One line per heavy module loaded, with who imported it; empty when none."""
    loaded = set(modules)
    return "\n".join(_importer_chain(importtime, m) for m in names if m in loaded)


@pytest.mark.e2e
def test_version_and_root_help_import_no_heavy_module(probe: tuple[dict[str, Any], str]) -> None:
    result, importtime = probe
    found = _heavy(result["root_modules"], HEAVY_THIRD_PARTY + HEAVY_OURS + ROOT_ONLY,
                   importtime)
    assert not found, ("dualpath --version/--help imported heavy modules (import them inside "
                       f"the command that needs them):\n{found}")


@pytest.mark.e2e
def test_every_help_imports_no_heavy_module(probe: tuple[dict[str, Any], str]) -> None:
    result, importtime = probe
    found = _heavy(result["modules"], HEAVY_THIRD_PARTY + HEAVY_OURS, importtime)
    assert not found, ("a `dualpath ... --help` imported heavy modules (import them inside "
                       f"the command that needs them):\n{found}")


@pytest.mark.e2e
def test_probe_really_ran_every_help(probe: tuple[dict[str, Any], str]) -> None:
    result, _ = probe
    calls = result["calls"]
    assert ["sim", "compare", "--help"] in calls
    assert ["config", "show", "--help"] in calls
    assert ["bench", "--help"] in calls
    assert len(calls) >= 25
    assert set(result["codes"]) == {0}


def test_version_fast_path_matches_the_option(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    fast = capsys.readouterr().out
    slow = CliRunner().invoke(app, ["--version"])
    assert slow.exit_code == 0
    assert fast == slow.output == f"dualpath {__version__}\n"


def test_deferred_group_is_built_on_first_use() -> None:
    sub = typer.Typer(help="Sub group.", no_args_is_help=True)

    @sub.command("hello")
    def hello(name: str = typer.Option("x", "--name")) -> None:
        """Say hello."""
        typer.echo(f"hello {name}")

    @sub.command("bye")
    def bye() -> None:
        """Say bye."""

    root = typer.Typer()

    @root.callback()
    def _root() -> None:
        """Root."""

    root.add_typer(deferred(sub), name="sub")
    group = typer.main.get_command(root)
    ctx = group.context_class(group, info_name="root")
    lazy = group.get_command(ctx, "sub")  # type: ignore[attr-defined]
    assert lazy.help == "Sub group." and lazy._built is None
    listing = CliRunner().invoke(root, ["--help"], env={"NO_COLOR": "1", "COLUMNS": "80"})
    assert "Sub group." in listing.output
    assert CliRunner().invoke(root, ["sub", "hello", "--name", "y"]).output == "hello y\n"
    assert CliRunner().invoke(root, ["sub"]).exit_code == 2  # no args: help, as add_typer
    assert CliRunner().invoke(root, ["sub", "nope"]).exit_code == 2


def test_deferred_refuses_a_group_with_a_callback() -> None:
    sub = typer.Typer()

    @sub.callback()
    def _options(verbose: bool = False) -> None:
        """Has options of its own."""

    with pytest.raises(ValueError, match="callback"):
        deferred(sub)


def test_names_kept_for_help_text_equal_their_registries() -> None:
    """The CLI keeps a few names as literals so that --help needs no heavy import."""
    from dualpath_cli.cli import config_cmd, sim_cmd, storage_cmd, trace_cmd
    from dualpath_cli.config import PRESETS, schema
    from dualpath_cli.core.layout import LAYOUTS
    from dualpath_cli.sim import SIM_POLICIES
    from dualpath_cli.storage.codecs import CODECS
    from dualpath_cli.storage.engines import ENGINES
    from dualpath_cli.workload.build import DEFAULT_BASE_AGENTS

    assert schema.CODECS == CODECS
    assert schema.LAYOUTS == LAYOUTS
    # the built-in rows, first in the live table (a test may have registered a plugin's)
    assert tuple(SIM_POLICIES)[:len(sim_cmd.SIM_POLICY_NAMES)] == sim_cmd.SIM_POLICY_NAMES
    assert storage_cmd.ENGINES == ENGINES
    assert config_cmd.PRESET_NAMES == tuple(PRESETS)
    assert trace_cmd.DEFAULT_BASE_AGENTS == DEFAULT_BASE_AGENTS
    assert app_module.__all__ == ["app", "main"]
