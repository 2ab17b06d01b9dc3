"""Every config key does something: the key table walk, and each scheduler key changes
behaviour in the runtime or the simulator (flags still win)."""

from __future__ import annotations

import dataclasses
import inspect
import types
from typing import Any

import pytest

from dualpath_cli.cli.app import main
from dualpath_cli.cli.bench_cmd import default_store_root, store_root
from dualpath_cli.cluster.system import RuntimeSystem
from dualpath_cli.config import load_config
from dualpath_cli.config.resolve import resolve_scheduler
from dualpath_cli.config.schema import KEYS, SECTIONS
from dualpath_cli.core.policies import random_side
from dualpath_cli.errors import ConfigError, UsageError
from dualpath_cli.runtime.options import options_from_config
from dualpath_cli.runtime.workloads import agentic_workload
from dualpath_cli.services.runner import run_agents
from dualpath_cli.sim import make_setup, simulate_offline, synthetic_plans
from dualpath_cli.sim.api import knobs_from_config
from dualpath_cli.storage import MemoryStore

AGENTS = agentic_workload(2, turns=3, first_append=40, append=12, gen=4, seed=1)

#: Keys the loader itself consumes (the preset bundle, the profiles the other keys default
#: to); test_loader_keys_change_the_loaded_values shows each does something.
LOADER_KEYS = {"preset", "hardware.profile", "model.profile"}


class _Reads:
    """A config (or one of its sections) that records every key read through it, also by
    its own properties and methods (``to_profile``, ``node_read_bandwidth``)."""

    def __init__(self, obj: Any, prefix: str, seen: set[str]) -> None:
        self._obj, self._prefix, self._seen = obj, prefix, seen

    def __getattr__(self, name: str) -> Any:
        attr = getattr(type(self._obj), name, None)
        if isinstance(attr, property):
            return attr.fget(self)  # type: ignore[misc]
        if inspect.isfunction(attr):
            return types.MethodType(attr, self)
        value = getattr(self._obj, name)
        path = f"{self._prefix}.{name}" if self._prefix else name
        if not self._prefix and name in SECTIONS:
            return _Reads(value, name, self._seen)
        self._seen.add(path)
        return value


def _read_keys(overrides: list[str] | None = None) -> set[str]:
    """Every key some code path reads from an effective config: the runtime's options, the
    simulator's knobs, the threshold resolution and the bench/launch store."""
    loaded = load_config(overrides=overrides or [], environment=False)
    seen: set[str] = set()
    proxy = _Reads(loaded.config, "", seen)
    recorded = dataclasses.replace(loaded, config=proxy)  # type: ignore[arg-type]
    options_from_config(recorded)
    knobs_from_config(proxy)  # type: ignore[arg-type]
    resolve_scheduler(proxy)  # type: ignore[arg-type]
    store_root(recorded)
    return seen


def test_every_key_in_the_table_is_read_by_a_code_path() -> None:
    unread = sorted(k.path for k in KEYS if k.path not in _read_keys() | LOADER_KEYS)
    assert unread == [], f"config keys no code path reads: {unread}"


def test_loader_keys_change_the_loaded_values() -> None:
    plain = load_config(environment=False).config
    assert load_config(preset="paper", environment=False).config.cluster.pd != plain.cluster.pd
    hw = load_config(overrides=["hardware.profile=hopper"], environment=False).config
    assert hw.hardware.gpu_peak_flops != plain.hardware.gpu_peak_flops
    model = load_config(overrides=["hardware.profile=hopper", "model.profile=ds660b"],
                        environment=False).config
    assert model.model.n_layers != hw.model.n_layers


def _opts(*sets: str, **over: Any) -> Any:
    return options_from_config(load_config(overrides=list(sets), environment=False),
                               flops_rate=1e9, block_tokens=8, **over)


def _run(opts: Any) -> tuple[list[Any], RuntimeSystem]:
    with RuntimeSystem(opts, MemoryStore()) as system:
        result = run_agents(system, AGENTS, timeout=60)
        decisions = [d for d in system.decisions() if d.kind == "turn"]
    assert not result.errors
    return decisions, system


