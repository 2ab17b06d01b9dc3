"""Embedded runtime correctness: same tokens on every path, DE-path bytes, corruption."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dualpath_cli.cluster.system import RuntimeSystem
from dualpath_cli.core.layout import BlockShape, Namespace, prefix_keys
from dualpath_cli.runtime.context import open_store
from dualpath_cli.runtime.model import load_model
from dualpath_cli.runtime.options import RuntimeOptions
from dualpath_cli.runtime.scheduler import SchedulerService
from dualpath_cli.runtime.turns import TurnRequest
from dualpath_cli.runtime.workloads import agentic_workload
from dualpath_cli.services.runner import RunResult, run_agents
from dualpath_cli.storage import HEADER_SIZE, MemoryStore, encode_block
from dualpath_cli.telemetry.metrics import METRICS
from dualpath_cli.telemetry.registry import MetricsRegistry
from dualpath_cli.workload.tokens import append_token_ids

AGENTS = agentic_workload(3, turns=3, first_append=40, append=12, gen=4, seed=1)


def _reference() -> dict[tuple[int, int], tuple[int, ...]]:
    """Every turn recomputed from scratch (no cache at all)."""
    model = load_model("tiny")
    out = {}
    for traj in AGENTS:
        ctx: list[int] = []
        for i, turn in enumerate(traj.turns):
            prompt = ctx + append_token_ids(traj, i, 256).tolist()
            toks = model.generate(prompt, turn.gen)
            out[(traj.agent_id, i)] = tuple(toks)
            ctx = prompt + toks
    return out


@pytest.fixture(scope="module")
def reference() -> dict[tuple[int, int], tuple[int, ...]]:
    return _reference()


def _run(policy: str, on_start: Callable[[RuntimeSystem], None] | None = None,
         **kw: object) -> tuple[RunResult, RuntimeSystem]:
    opts = RuntimeOptions(policy=policy, block_tokens=8, **kw)  # type: ignore[arg-type]
    with RuntimeSystem(opts) as system:
        if on_start is not None:
            on_start(system)
        result = run_agents(system, AGENTS, timeout=60)
    return result, system


@pytest.mark.parametrize("policy", ["dualpath", "basic", "round-robin", "split", "oracle"])
def test_tokens_identical_across_policies_and_to_recompute(
        policy: str, reference: dict[tuple[int, int], tuple[int, ...]]) -> None:
    result, system = _run(policy)
    assert not result.errors
    assert result.tokens_by_turn() == reference
    later = [t for t in result.turns if t.turn > 0]
    assert all(t.cached > 0 for t in later)  # hits from the agent's own earlier KV
    sides = {d.side for d in system.decisions() if d.cached}
    if policy == "round-robin":
        assert sides == {"pe", "de"}
    if policy == "split":
        assert "split" in sides


def test_a_lookup_checks_one_block_past_what_the_last_turn_stored(
        reference: dict[tuple[int, int], tuple[int, ...]]) -> None:
    """The real DE's done says how many of the turn's blocks it stored (``Done.stored``),
    so each lookup takes those as present and checks one block, the first miss."""
    result, system = _run("dualpath")
    assert not result.errors and result.tokens_by_turn() == reference
    present = system.scheduler._present
    lookups = len(result.turns) + system.scheduler.requeued
    assert present.trusted > 0 and present.checked <= lookups


class GroupLoadCheck:
    """Before every DE group fetch the scheduler handles, check that its kept phase-1 loads
    equal the sum over the live groups (their engines' tokens plus what is routed to them)
    they replaced. Installed on the loop's message seam (``on_message``) of a running
    system; ``checked``: the groups whose fetch checked them, ``bad``: mismatches (kept
    here, not raised on the scheduler's thread)."""

    def __init__(self) -> None:
        self.checked: list[int] = []
        self.bad: list[str] = []

    def install(self, system: RuntimeSystem) -> None:
        sched = system.scheduler
        assert isinstance(sched, SchedulerService)
        handle = sched.on_message

        def checked_handle(raw: Any) -> None:
            if raw.header.get("t") == "fetch" and raw.header.get("role") == "decode":
                live = sched._live_members("decode")
                kept = sched._group_loads
                if kept is not None and sched._group_loads_for is live:
                    want = {g: sched._de_group_tok.get(g, 0)
                            + sched._routed_tok.get(g, 0) for g in live}
                    if kept.as_dict() != want and len(self.bad) < 3:
                        self.bad.append(f"kept {kept.as_dict()}, summed {want}")
                    self.checked.append(int(raw.header.get("group", -1)))
            handle(raw)

        sched.on_message = checked_handle


def test_kept_group_loads_equal_the_sum_at_every_fetch() -> None:
    check = GroupLoadCheck()
    result, _ = _run("dualpath", on_start=check.install, decode_nodes=3)
    assert not result.errors and check.checked and not check.bad, check.bad


def test_de_path_returns_only_miss_kv() -> None:
    result, _ = _run("round-robin")
    cfg = load_model("tiny").config
    per_token = cfg.n_layers * cfg.kv_bytes_per_token_layer
    de_turns = [t for t in result.turns if t.cached and t.pe_tokens == 0]
    pe_turns = [t for t in result.turns if t.cached and t.pe_tokens == t.cached]
    assert de_turns and pe_turns
    for t in de_turns:
        assert t.rx_from_pe == (t.prompt - t.cached) * per_token
    for t in pe_turns:  # PE path: the DE gets hit + miss from the PE
        assert t.rx_from_pe == t.prompt * per_token


def test_corrupt_block_recomputes_with_same_tokens(
        reference: dict[tuple[int, int], tuple[int, ...]]) -> None:
    store = MemoryStore()
    traj = AGENTS[0]
    with RuntimeSystem(RuntimeOptions(policy="dualpath", block_tokens=8), store) as system:
        ctx: list[int] = []
        for i, turn in enumerate(traj.turns):
            prompt = ctx + append_token_ids(traj, i, 256).tolist()
            if i == 1:  # corrupt the first stored block of this agent's prefix
                key = prefix_keys(prompt, system.namespace)[0]
                raw = bytearray(store.raw(key))
                raw[HEADER_SIZE] ^= 0xFF  # a payload byte: the checksum no longer matches
                store.set_raw(key, bytes(raw))
            r = system.submit(TurnRequest(traj.agent_id, i, np.asarray(prompt), turn.gen)
                              ).wait(60)
            assert tuple(r.tokens) == reference[(traj.agent_id, i)]
            if i == 1:
                assert r.attempts == 2 and r.cached == 0  # recomputed from scratch
            ctx = prompt + r.tokens


def test_pe_chunks_under_a_tiny_quota_and_tokens_stay_identical(
        reference: dict[tuple[int, int], tuple[int, ...]]) -> None:
    opts = RuntimeOptions(policy="dualpath", block_tokens=8, quota_s=1e-6)
    with RuntimeSystem(opts) as system:
        result = run_agents(system, AGENTS, timeout=60)
        reports = system.scheduler.fresh_reports(time.monotonic())
    assert not result.errors
    assert result.tokens_by_turn() == reference
    pe = reports[system.engine_ids("prefill")[0]]
    assert pe["chunks"] > 0  # every prefill was cut into single-token chunks (progress rule)


def test_decisions_use_two_phase_de_placement_and_log_inputs() -> None:
    _, system = _run("dualpath")
    decisions = system.decisions()
    assert decisions
    for d in decisions:
        inputs = d.inputs
        route, place = inputs["de_route"], inputs["de_place"]
        assert route["group"] == d.de_group and place["de"] == d.de
        assert d.rid in route["queue_head"] or len(route["queue_head"]) == 8
        assert {e["id"] for e in place["engines"]} <= set(system.engine_ids("decode"))
        loads = {int(g): v for g, v in route["group_loads"].items()}
        assert loads[d.de_group] == min(loads.values())  # phase 1: min-load group
        assert [e["id"] for e in inputs["pe_engines"]] == system.engine_ids("prefill")
        # the snapshots are kept packed and read back whole, as JSON shows them
        assert {e["role"] for e in inputs["pe_engines"]} == {"prefill"}
        assert inputs["de_engine"]["role"] == "decode" and inputs["de_engine"]["id"] == d.de
        assert {e["role"] for e in place["engines"]} == {"decode"}
        assert set(place["engines"][0]) == {"id", "role", "node", "group", "seq", "tok",
                                            "read_q", "hbm_free"}
        assert json.loads(json.dumps(inputs))["de_place"]["queue_head"] == place["queue_head"]
        assert inputs["de_engine"]["read_q"] == d.de_read_q  # inputs are pre-decision
        pe_before = next(e for e in inputs["pe_engines"] if e["id"] == d.pe)
        assert pe_before["read_q"] == d.pe_read_q
        want = "de" if d.de_read_q < d.pe_read_q else "pe"  # ties go to the PE side
        assert d.side == (want if d.cached else d.side)
        assert d.pe_class == "C2" and d.de_class == place["de_class"]  # alpha, beta: 1e9


def test_read_side_sees_reads_it_just_assigned() -> None:
    """A burst of cached turns spreads over both sides even before any report comes back."""
    store = MemoryStore()
    opts = RuntimeOptions(policy="dualpath", block_tokens=8, snic_bw=2e6)
    agents = agentic_workload(6, turns=2, first_append=40, append=8, gen=2, seed=3)
    with RuntimeSystem(opts, store) as system:
        prompts = []
        for traj in agents:  # round 1 fills the store
            prompt = append_token_ids(traj, 0, 256).tolist()
            r = system.submit(TurnRequest(traj.agent_id, 0, np.asarray(prompt), 2)).wait(60)
            prompts.append(prompt + r.tokens + append_token_ids(traj, 1, 256).tolist())
        tickets = [system.submit(TurnRequest(t.agent_id, 1, np.asarray(p), 2))
                   for t, p in zip(agents, prompts, strict=True)]
        for t in tickets:
            t.wait(60)
        burst = [d for d in system.decisions() if d.turn == 1]
    assert {d.side for d in burst} == {"pe", "de"}
    assert max(d.pe_read_q for d in burst) > 0  # charged at once, seen by the next choice


def test_metrics_snapshot_from_the_launcher() -> None:
    opts = RuntimeOptions(policy="round-robin", block_tokens=8)
    with RuntimeSystem(opts) as system:
        run_agents(system, AGENTS, timeout=60)
        snap = system.metrics(fresh=True)
    pe = snap[system.engine_ids("prefill")[0]]
    assert pe["alive"] and pe["role"] == "prefill" and pe["age_s"] is not None
    names = set(pe["metrics"])
    assert {"dualpath_attention_bubble_seconds_total", "dualpath_gpu_utilization_ratio",
            "dualpath_hbm_usage_bytes", "dualpath_hbm_fragmentation_ratio",
            "dualpath_storage_read_queue_tokens", "dualpath_layer_cache_hits_total",
            "dualpath_nic_bytes_total"} <= names
    assert names <= {m.name for m in METRICS}
    tiers = {row["labels"]["tier"] for row in pe["metrics"]["dualpath_layer_cache_hits_total"]}
    assert tiers == {"store", "peer"}  # round robin: PE reads and DE-streamed layers
    read = sum(row["value"] for e in snap.values()
               for row in e["metrics"].get("dualpath_storage_read_bytes_total", []))
    assert read > 0


def test_engine_store_metrics_land_in_the_engine_registry(tmp_path: Path) -> None:
    """A POSIX store opened for an engine records into that engine's registry (heartbeats)."""
    registry = MetricsRegistry()
    store = open_store({"kind": "posix", "root": str(tmp_path)}, registry)
    shape = BlockShape(n_layers=2, block_tokens=16, bytes_per_token_layer=64)
    ns = Namespace("m", "layer_major", shape, "fp16")
    key = prefix_keys(list(range(16)), ns)[0]
    store.put(*encode_block(key, np.zeros((2, 16, 32), dtype=np.float16), ns))
    rows = registry.snapshot()["dualpath_storage_store_bytes"]
    assert rows and rows[0]["value"] == store.usage().bytes
