"""Make more agents than base trajectories, the paper's way (Appendix A.3).

Each new agent replays a sampled base trajectory with one synthetic round prepended: ``A_1``
random tokens (a random length, ids from a per-agent seed) and ``g_1 = 1``. The distinct first
round makes every agent's prefix, hence every prefix-cache key, distinct, so agents never hit
each other's KV-cache even when they share a base trajectory (hits stay within a trajectory).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dualpath_cli.errors import UsageError
from dualpath_cli.workload.tokens import distinct_seeds
from dualpath_cli.workload.trajectory import Trajectory, Turn, truncate

__all__ = ["augment", "DEFAULT_PREFIX_TOKENS"]

DEFAULT_PREFIX_TOKENS: tuple[int, int] = (64, 512)
"""Inclusive range of the synthetic round's appended length (the paper gives none)."""

_AUGMENT_STREAM = 1


def augment(base: Sequence[Trajectory], agents: int, seed: int, *, max_len: int,
            prefix_tokens: tuple[int, int] = DEFAULT_PREFIX_TOKENS) -> list[Trajectory]:
    """Build ``agents`` trajectories from ``base``, each with a synthetic first round.

    Base trajectories are sampled in balanced random order (every one is used
    ``agents // len(base)`` or one more times), which keeps the base set's statistics.
    A trajectory pushed past ``max_len`` by the extra round is truncated there, as the paper
    truncates scaled trajectories at MaxLen. A base trajectory's shared prefix (a system
    prompt other conversations send too) opens the synthetic round instead, which grows by
    its length: every agent still starts with it, and differs only after it.

    Args:
        base: trajectories to sample from.
        agents: number of agents to build (ids ``0..agents-1``).
        seed: seed; the generator is ``default_rng([seed, 1])``, a stream independent of the
            one ``synthetic.generate`` draws from the same seed.
        max_len: cap on every total.
        prefix_tokens: inclusive (low, high) range of the synthetic round's appended tokens.

    Raises:
        UsageError: empty or already augmented base, agents < 1, or a bad prefix range.
    """
    lo, hi = prefix_tokens
    if not base:
        raise UsageError("cannot augment an empty set of trajectories")
    if agents < 1:
        raise UsageError(f"agent count must be at least 1, got {agents}")
    if not 1 <= lo <= hi or hi + 1 >= max_len:
        raise UsageError(f"bad synthetic round length range {lo}..{hi}: need "
                         f"1 <= low <= high < max_len - 1 ({max_len - 1})")
    if any(t.prefix_seed is not None for t in base):
        raise UsageError("cannot augment trajectories that already have a synthetic round")
    rng = np.random.default_rng([seed, _AUGMENT_STREAM])
    rounds = -(-agents // len(base))
    picks = np.concatenate([rng.permutation(len(base)) for _ in range(rounds)])[:agents]
    lengths = rng.integers(lo, hi + 1, size=agents)
    prefix_seeds = distinct_seeds(rng, agents)
    out: list[Trajectory] = []
    for agent in range(agents):
        src = base[int(picks[agent])]
        turns = (Turn(int(lengths[agent]) + src.shared_tokens, 1), *src.turns)
        traj = Trajectory(agent, turns, token_seed=src.token_seed,
                          prefix_seed=prefix_seeds[agent], source=src.agent_id,
                          shared=src.shared)
        out.append(truncate(traj, max_len))
    return out
