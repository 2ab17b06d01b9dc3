"""Synthetic agent trajectories calibrated to the paper's Table 2.

Why not draw turns, append and gen independently: every trajectory's total is capped at
MaxLen, so trajectories with many turns must have small turns. Table 2 shows it:
``Turns x (Append + Gen)`` exceeds ``Total`` by 1.6-1.7x, which is only possible when turn
count and per-turn size are negatively correlated. The model here draws whole trajectories:

1. a total budget ``T`` (Beta around ``Total / MaxLen``, piled up at the cap as truncated
   RL rollouts are), and a turn count ``n`` (log-normal, stratified so 500 agents already
   give stable means) independent of ``T``; the per-turn size is then ``T / n``, so chatty
   trajectories (large turns) are short in turns;
2. a generated share ``phi`` of the budget (``G = phi T``) and the appended rest ``A``;
3. a first-round prompt (task, repository, tool schema) taking a share ``rho`` of ``A``:
   Context / Total is about 0.59 in Table 2, above the 0.5 of evenly sized turns, so the
   context must be front-loaded;
4. the remaining appends and all gens are split over the turns with gamma weights (every
   turn gets at least one appended and one generated token).

:func:`calibrate` solves the model's free parameters in closed form (or by bisection on a
fixed quantile grid) so that the expected means equal the targets of
:func:`~dualpath_cli.workload.table2.targets_for`; nothing is fitted to a particular sample.
All randomness comes from a seeded ``numpy.random.Generator``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist

import numpy as np

from dualpath_cli.errors import UsageError
from dualpath_cli.workload.table2 import Table2Row, targets_for
from dualpath_cli.workload.tokens import MAX_SEED, distinct_seeds
from dualpath_cli.workload.trajectory import Trajectory, Turn

__all__ = ["GeneratorParams", "calibrate", "generate"]

_GRID = 4096
_Z_CLIP = 3.0


@dataclass(frozen=True, slots=True)
class GeneratorParams:
    """Free parameters of the trajectory model (see the module docstring).

    Attributes:
        max_len: hard cap on every trajectory's total tokens.
        turns_median: median of the log-normal turn count.
        turns_sigma: log-space spread of the turn count (sets the turn/size dispersion).
        total_fraction: mean of ``T / max_len``.
        total_concentration: Beta concentration of ``T / max_len``.
        gen_fraction: mean share of generated tokens in a trajectory.
        gen_concentration: Beta concentration of that share.
        prompt_share: mean share of the appended tokens that round 1 carries.
        prompt_concentration: Beta concentration of that share.
        append_shape: gamma shape of the later appends within a trajectory (1 = exponential).
        gen_shape: gamma shape of the generated lengths within a trajectory.
    """

    max_len: int
    turns_median: float
    turns_sigma: float
    total_fraction: float
    gen_fraction: float
    prompt_share: float
    total_concentration: float = 4.0
    gen_concentration: float = 200.0
    prompt_concentration: float = 10.0
    append_shape: float = 0.8
    gen_shape: float = 2.0

    def to_dict(self) -> dict[str, float]:
        """Plain dict, recorded in the trace header's ``generator`` object."""
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


@lru_cache(maxsize=1)
def _normal_grid() -> np.ndarray:
    dist = NormalDist()
    return np.array([dist.inv_cdf((i + 0.5) / _GRID) for i in range(_GRID)])


def _turn_counts(median: float, sigma: float, z: np.ndarray) -> np.ndarray:
    z = np.clip(z, -_Z_CLIP, _Z_CLIP)
    return np.maximum(2.0, np.rint(median * np.exp(sigma * z)))


def _median_for(mean_turns: float, sigma: float, z: np.ndarray) -> float:
    lo, hi = 0.0, float(np.log(max(mean_turns, 2.0)) + 10.0)
    for _ in range(60):
        mid = (lo + hi) / 2
        if _turn_counts(float(np.exp(mid)), sigma, z).mean() < mean_turns:
            lo = mid
        else:
            hi = mid
    return float(np.exp((lo + hi) / 2))


