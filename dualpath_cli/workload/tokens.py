"""Deterministic token ids for trace replay, derived from seeds instead of stored.

A trace records only lengths; the runtime needs real token ids to build prefix-hash keys and
to feed a model. The ids of a turn's appended tokens are a pure function of
``(seed, base turn index)``, so they never need to be stored and a replay is reproducible.

Keying: base turns use ``(token_seed, j)`` where ``j`` counts the base trajectory's turns, so
agents augmented from the same base trajectory share those ids, exactly like replaying one real
trajectory several times. An augmented first round uses ``(prefix_seed, 0)``: its ids differ per
agent, and because prefix-hash keys chain over the whole prefix (each block's key includes its
parent's), every later block key differs too. Generated tokens get their own stream; a runtime
that samples from a real model may use the model's tokens instead.

Shared prefixes: a trajectory's ``shared`` segments ``(seed, tokens)`` open its first turn
with ids keyed by the segment alone, ``(seed, tokens)`` on a stream of their own, so every
trajectory that starts with the same segments sends the same ids (a shared system prompt)
and a content-addressed store finds one conversation's blocks for another. An augmented
agent's synthetic first round opens with its base trajectory's shared prefix.

Block chains: a turn with a chain of block ids (``Trajectory.blocks``, a request log's hash
ids) sends the ids its blocks name instead (:func:`chain_token_ids`): block id ``h`` is
``block_tokens`` ids keyed by ``h`` alone, on a stream of their own, so equal ids send equal
tokens in any conversation and a content-addressed store hits exactly what the log's store
held (``workload.prefix_store``).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

from dualpath_cli.workload.trajectory import Trajectory

__all__ = [
    "DEFAULT_VOCAB",
    "MAX_SEED",
    "seeded_ids",
    "append_token_ids",
    "gen_token_ids",
    "prompt_token_ids",
    "shared_prefix_ids",
    "chain_token_ids",
    "distinct_seeds",
]

DEFAULT_VOCAB = 32_000
MAX_SEED = 2**63 - 1
"""Largest seed a trace may carry (seeds fit a signed 64-bit integer)."""

_APPEND, _GEN, _SHARED, _BLOCK = 0, 1, 2, 3


def seeded_ids(seed: int, index: int, stream: int, length: int,
               vocab_size: int = DEFAULT_VOCAB) -> np.ndarray:
    """``length`` token ids in ``[0, vocab_size)`` from the key ``(seed, index, stream)``."""
    if length < 0:
        raise ValueError(f"length must be non-negative, got {length}")
    rng = np.random.default_rng(np.random.SeedSequence([seed, index, stream]))
    return rng.integers(0, vocab_size, size=length, dtype=np.int64).astype(np.int32)


def _key(traj: Trajectory, i: int) -> tuple[int, int]:
    """(seed, index) of turn ``i``: the prefix seed for an augmented round 1, else the base."""
    if not 0 <= i < traj.num_turns:
        raise IndexError(f"turn {i} out of range for {traj.num_turns} turns")
    if traj.prefix_seed is None:
        return traj.token_seed, i
    if i == 0:
        return traj.prefix_seed, 0
    return traj.token_seed, i - 1


def shared_prefix_ids(segments: Sequence[tuple[int, int]],
                      vocab_size: int = DEFAULT_VOCAB) -> np.ndarray:
    """Ids of shared-prefix segments: segment ``(seed, n)`` is ``n`` ids keyed by
    ``(seed, n)`` alone, so equal segments are equal ids in any trajectory."""
    parts = [seeded_ids(seed, n, _SHARED, n, vocab_size) for seed, n in segments]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)


def append_token_ids(traj: Trajectory, i: int, vocab_size: int = DEFAULT_VOCAB) -> np.ndarray:
    """Ids of the tokens turn ``i`` appends (length ``turns[i].append``); a first turn
    starts with the trajectory's shared prefix, if it has one (an augmented agent's
    synthetic round too: the rest of it is still its own)."""
    seed, index = _key(traj, i)
    if i == 0 and traj.shared:
        head = shared_prefix_ids(traj.shared, vocab_size)
        tail = seeded_ids(seed, index, _APPEND, traj.turns[i].append - len(head), vocab_size)
        return np.concatenate([head, tail])
    return seeded_ids(seed, index, _APPEND, traj.turns[i].append, vocab_size)


def gen_token_ids(traj: Trajectory, i: int, vocab_size: int = DEFAULT_VOCAB) -> np.ndarray:
    """Stand-in ids of the tokens turn ``i`` generates (length ``turns[i].gen``)."""
    seed, index = _key(traj, i)
    return seeded_ids(seed, index, _GEN, traj.turns[i].gen, vocab_size)


def prompt_token_ids(traj: Trajectory, i: int, vocab_size: int = DEFAULT_VOCAB) -> np.ndarray:
    """The full prompt of turn ``i``: every earlier append and gen, then this append.

    Its length is ``traj.prompt_length(i)``; its first ``traj.hit_length(i)`` ids are the
    context, identical to the ids of turn ``i - 1``'s prompt plus its generated tokens.
    """
    parts: list[np.ndarray] = []
    for j in range(i):
        parts.append(append_token_ids(traj, j, vocab_size))
        parts.append(gen_token_ids(traj, j, vocab_size))
    parts.append(append_token_ids(traj, i, vocab_size))
    return np.concatenate(parts)


@functools.lru_cache(maxsize=4096)
def _block_ids(block: int, block_tokens: int, vocab_size: int) -> np.ndarray:
    """The ids block id ``block`` names (read-only: the cache hands out one array)."""
    ids = seeded_ids(block, 0, _BLOCK, block_tokens, vocab_size)
    ids.flags.writeable = False
    return ids


def chain_token_ids(traj: Trajectory, i: int, block_tokens: int,
                    vocab_size: int = DEFAULT_VOCAB) -> np.ndarray:
    """The prompt of turn ``i`` of a trajectory with block chains: each block id's
    ``block_tokens`` ids in chain order, cut to ``traj.prompt_length(i)``; a chain that
    covers fewer tokens (a log whose request dropped part of the previous answer) is padded
    with the turn's own append ids.

    Why: the ids, not the conversation's history, say what the prompt holds (the log's
    store saw these blocks), so equal ids are equal tokens and equal prefixes, in this
    conversation or in another.

    Raises:
        ValueError: ``traj`` has no block chains.
    """
    if not traj.blocks:
        raise ValueError(f"agent {traj.agent_id}: no block chains to derive a prompt from")
    length = traj.prompt_length(i)
    chain = traj.blocks[i][:-(-length // block_tokens)]
    parts = [_block_ids(h, block_tokens, vocab_size) for h in chain]
    have = len(chain) * block_tokens
    if have < length:
        seed, index = _key(traj, i)
        parts.append(seeded_ids(seed, index, _APPEND, length - have, vocab_size))
    if not parts:
        return np.zeros(0, dtype=np.int32)
    return np.concatenate(parts)[:length]


def distinct_seeds(rng: np.random.Generator, count: int, *, exclude: frozenset[int] = frozenset(),
                   high: int = MAX_SEED) -> list[int]:
    """``count`` distinct seeds in ``[1, high)`` not in ``exclude`` (redrawn on collision)."""
    seeds: list[int] = []
    seen: set[int] = set(exclude)
    while len(seeds) < count:
        for value in rng.integers(1, high, size=count - len(seeds)).tolist():
            if value not in seen:
                seen.add(value)
                seeds.append(value)
    return seeds
