"""Scheduler thresholds as ``dualpath status`` shows them, for every command that shows one.

Why one place: ``status`` said "alpha 3s" where ``tune suggest`` said "alpha 4s" for the same
cluster, because each turned tokens into seconds its own way. Alpha reads in seconds of
reading where the cluster says what a token stands for (its status' ``alpha_s``), else in
tokens; beta in tokens; the quota as a duration.
"""

from __future__ import annotations

from dualpath_cli.units import format_duration, format_duration_rounded, format_tokens

__all__ = ["alpha_text", "beta_text", "quota_text"]


def alpha_text(tokens: float, alpha_s: float | None = None) -> str:
    """Alpha as the config gives it (``3s``) when ``alpha_s`` is known, else ``N tok``."""
    return (format_duration_rounded(alpha_s) if alpha_s is not None
            else f"{format_tokens(tokens)} tok")


def beta_text(tokens: float) -> str:
    """Beta in tokens (``84K tok``)."""
    return f"{format_tokens(tokens)} tok"


def quota_text(seconds: float) -> str:
    """The compute quota as a duration (``300ms``)."""
    return format_duration(seconds)
