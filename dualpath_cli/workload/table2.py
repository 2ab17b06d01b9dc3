"""The paper's Table 2 (agent-trace statistics) and targets for any maximum length.

Table 2 lists, per MaxLen, the means of Turns (per trajectory), Append and Gen (tokens per
turn), Total (tokens per trajectory) and Context (context tokens). The three rows are the
calibration points of the synthetic generator. For another max length the targets are
interpolated linearly between rows (as ratios that stay meaningful: Total / MaxLen,
Context / Total and the turn/size dispersion, see :func:`targets_for`) and held at the nearest
row outside the 32K..64K range, so turns scale with the budget and per-turn sizes stay put.
"""

from __future__ import annotations

from dataclasses import dataclass

from dualpath_cli.errors import UsageError

__all__ = ["Table2Row", "TABLE2", "MIN_MAX_LEN", "targets_for", "dispersion"]

MIN_MAX_LEN = 256
"""Smallest max length the generator accepts (a few turns of a few tokens each)."""

_MIN_TURNS = 4.0


@dataclass(frozen=True, slots=True)
class Table2Row:
    """Means of one trace set. Append and Gen are per-turn means (see docs/trace-format.md)."""

    max_len: int
    turns: float
    append: float
    gen: float
    total: float
    context: float

    def to_dict(self) -> dict[str, float]:
        """The row as the stats keys (``turns append gen total context``) plus ``max_len``."""
        return {"max_len": self.max_len, "turns": self.turns, "append": self.append,
                "gen": self.gen, "total": self.total, "context": self.context}


TABLE2: tuple[Table2Row, ...] = (
    Table2Row(32_000, 60, 608, 148, 28_639, 17_183),
    Table2Row(48_000, 106, 474, 172, 42_607, 25_120),
    Table2Row(64_000, 157, 429, 176, 55_958, 32_721),
)
"""Paper Table 2 (500 production trajectories each). MaxLen "32K" is read as 32,000 tokens
(``units.parse_tokens``: K = 1000); every Total in the table is below either reading."""


def dispersion(row: Table2Row) -> float:
    """``Turns x (Append + Gen) / Total``: 1 when turn count and turn size are unrelated.

    Table 2 has 1.58, 1.61 and 1.70: long trajectories have small turns. Because Append and
    Gen are per-trajectory means, this equals ``E[n] E[T/n] / E[T]`` (n turns, T total).
    """
    return row.turns * (row.append + row.gen) / row.total


def targets_for(max_len: int) -> Table2Row:
    """The Table 2 means the generator aims at for ``max_len`` tokens.

    The three paper rows are returned exactly. Between them every quantity that is a ratio
    (Total / MaxLen, Context / Total, the dispersion) and the per-turn sizes are interpolated
    linearly in ``max_len``; outside they are held at the nearest row. Turns then follow from
    ``dispersion x Total / (Append + Gen)``, so they grow with the budget. Below a budget of
    four turns the per-turn sizes shrink instead.

    Raises:
        UsageError: ``max_len`` below ``MIN_MAX_LEN``.
    """
    if max_len < MIN_MAX_LEN:
        raise UsageError(f"max length {max_len} is too small: need at least {MIN_MAX_LEN} "
                         "tokens")
    for row in TABLE2:
        if row.max_len == max_len:
            return row
    lo, hi = _bracket(max_len)
    w = 0.0 if hi is lo else (max_len - lo.max_len) / (hi.max_len - lo.max_len)

    def mix(a: float, b: float) -> float:
        return a + w * (b - a)

    total = max_len * mix(lo.total / lo.max_len, hi.total / hi.max_len)
    context = total * mix(lo.context / lo.total, hi.context / hi.total)
    append, gen = mix(lo.append, hi.append), mix(lo.gen, hi.gen)
    disp = mix(dispersion(lo), dispersion(hi))
    turns = disp * total / (append + gen)
    if turns < _MIN_TURNS:
        shrink = turns / _MIN_TURNS
        append, gen, turns = append * shrink, gen * shrink, _MIN_TURNS
    return Table2Row(max_len, turns, append, gen, total, context)


def _bracket(max_len: int) -> tuple[Table2Row, Table2Row]:
    if max_len <= TABLE2[0].max_len:
        return TABLE2[0], TABLE2[0]
    if max_len >= TABLE2[-1].max_len:
        return TABLE2[-1], TABLE2[-1]
    for lo, hi in zip(TABLE2, TABLE2[1:], strict=False):
        if lo.max_len <= max_len <= hi.max_len:
            return lo, hi
    raise AssertionError("unreachable")  # pragma: no cover
