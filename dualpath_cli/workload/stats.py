"""Table 2 statistics of a set of trajectories.

Definitions (docs/trace-format.md explains why): ``turns`` and ``total`` are means over
trajectories; ``append``, ``gen`` and ``context`` are means over trajectories of each
trajectory's per-turn mean (trajectory-weighted). Pooled, turn-weighted variants are reported
too under ``*_turn_weighted``. Pooled per-turn means are forced to equal Total / Turns, which
Table 2 contradicts (Turns x (Append + Gen) > Total), so the paper's per-turn columns can only
be trajectory-weighted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from dualpath_cli.workload.prefix_store import GlobalPrefixStore
from dualpath_cli.workload.trace_format import DEFAULT_BLOCK_TOKENS
from dualpath_cli.workload.trajectory import Trajectory

__all__ = ["TraceStats", "trace_stats", "chain_hits", "shared_chain", "shared_hits"]


@dataclass(frozen=True, slots=True)
class TraceStats:
    """Means of a trace; the first six fields are Table 2's columns plus the agent count.

    Attributes:
        agents: number of trajectories.
        turns: mean turns per trajectory.
        append: mean appended tokens per turn (trajectory-weighted).
        gen: mean generated tokens per turn (trajectory-weighted).
        total: mean total tokens per trajectory.
        context: mean context (hit) length per turn (trajectory-weighted).
        max_total: largest trajectory total.
        min_total: smallest trajectory total.
        turns_sum: turns over all trajectories (requests a replay sends).
        append_turn_weighted: pooled mean append over all turns.
        gen_turn_weighted: pooled mean gen over all turns.
        context_turn_weighted: pooled mean context over all turns.
        dispersion: ``turns x (append + gen) / total`` (1 when turn count and size unrelated).
        turn_size_corr: Pearson correlation of a trajectory's turn count and mean turn size.
        turn_size_rank_corr: Spearman rank correlation of the same.
        hit_ratio: token-weighted prefix hit ratio of a replay as a global KV store sees it:
            hit tokens / sum(prompt). A trajectory with ``blocks`` hits what its chains find
            in one store shared by every trajectory (``workload.prefix_store``; trajectories
            taken by ``start_s``, then file order, each turn by turn); one without hits its
            context and its first turn's shared prefix.
        shared_hit_tokens: hit tokens another conversation stored: a shared prefix an
            earlier trajectory (in file order) opened with too (at least one token of a
            prompt is always computed), or, with ``blocks``, the chain's cross-conversation
            hits.
        cross_conversation_hit_share: shared_hit_tokens over all hit tokens (0 when none).
    """

    agents: int
    turns: float
    append: float
    gen: float
    total: float
    context: float
    max_total: int
    min_total: int
    turns_sum: int
    append_turn_weighted: float
    gen_turn_weighted: float
    context_turn_weighted: float
    dispersion: float
    turn_size_corr: float
    turn_size_rank_corr: float
    hit_ratio: float
    shared_hit_tokens: int = 0
    cross_conversation_hit_share: float = 0.0

    def to_dict(self) -> dict[str, float]:
        """All fields as a plain dict (the ``--json`` keys)."""
        return asdict(self)


def trace_stats(trajectories: Sequence[Trajectory],
                block_tokens: int = DEFAULT_BLOCK_TOKENS,
                outputs_stored: bool = False) -> TraceStats:
    """Compute :class:`TraceStats`; trajectories without turns count in none of the means.
    ``block_tokens``: tokens one id of a trajectory's ``blocks`` covers (the trace header's);
    ``outputs_stored``: the header's (``workload.prefix_store`` rule 4).

    Raises:
        ValueError: no trajectory has a turn.
    """
    trajs = [t for t in trajectories if t.turns]
    if not trajs:
        raise ValueError("no trajectory with at least one turn")
    n = np.array([t.num_turns for t in trajs], dtype=np.float64)
    total = np.array([t.total for t in trajs], dtype=np.float64)
    append = np.array([t.total_append for t in trajs], dtype=np.float64)
    gen = np.array([t.total_gen for t in trajs], dtype=np.float64)
    ctx_sum = np.array([sum(t.context_lengths()) for t in trajs], dtype=np.float64)
    size = total / n
    turns_sum = float(n.sum())
    prompts = ctx_sum.sum() + append.sum()
    plain = [t for t in trajs if not t.blocks]
    shared = shared_hits(plain)
    hits = float(sum(sum(t.context_lengths()) for t in plain)) + sum(shared)
    chained, cross = chain_hits([t for t in trajs if t.blocks], block_tokens, outputs_stored)
    hits += chained
    shared.append(cross)
    mean_size = float((append / n).mean() + (gen / n).mean())
    return TraceStats(
        agents=len(trajs),
        turns=float(n.mean()),
        append=float((append / n).mean()),
        gen=float((gen / n).mean()),
        total=float(total.mean()),
        context=float((ctx_sum / n).mean()),
        max_total=int(total.max()),
        min_total=int(total.min()),
        turns_sum=int(turns_sum),
        append_turn_weighted=float(append.sum() / turns_sum),
        gen_turn_weighted=float(gen.sum() / turns_sum),
        context_turn_weighted=float(ctx_sum.sum() / turns_sum),
        dispersion=float(n.mean() * mean_size / total.mean()),
        turn_size_corr=_corr(n, size),
        turn_size_rank_corr=_corr(_ranks(n), _ranks(size)),
        hit_ratio=float(hits / prompts) if prompts else 0.0,
        shared_hit_tokens=int(sum(shared)),
        cross_conversation_hit_share=float(sum(shared) / hits) if hits else 0.0,
    )


def chain_hits(trajectories: Sequence[Trajectory], block_tokens: int,
               outputs_stored: bool = False) -> tuple[int, int]:
    """Hit tokens of trajectories with ``blocks`` in one global store, and how many of them
    are cross-conversation: trajectories by ``start_s`` (then in order), turn by turn
    (``outputs_stored``: ``workload.prefix_store`` rule 4)."""
    store = GlobalPrefixStore(block_tokens)
    hits = cross = 0
    order = sorted(trajectories, key=lambda t: t.start_s or 0.0)
    for t in order:
        previous: tuple[int, ...] = ()
        for i, chain in enumerate(t.blocks):
            prompt = t.prompt_length(i)
            context = prompt - t.turns[i].append if outputs_stored and i else None
            hit = store.replay_hit(chain, prompt, previous, context)
            store.store(chain)
            hits += hit.tokens
            cross += hit.cross
            previous = chain
    return hits, cross


def shared_chain(shared: Sequence[tuple[int, int]]) -> list[int]:
    """Chained keys of shared-prefix segments: key ``j`` names segments ``0..j`` (two
    trajectories share it only if they share every segment up to ``j``)."""
    keys: list[int] = []
    key = 0
    for seg in shared:
        key = hash((key, seg))
        keys.append(key)
    return keys


def shared_hits(trajectories: Sequence[Trajectory]) -> list[int]:
    """First-turn shared-prefix hit tokens of each trajectory, taken in order against an
    unbounded store that holds every earlier trajectory's shared prefix (a global KV store:
    a system prompt every conversation sends is a hit from the second one on)."""
    stored: set[int] = set()
    out: list[int] = []
    for t in trajectories:
        if not t.shared or not t.turns:
            out.append(0)
            continue
        chain = shared_chain(t.shared)
        hit = 0
        for key, (_, n) in zip(chain, t.shared, strict=True):
            if key not in stored:
                break
            hit += n
        out.append(min(hit, t.turns[0].append - 1))
        stored.update(chain)
    return out


def _corr(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson correlation; NaN when either side is constant (reported as null in JSON)."""
    if len(x) < 2 or x.std() == 0 or y.std() == 0:
        return float("nan")
    return float(np.corrcoef(x, y)[0, 1])


def _ranks(x: np.ndarray) -> np.ndarray:
    """Average ranks (ties share the mean rank), for Spearman's correlation."""
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x), dtype=np.float64)
    ranks[order] = np.arange(len(x), dtype=np.float64)
    _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=ranks)
    return sums[inverse] / counts[inverse]