def test_read_side_is_the_policy_and_a_flag_wins() -> None:
    assert _opts().policy == "dualpath"
    opts = _opts("scheduler.read_side=basic")
    assert opts.policy == "basic" and opts.sources["read_side"] == "flag"
    assert _opts("scheduler.read_side=basic", policy="split").policy == "split"
    assert _opts("scheduler.read_side=dual-rr").policy == "round-robin"  # deprecated alias
    decisions, system = _run(_opts("scheduler.read_side=basic"))
    assert {d.side for d in decisions if d.cached} == {"pe"}
    assert not system.scheduler.layerwise  # basic's row: no layerwise prefill
    knobs = knobs_from_config(load_config(overrides=["scheduler.read_side=basic"],
                                          environment=False).config)
    plans = synthetic_plans(16_000, 4, 1)
    basic = simulate_offline(make_setup("ds27b", "1P2D", knobs.policy), plans)
    dual = simulate_offline(make_setup("ds27b", "1P2D", "dualpath"), plans)
    assert basic.read_tokens_de_side == 0 < dual.read_tokens_de_side


def test_layerwise_prefill_false_turns_it_off() -> None:
    on, off = _opts(), _opts("scheduler.layerwise_prefill=false")
    assert on.layerwise_prefill and not off.layerwise_prefill
    with RuntimeSystem(off, MemoryStore()) as system:
        assert system.scheduler.layerwise is False  # every Prefill says so
    knobs = knobs_from_config(load_config(overrides=["scheduler.layerwise_prefill=false"],
                                          environment=False).config)
    plans = synthetic_plans(32_000, 16, 1)
    lw = simulate_offline(make_setup("ds660b", "2P4D", "dualpath"), plans)
    whole = simulate_offline(make_setup("ds660b", "2P4D", "dualpath",
                                        layerwise_prefill=knobs.layerwise_prefill), plans)
    assert whole.jct != lw.jct  # the same policy, prefill without the layer overlap


def test_random_seed_seeds_the_random_read_side() -> None:
    decisions, system = _run(_opts("scheduler.random_seed=7", policy="random"))
    assert system.scheduler.params.seed == 7
    sides = [d.side for d in decisions if d.cached]
    assert sides == [random_side(7, d.rid).value for d in decisions if d.cached]
    knobs = [knobs_from_config(load_config(overrides=[f"scheduler.random_seed={s}"],
                                           environment=False).config) for s in (0, 1)]
    plans = synthetic_plans(16_000, 8, 1)
    runs = [simulate_offline(make_setup("ds27b", "1P2D", "random", seed=k.seed), plans)
            for k in knobs]
    assert runs[0].read_tokens_pe_side != runs[1].read_tokens_pe_side


def test_dynamic_keys_turn_the_controllers_on() -> None:
    opts = _opts("scheduler.dynamic_alpha=true", "scheduler.dynamic_quota=true")
    assert opts.controllers == {"alpha": True, "beta": False, "quota": True}
    with RuntimeSystem(opts, MemoryStore()) as system:
        state = system.view().scheduler.thresholds.controllers
    assert {k: v["on"] for k, v in state.items()} == opts.controllers
    knobs = knobs_from_config(load_config(overrides=["scheduler.dynamic_beta=true"],
                                          environment=False).config)
    assert knobs.controllers == ("beta",)
    plans = synthetic_plans(16_000, 8, 1)
    off = simulate_offline(make_setup("ds27b", "1P2D"), plans)
    on = simulate_offline(make_setup("ds27b", "1P2D", controllers=knobs.controllers), plans)
    assert on.extra["controller_moves"] > 0 and on.extra["beta_tokens"] != off.extra[
        "beta_tokens"]