def calibrate(target: Table2Row) -> GeneratorParams:
    """Solve the model's parameters so that its expected means equal ``target``.

    * ``total_fraction = Total / MaxLen``;
    * turn count: median and spread such that ``E[n] = Turns`` and, with ``T`` independent
      of ``n``, ``E[T] E[1/n] = Append + Gen`` (the per-trajectory mean turn size);
    * ``gen_fraction = Gen / (Append + Gen)`` (then ``E[G/n] = Gen`` exactly);
    * ``prompt_share`` from the exact expected per-trajectory mean context, which is linear
      in it: ``E[ctx | n, A, G, P] = (G (n-1) + A (n-2)) / (2n) + P / 2``.
    Outside what the model can reach (only for extrapolated max lengths) the nearest
    reachable value is used.
    """
    z = _normal_grid()
    size = target.append + target.gen
    want_inv = size / target.total
    lo, hi = 0.0, 2.0
    for _ in range(40):
        mid = (lo + hi) / 2
        n = _turn_counts(_median_for(target.turns, mid, z), mid, z)
        if (1.0 / n).mean() < want_inv:
            lo = mid
        else:
            hi = mid
    sigma = (lo + hi) / 2
    median = _median_for(target.turns, sigma, z)
    n = _turn_counts(median, sigma, z)
    phi = target.gen / size
    base = target.total * float((((n - 1) * phi + (n - 2) * (1 - phi)) / (2 * n)).mean())
    rho = (target.context - base) / ((1 - phi) * target.total / 2)
    return GeneratorParams(
        max_len=target.max_len,
        turns_median=median,
        turns_sigma=sigma,
        total_fraction=target.total / target.max_len,
        gen_fraction=phi,
        prompt_share=float(min(max(rho, 0.01), 0.95)),
    )


def generate(max_len: int, agents: int, seed: int,
             params: GeneratorParams | None = None) -> list[Trajectory]:
    """Draw ``agents`` trajectories for ``max_len`` with a seeded generator.

    Args:
        max_len: cap on every trajectory's total tokens.
        agents: number of trajectories (agent ids ``0..agents-1``).
        seed: seed of the ``numpy.random.Generator``; the same seed gives the same trace.
        params: model parameters; default ``calibrate(targets_for(max_len))``.

    Raises:
        UsageError: a non-positive agent count, a negative seed or a too small max_len.
    """
    if agents < 1:
        raise UsageError(f"agent count must be at least 1, got {agents}")
    if not 0 <= seed <= MAX_SEED:
        raise UsageError(f"seed must be between 0 and {MAX_SEED}, got {seed}")
    p = params if params is not None else calibrate(targets_for(max_len))
    rng = np.random.default_rng(seed)
    dist = NormalDist()
    strata = (rng.permutation(agents) + rng.random(agents)) / agents
    z = np.array([dist.inv_cdf(float(min(max(u, 1e-12), 1 - 1e-12))) for u in strata])
    n = _turn_counts(p.turns_median, p.turns_sigma, z).astype(np.int64)
    n = np.minimum(n, (max_len - 1) // 2)

    b, k = p.total_fraction, p.total_concentration
    total = np.rint(max_len * rng.beta(b * k, (1 - b) * k, size=agents)).astype(np.int64)
    total = np.clip(total, 2 * n + 1, max_len)

    phi = rng.beta(p.gen_fraction * p.gen_concentration,
                   (1 - p.gen_fraction) * p.gen_concentration, size=agents)
    gen_total = np.clip(np.rint(phi * total).astype(np.int64), n, total - n)
    append_total = total - gen_total

    rho = rng.beta(p.prompt_share * p.prompt_concentration,
                   (1 - p.prompt_share) * p.prompt_concentration, size=agents)
    prompt = np.clip(np.rint(rho * append_total).astype(np.int64), 1, append_total - (n - 1))

    gens = _split(rng, gen_total, n, p.gen_shape)
    later = _split(rng, append_total - prompt, n - 1, p.append_shape)
    seeds = distinct_seeds(rng, agents)

    out: list[Trajectory] = []
    g_at, a_at = 0, 0
    for agent in range(agents):
        count = int(n[agent])
        appends = [int(prompt[agent]), *later[a_at:a_at + count - 1].tolist()]
        turn_gens = gens[g_at:g_at + count].tolist()
        g_at += count
        a_at += count - 1
        turns = tuple(Turn(a, g) for a, g in zip(appends, turn_gens, strict=True))
        out.append(Trajectory(agent, turns, token_seed=seeds[agent]))
    return out


def _split(rng: np.random.Generator, totals: np.ndarray, parts: np.ndarray,
           shape: float) -> np.ndarray:
    """Split each ``totals[k]`` into ``parts[k]`` integers >= 1 with gamma weights.

    Cumulative rounding keeps every sum exact; the result is the concatenation of all
    trajectories' pieces.
    """
    count = int(parts.sum())
    if count == 0:
        return np.zeros(0, dtype=np.int64)
    weights = rng.gamma(shape, size=count) + 1e-12
    seg = np.repeat(np.arange(len(parts)), parts)
    ends = np.cumsum(parts)
    starts = ends - parts
    cum = np.cumsum(weights)
    before = np.where(starts > 0, cum[np.maximum(starts - 1, 0)], 0.0)
    seg_sum = cum[ends - 1] - before
    frac = (cum - before[seg]) / seg_sum[seg]
    rest = (totals - parts).astype(np.float64)
    upto = np.rint(frac * rest[seg]).astype(np.int64)
    upto[ends - 1] = (totals - parts)
    prev = np.concatenate(([0], upto[:-1]))
    prev[starts] = 0
    return upto - prev + 1

