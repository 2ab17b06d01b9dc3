"""Embedded runtime correctness: same tokens on every path, DE-path bytes, corruption."""

from __future__ import annotations

import numpy as np
import pytest

from dualpath_cli.runtime.blockstore import MemoryBlockStore
from dualpath_cli.runtime.model import load_model
from dualpath_cli.runtime.runner import RunResult, run_agents
from dualpath_cli.runtime.scheduler import TurnRequest
from dualpath_cli.runtime.system import RuntimeOptions, RuntimeSystem
from dualpath_cli.runtime.workloads import agentic_workload
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


def _run(policy: str, **kw: object) -> tuple[RunResult, RuntimeSystem]:
    opts = RuntimeOptions(policy=policy, block_tokens=8, **kw)  # type: ignore[arg-type]
    with RuntimeSystem(opts) as system:
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
    sides = {d["side"] for d in system.scheduler.decisions if d["cached"]}
    if policy == "round-robin":
        assert sides == {"pe", "de"}
    if policy == "split":
        assert "split" in sides


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
    model = load_model("tiny")
    store = MemoryBlockStore((model.n_layers, 8, model.kv_bytes_per_token_layer))
    traj = AGENTS[0]
    with RuntimeSystem(RuntimeOptions(policy="dualpath", block_tokens=8), store) as system:
        ctx: list[int] = []
        for i, turn in enumerate(traj.turns):
            prompt = ctx + append_token_ids(traj, i, 256).tolist()
            if i == 1:  # corrupt the first stored block of this agent's prefix
                from dualpath_cli.core.layout import prefix_keys
                store.corrupt(prefix_keys(prompt, system.namespace)[0])
            r = system.submit(TurnRequest(traj.agent_id, i, np.asarray(prompt), turn.gen)
                              ).wait(60)
            assert tuple(r.tokens) == reference[(traj.agent_id, i)]
            if i == 1:
                assert r.attempts == 2 and r.cached == 0  # recomputed from scratch
            ctx = prompt + r.tokens
