"""Plugin manager, `dualpath plugins list`, and the first-party dualpath-pd-sweep plugin."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import typer
from conftest import SWEEP_DIR, forget_sweep_modules

from dualpath_cli.cli.app import main
from dualpath_cli.core.capacity import pd_ratio_range
from dualpath_cli.core.policies import BUILTIN_POLICIES, Policy, ReadPlan, SchedParams, read_plan
from dualpath_cli.core.types import EngineSnapshot, ReadSide, Request, Role
from dualpath_cli.errors import UsageError
from dualpath_cli.plugins import (
    ENTRY_POINT_GROUP,
    MetricSpec,
    PluginError,
    PluginManager,
    PolicySpec,
    StoreSpec,
    hookimpl,
    reset_manager,
)
from dualpath_cli.plugins.manager import plugin_command_names
from dualpath_cli.telemetry.metrics import METRICS, MetricType


@pytest.fixture(autouse=True)
def clean_global_manager() -> Iterator[None]:
    reset_manager(PluginManager(load_entrypoints=False))
    yield
    reset_manager()


def _de_unless_empty(request: Request, pe: EngineSnapshot, de: EngineSnapshot,
                     params: SchedParams, ordinal: int) -> ReadPlan:
    """Read on the DE side unless its queue is longer than alpha."""
    if de.read_q <= params.alpha:
        return ReadPlan(ReadSide.DE, 0, request.cached)
    return ReadPlan(ReadSide.PE, request.cached, 0)


class ShorterQueue:
    """A tiny real plugin: a read-path policy, a store and a metric."""

    @hookimpl
    def dualpath_register_policies(self) -> list[PolicySpec]:
        policy = Policy("de-first-test", "prefer DE reads", _de_unless_empty)
        return [PolicySpec("de-first-test", "read-path", lambda: policy, "test policy")]

    @hookimpl
    def dualpath_register_stores(self) -> list[StoreSpec]:
        return [StoreSpec("dict-test", dict, "a dict")]

    @hookimpl
    def dualpath_register_metrics(self) -> list[MetricSpec]:
        return [MetricSpec("dualpath_test_reads_total", MetricType.COUNTER, "", ("node",),
                           "Reads counted by the test plugin.")]


def test_register_and_collect_typed_contributions() -> None:
    manager = PluginManager(load_entrypoints=False, builtins=())
    assert manager.register(ShorterQueue(), name="shorter") == "shorter"
    policy = manager.policies()["de-first-test"].factory()
    pe = EngineSnapshot(0, node=0, group=0, role=Role.PREFILL, read_q=0)
    de = EngineSnapshot(1, node=1, group=1, role=Role.DECODE, read_q=10)
    request = Request(7, length=100, cached=64)
    assert read_plan(policy, request, pe, de, SchedParams(alpha=5, beta=1000)).side \
        is ReadSide.PE
    assert read_plan(policy, request, pe, de, SchedParams(alpha=10, beta=1000)) == \
        ReadPlan(ReadSide.DE, 0, 64)
    assert manager.policies(kind="pe-fetch") == {}
    assert manager.stores()["dict-test"].factory() == {}
    assert manager.metrics()["dualpath_test_reads_total"].type is MetricType.COUNTER
    info = manager.plugins()[0]
    assert info.name == "shorter" and info.source == "registered"
    assert info.hooks == ("dualpath_register_metrics", "dualpath_register_policies",
                          "dualpath_register_stores")


def test_builtin_plugin_offers_the_core_policies() -> None:
    manager = PluginManager(load_entrypoints=False)
    policies = manager.policies(kind="read-path")
    assert set(policies) == set(BUILTIN_POLICIES)
    assert all(spec.factory() is BUILTIN_POLICIES[name] for name, spec in policies.items())
    assert manager.plugins()[0].name == "dualpath.builtin"
    assert manager.plugins()[0].source == "builtin"

    class Shadow:
        @hookimpl
        def dualpath_register_policies(self) -> list[PolicySpec]:
            return [PolicySpec("dualpath", "read-path", lambda: BUILTIN_POLICIES["basic"])]

    manager.register(Shadow(), name="shadow")
    with pytest.raises(PluginError, match="'dualpath' is registered by both plugin "
                                          "'dualpath.builtin' and plugin 'shadow'"):
        manager.policies()


def test_name_clash_and_wrong_types_name_the_plugin() -> None:
    manager = PluginManager(load_entrypoints=False)
    manager.register(ShorterQueue(), name="first")
    manager.register(ShorterQueue(), name="second")
    with pytest.raises(PluginError, match="'de-first-test' is registered by both plugin "
                                          "'first' and plugin 'second'"):
        manager.policies()

    class Wrong:
        @hookimpl
        def dualpath_register_stores(self) -> list[str]:
            return ["not a spec"]

    other = PluginManager(load_entrypoints=False)
    other.register(Wrong(), name="wrong")
    with pytest.raises(PluginError, match="plugin 'wrong'.*expected StoreSpec"):
        other.stores()
    with pytest.raises(PluginError, match="plugin 'wrong'"):
        other.register(Wrong(), name="wrong")


def test_a_plugin_metric_may_not_shadow_the_core_table() -> None:
    class Shadow:
        @hookimpl
        def dualpath_register_metrics(self) -> list[MetricSpec]:
            return [METRICS[0]]

    manager = PluginManager(load_entrypoints=False)
    manager.register(Shadow(), name="shadow")
    with pytest.raises(PluginError, match=f"metric '{METRICS[0].name}' is already in the core"):
        manager.metrics()


def test_a_hookimpl_with_a_bad_signature_is_refused() -> None:
    class BadArgs:
        @hookimpl
        def dualpath_register_commands(self, app: object, extra: int) -> None:
            """Asks for an argument the spec does not have."""

    with pytest.raises(PluginError, match="plugin 'bad'"):
        PluginManager(load_entrypoints=False).register(BadArgs(), name="bad")


def _entry_point(name: str, value: str) -> importlib.metadata.EntryPoint:
    return importlib.metadata.EntryPoint(name=name, value=value, group=ENTRY_POINT_GROUP)


def test_entry_points_load_and_a_broken_one_is_contained(sweep_path: None) -> None:
    eps = [_entry_point("pd_sweep", "dualpath_pd_sweep.plugin"),
           _entry_point("broken", "no_such_module_for_dualpath:plugin")]
    manager = PluginManager(entry_points=lambda: eps, builtins=())
    assert [p.name for p in manager.plugins()] == ["pd_sweep"]
    assert manager.plugins()[0].source == "entrypoint"
    assert manager.plugins()[0].hooks == ("dualpath_register_commands",
                                          "dualpath_register_policies")
    [failure] = manager.failures
    assert failure.name == "broken" and "ModuleNotFoundError" in failure.error


def test_builtins_are_registered_first_and_failures_recorded() -> None:
    manager = PluginManager(load_entrypoints=False,
                            builtins=[("json", "json"), ("nope", "dualpath_cli.nope")])
    assert [(p.name, p.source) for p in manager.plugins()] == [("json", "builtin")]
    assert manager.failures[0].name == "nope"


def test_install_commands_once_and_clashes_are_undone(sweep_path: None) -> None:
    import dualpath_pd_sweep.plugin as sweep_plugin

    class Clash:
        @hookimpl
        def dualpath_register_commands(self, app: typer.Typer) -> None:
            app.add_typer(typer.Typer(), name="plan")

    app = typer.Typer()
    app.add_typer(typer.Typer(), name="plan")
    manager = PluginManager(load_entrypoints=False)
    manager.register(sweep_plugin, name="pd_sweep")
    manager.register(Clash(), name="clash")
    assert manager.install_commands(app) == ["sweep"]
    assert manager.install_commands(app) == []  # idempotent for repeated main() calls
    assert plugin_command_names(app) == ["sweep"]
    assert [g.name for g in app.registered_groups] == ["plan", "sweep"]
    assert [(f.name, f.error) for f in manager.failures] == [
        ("clash", "command name already taken: plan")]


def test_sweep_command_through_the_hook(sweep_path: None,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    import dualpath_pd_sweep.plugin as sweep_plugin

    app = typer.Typer()

    @app.callback()
    def root() -> None:
        """Root."""

    manager = PluginManager(load_entrypoints=False)
    manager.register(sweep_plugin, name="pd_sweep")
    manager.install_commands(app)
    command = typer.main.get_command(app)
    command.main(["sweep", "pd", "--nodes", "6", "--json"], prog_name="dualpath",
                 standalone_mode=False)
    data = json.loads(capsys.readouterr().out)
    assert [(r["pd"], r["inside"]) for r in data["rows"]] == [
        ("1P5D", True), ("2P4D", True), ("3P3D", True), ("4P2D", True), ("5P1D", False)]
    assert data["rows"][4]["busiest_link"] == "de_cnic_write"
    assert data["rows"][4]["busiest_utilization"] == pytest.approx(11 / 8)
    command.main(["sweep", "pd", "--nodes", "6"], prog_name="dualpath", standalone_mode=False)
    assert "5P1D" in capsys.readouterr().out


def test_sweep_matches_plan_pd_ratio(sweep_path: None) -> None:
    from dualpath_pd_sweep import sweep_pd

    bounds, rows = sweep_pd(144, 8, 1.0, 50e9, 500e9)
    assert bounds == pd_ratio_range(8, 1.0, 50e9, 500e9)
    assert {r.pd for r in rows if r.inside} >= {"48P96D", "44P100D"}
    assert all(r.inside == bounds.contains(r.ratio) for r in rows)
    with pytest.raises(UsageError, match="--nodes 1"):
        sweep_pd(1, 8, 1.0, 50e9, 500e9)


def test_plugins_list_json(capsys: pytest.CaptureFixture[str]) -> None:
    manager = PluginManager(load_entrypoints=False)
    manager.register(ShorterQueue(), name="shorter")
    manager.failures.append(SimpleNamespace(  # type: ignore[arg-type]
        to_dict=lambda: {"name": "x", "source": "entrypoint", "error": "boom"}))
    reset_manager(manager)
    assert main(["plugins", "list", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["entry_point_group"] == "dualpath" and data["project"] == "dualpath"
    assert [p["name"] for p in data["plugins"]] == ["dualpath.builtin", "shorter"]
    assert data["contributions"]["policies"]["de-first-test"] == "shorter"
    assert data["contributions"]["policies"]["dualpath"] == "dualpath.builtin"
    assert data["failures"] == [{"name": "x", "source": "entrypoint", "error": "boom"}]
    assert [h["name"] for h in data["hookspecs"]] == [
        "dualpath_register_policies", "dualpath_register_stores", "dualpath_register_metrics",
        "dualpath_register_commands"]
    assert data["hookspecs"][3]["args"] == ["app"]


def test_plugins_list_human_and_a_clash_is_reported_not_raised(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plugins", "list"]) == 0
    out = capsys.readouterr().out
    assert "dualpath.builtin" in out and "dualpath_register_policies" in out
    assert "policy 'split' from plugin 'dualpath.builtin'" in out
    reset_manager(PluginManager(load_entrypoints=False, builtins=()))
    assert main(["plugins", "list"]) == 0
    assert "no plugins loaded" in capsys.readouterr().out
    manager = PluginManager(load_entrypoints=False)
    manager.register(ShorterQueue(), name="one")
    manager.register(ShorterQueue(), name="two")
    reset_manager(manager)
    assert main(["plugins", "list"]) == 0
    out = capsys.readouterr().out
    assert "registered by both plugin" in out and "one" in out


@pytest.mark.e2e
def test_the_pip_installed_plugin_is_found_by_its_entry_point(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """plugins/dualpath-pd-sweep pip-installed (into a private target): its packaging's
    entry point is what the default discovery finds."""
    target = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                           "--disable-pip-version-check", "--target", str(target),
                           str(SWEEP_DIR)], capture_output=True, text=True, timeout=300)
    if done.returncode != 0 and _offline(done.stderr):
        pytest.skip("pip cannot fetch the plugin's build backend (setuptools) from an index: "
                    + done.stderr.strip().splitlines()[-1])
    assert done.returncode == 0, done.stdout + done.stderr
    monkeypatch.syspath_prepend(str(target))  # first on the path: this copy wins
    forget_sweep_modules()
    try:
        manager = PluginManager()
        info = {p.name: p for p in manager.plugins()}["pd_sweep"]
        assert info.source == "entrypoint" and info.dist == "dualpath-pd-sweep"
        assert str(sys.modules["dualpath_pd_sweep"].__file__).startswith(str(target))
    finally:
        forget_sweep_modules()


def _offline(pip_stderr: str) -> bool:
    """Whether pip failed for want of an index (no network), not over the package."""
    text = pip_stderr.lower()
    return any(s in text for s in ("no matching distribution found for setuptools",
                                    "network is unreachable", "connection",
                                    "name or service not known", "temporary failure"))
