"""One policy table: a plugin's policy is run by the runtime and the simulator, and selected
by ``--policy`` in ``bench``, ``sim`` and ``launch``."""

from __future__ import annotations

import importlib
from collections.abc import Iterator

import pytest
from typer.testing import CliRunner

from dualpath_cli.cli.app import app as _app
from dualpath_cli.cli.bench_cmd import _policies
from dualpath_cli.cluster.system import RuntimeSystem
from dualpath_cli.core.policies import BUILTIN_POLICIES, POLICIES, unregister_policy
from dualpath_cli.errors import UsageError
from dualpath_cli.plugins import PluginManager, reset_manager
from dualpath_cli.runtime.options import RuntimeOptions
from dualpath_cli.runtime.workloads import agentic_workload
from dualpath_cli.services.runner import run_agents
from dualpath_cli.sim import make_setup, simulate_offline, synthetic_plans
from dualpath_cli.storage import MemoryStore

AGENTS = agentic_workload(2, turns=3, first_append=40, append=12, gen=4, seed=1)
runner = CliRunner()


@pytest.fixture()
def de_first(sweep_path: None) -> Iterator[None]:
    """The first-party plugin's ``de-first`` policy registered into the table (and out)."""
    manager = PluginManager(load_entrypoints=False)
    manager.register(importlib.import_module("dualpath_pd_sweep.plugin"), name="pd_sweep")
    reset_manager(manager)
    assert manager.install_policies() == ["de-first"]
    yield
    unregister_policy("de-first")
    reset_manager()


def test_the_simulator_runs_a_plugin_policy(de_first: None) -> None:
    plans = synthetic_plans(16_000, 8, 1)
    res = simulate_offline(make_setup("ds27b", "1P2D", "de-first"), plans)
    base = simulate_offline(make_setup("ds27b", "1P2D", "basic"), plans)
    assert res.policy == "de-first" and res.turns == base.turns
    # de-first reads on the DE side while the DE queue is within alpha (3 s of reads)
    assert res.read_tokens_pe_side == 0 and res.read_tokens_de_side > 0
    assert base.read_tokens_de_side == 0


def test_the_runtime_runs_a_plugin_policy(de_first: None) -> None:
    opts = RuntimeOptions(policy="de-first", block_tokens=8, flops_rate=1e9)
    with RuntimeSystem(opts, MemoryStore()) as system:
        result = run_agents(system, AGENTS, timeout=60)
        decisions = system.decisions()
        view = system.view()
    assert not result.errors
    cached = [d for d in decisions if d.cached > 0]
    assert cached and all(d.side == "de" and d.pe_tokens == 0 for d in cached)
    assert view.scheduler.policy == "de-first" and view.scheduler.thresholds.read_side == \
        "de-first"


def test_cli_selects_a_plugin_policy_everywhere(de_first: None) -> None:
    assert _policies("dualpath,de-first") == ["dualpath", "de-first"]
    res = runner.invoke(_app, ["sim", "run", "--policy", "de-first", "--model", "ds27b",
                               "--pd", "1P2D", "--agents", "4", "--max-len", "16K", "--json"])
    assert res.exit_code == 0, res.output
    assert '"policy": "de-first"' in res.output
    res = runner.invoke(_app, ["plugins", "list", "--json"])
    assert res.exit_code == 0 and '"de-first": "pd_sweep"' in res.output


def test_unknown_and_deprecated_policy_names() -> None:
    with pytest.raises(UsageError, match="unknown policy nope"):
        _policies("dualpath,nope")
    assert _policies("dual-rr") == ["round-robin"]  # the old simulator name, an alias
    from dualpath_cli.cli.launcher import runtime_options

    with pytest.raises(UsageError, match="--policy: unknown scheduling policy 'nope'"):
        runtime_options(None, None, [], None, "nope", None)


def test_the_sim_and_runtime_share_the_builtin_rows() -> None:
    from dualpath_cli.sim import SIM_POLICIES

    assert SIM_POLICIES is POLICIES
    for name, row in BUILTIN_POLICIES.items():
        setup = make_setup("ds27b", "1P2D", name)
        assert setup.policy is row
    res = simulate_offline(make_setup("ds27b", "1P2D", "seed-select"), synthetic_plans(
        16_000, 4, 1))
    assert res.turns > 0  # neither side healthy retries at the next fetch tick