def test_hierarchical_runs_everywhere_and_a_token_major_layout_is_refused_in_one_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    # the runtime takes hierarchical scheduling (runtime/hierarchy.py), as the simulator
    # does (sim/hierarchy.py); 1P2D has one sub-scheduler by the core default
    opts = _opts("scheduler.hierarchical=true")
    assert opts.hierarchical and opts.subs == 1
    assert not _opts().hierarchical
    assert knobs_from_config(load_config(preset="large", environment=False).config
                             ).hierarchical
    assert main(["sim", "run", "--agents", "2", "--set", "scheduler.hierarchical=true"]) == 0
    capsys.readouterr()
    # scheduler.sub_schedulers picks the count (0: the core default), only with the hierarchy
    opts = _opts("scheduler.hierarchical=true", "scheduler.sub_schedulers=2",
                 "cluster.pd=2P2D")
    assert opts.subs == 2
    with pytest.raises(ConfigError, match="sub_schedulers 2: set only with hierarchical"):
        _opts("scheduler.sub_schedulers=2")
    with pytest.raises(UsageError, match="sub-schedulers 3: need 1 to 2"):
        _opts("scheduler.hierarchical=true", "scheduler.sub_schedulers=3", "cluster.pd=2P2D")
    knobs = knobs_from_config(load_config(overrides=[
        "scheduler.hierarchical=true", "scheduler.sub_schedulers=2"], environment=False).config)
    assert make_setup("ds27b", "2P2D", hierarchical=knobs.hierarchical,
                      sub_schedulers=knobs.sub_schedulers).sub_schedulers == 2
    assert make_setup("ds27b", "8P8D", hierarchical=True).sub_schedulers == 2  # default
    assert main(["sim", "run", "--agents", "2", "--pd", "2P2D", "--set",
                 "scheduler.hierarchical=true", "--set", "scheduler.sub_schedulers=2"]) == 0
    capsys.readouterr()
    with pytest.raises(ConfigError, match="storage.layout 'token_major'"):
        _opts("storage.layout=token_major")


def test_storage_root_is_the_store_when_set(tmp_path: Any) -> None:
    assert store_root(load_config(environment=False)) == default_store_root()
    loaded = load_config(overrides=[f"storage.root={tmp_path}/kv"], environment=False)
    assert store_root(loaded) == tmp_path / "kv"


def test_decision_ring_bounds_the_decisions_a_running_scheduler_keeps() -> None:
    assert _opts().decision_ring == 10_000
    opts = _opts("scheduler.decision_ring=3")
    assert opts.decision_ring == 3
    decisions, system = _run(opts)  # AGENTS serve more than three turns
    assert len(system.decisions()) == 3
    assert len({d.seq for d in system.decisions()}) == 3


def test_decision_ring_bytes_is_the_running_rings_byte_budget() -> None:
    assert _opts().decision_ring_bytes == 8 << 20
    opts = _opts("scheduler.decision_ring_bytes=64KiB")
    assert opts.decision_ring_bytes == 64 << 10
    _, system = _run(opts)
    assert system.scheduler.log.budget == 64 << 10


def test_prefix_cache_tokens_bounds_the_prompts_a_running_scheduler_keeps() -> None:
    assert _opts().prefix_cache_tokens == 32 << 20
    opts = _opts("scheduler.prefix_cache_tokens=0")
    assert opts.prefix_cache_tokens == 0
    _, system = _run(opts)
    prefix = system.scheduler._prefix  # the cache the key sizes
    assert len(prefix) == 0 and prefix.reused == 0  # nothing kept: every prompt hashed whole
    _, kept = _run(_opts())
    assert kept.scheduler._prefix.reused > 0  # the default reuses keys


def test_batch_window_is_the_running_schedulers_wait_between_batches() -> None:
    assert _opts().batch_window_s == 0.002
    opts = _opts("scheduler.batch_window=0")
    assert opts.batch_window_s == 0.0
    decisions, system = _run(opts)  # each message handled as it arrives: the turns run
    assert decisions and system.scheduler.batch_window_s == 0.0
    assert _opts("scheduler.batch_window=5ms").batch_window_s == 0.005
    with pytest.raises(ConfigError, match="at most 50ms"):
        _opts("scheduler.batch_window=60ms")
    with pytest.raises(ConfigError, match="non-negative"):
        _opts("scheduler.batch_window=-1ms")
