"""Seeded token ids per turn, and augmentation to more agents (checklist A2)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from dualpath_cli.errors import UsageError
from dualpath_cli.workload.augment import augment
from dualpath_cli.workload.build import synthetic_trace
from dualpath_cli.workload.stats import trace_stats
from dualpath_cli.workload.synthetic import generate
from dualpath_cli.workload.table2 import TABLE2
from dualpath_cli.workload.tokens import (
    append_token_ids,
    gen_token_ids,
    prompt_token_ids,
    seeded_ids,
)
from dualpath_cli.workload.trajectory import Trajectory, Turn

TRAJ = Trajectory(0, (Turn(40, 3), Turn(7, 2), Turn(9, 4)), token_seed=1234)


def test_token_ids_are_pure_and_sized() -> None:
    a = append_token_ids(TRAJ, 1)
    assert len(a) == 7 and a.dtype == np.int32
    assert np.array_equal(a, append_token_ids(TRAJ, 1))
    assert len(gen_token_ids(TRAJ, 2)) == 4
    assert not np.array_equal(seeded_ids(1, 0, 0, 64), seeded_ids(1, 1, 0, 64))
    assert not np.array_equal(seeded_ids(1, 0, 0, 64), seeded_ids(1, 0, 1, 64))
    assert not np.array_equal(seeded_ids(1, 0, 0, 64), seeded_ids(2, 0, 0, 64))
    ids = seeded_ids(9, 9, 0, 5000, vocab_size=100)
    assert ids.min() >= 0 and ids.max() < 100


def test_prompt_ids_extend_the_previous_prompt() -> None:
    for i in range(1, TRAJ.num_turns):
        prompt = prompt_token_ids(TRAJ, i)
        assert len(prompt) == TRAJ.prompt_length(i)
        previous = np.concatenate([prompt_token_ids(TRAJ, i - 1), gen_token_ids(TRAJ, i - 1)])
        assert np.array_equal(prompt[: TRAJ.hit_length(i)], previous)


def test_augmented_agents_have_distinct_first_rounds() -> None:
    base = generate(32_000, 500, 1)
    agents = augment(base, 1200, seed=1, max_len=32_000)
    assert len(agents) == 1200
    assert [a.agent_id for a in agents] == list(range(1200))
    assert all(a.turns[0].gen == 1 and 64 <= a.turns[0].append <= 512 for a in agents)
    assert len({a.prefix_seed for a in agents}) == 1200
    firsts = {append_token_ids(a, 0).tobytes() for a in agents}
    assert len(firsts) == 1200
    assert all(a.total <= 32_000 for a in agents)
    uses = Counter(a.source for a in agents)
    assert set(uses.values()) <= {2, 3} and len(uses) == 500  # balanced sampling


def test_augmented_agents_replay_their_base_turns() -> None:
    base = generate(32_000, 20, 2)
    agents = augment(base, 60, seed=2, max_len=32_000)
    by_id = {b.agent_id: b for b in base}
    twins: dict[int, list[Trajectory]] = {}
    for a in agents:
        src = by_id[a.source]  # type: ignore[index]
        assert a.token_seed == src.token_seed
        n = a.num_turns - 1
        assert a.turns[1:n] == src.turns[1 - 1:n - 1]
        twins.setdefault(src.agent_id, []).append(a)
    first, second = next(v for v in twins.values() if len(v) >= 2)[:2]
    # base turns share ids, the synthetic round and so every prefix differ
    assert np.array_equal(append_token_ids(first, 1), append_token_ids(second, 1))
    assert not np.array_equal(prompt_token_ids(first, 1)[:64], prompt_token_ids(second, 1)[:64])


def test_augmentation_keeps_table2_shape() -> None:
    row = TABLE2[2]
    trace = synthetic_trace(row.max_len, 1024, 3)
    assert trace.header.generator["augmented"] is True
    stats = trace_stats(trace.trajectories)
    assert stats.agents == 1024
    assert stats.max_total <= row.max_len
    assert stats.turns == pytest.approx(row.turns + 1, rel=0.05)
    assert stats.total == pytest.approx(row.total, rel=0.05)


def test_small_runs_are_not_augmented() -> None:
    trace = synthetic_trace(48_000, 30, 3)
    assert trace.header.generator["augmented"] is False
    assert all(t.prefix_seed is None for t in trace.trajectories)


@pytest.mark.parametrize("kwargs", [
    {"agents": 0}, {"prefix_tokens": (0, 5)}, {"prefix_tokens": (9, 5)},
    {"prefix_tokens": (5, 40_000)},
])
def test_bad_augment_arguments(kwargs: dict[str, object]) -> None:
    args: dict[str, object] = {"agents": 10, "seed": 1, "max_len": 32_000, **kwargs}
    with pytest.raises(UsageError):
        augment(generate(32_000, 3, 1), **args)  # type: ignore[arg-type]


def test_cannot_augment_empty_or_augmented() -> None:
    with pytest.raises(UsageError):
        augment([], 5, 1, max_len=1000)
    twice = augment(generate(32_000, 3, 1), 5, 1, max_len=32_000)
    with pytest.raises(UsageError, match="already"):
        augment(twice, 9, 1, max_len=32_000)
