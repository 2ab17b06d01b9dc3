"""Assemble a complete synthetic trace: base trajectories, augmentation, header."""

from __future__ import annotations

from dualpath_cli import __version__
from dualpath_cli.errors import UsageError
from dualpath_cli.workload.augment import DEFAULT_PREFIX_TOKENS, augment
from dualpath_cli.workload.synthetic import calibrate, generate
from dualpath_cli.workload.table2 import targets_for
from dualpath_cli.workload.trace_format import Trace, TraceHeader

__all__ = ["synthetic_trace", "DEFAULT_BASE_AGENTS"]

DEFAULT_BASE_AGENTS = 500
"""Trajectories per Table 2 set in the paper; more agents are made by augmentation."""


def synthetic_trace(max_len: int, agents: int, seed: int, *,
                    base_agents: int = DEFAULT_BASE_AGENTS,
                    prefix_tokens: tuple[int, int] = DEFAULT_PREFIX_TOKENS) -> Trace:
    """A Table 2-calibrated trace of ``agents`` agents.

    Up to ``base_agents`` agents are drawn directly; beyond that, ``base_agents`` base
    trajectories are drawn and every agent replays one of them behind a synthetic first
    round (``g = 1``), as the paper builds its 1K-48K agent runs from 500 trajectories.
    Raises:
        UsageError: a bad count, seed, max length or prefix range.

    The header's ``generator`` object records everything needed to reproduce the trace.
    """
    if base_agents < 1:
        raise UsageError(f"base agent count must be at least 1, got {base_agents}")
    target = targets_for(max_len)
    params = calibrate(target)
    augmented = agents > base_agents
    base = generate(max_len, base_agents if augmented else agents, seed, params)
    trajectories = (augment(base, agents, seed, max_len=max_len, prefix_tokens=prefix_tokens)
                    if augmented else base)
    generator: dict[str, object] = {
        "name": "dualpath-synthetic",
        "dualpath_version": __version__,
        "seed": seed,
        "agents": agents,
        "base_agents": base_agents if augmented else agents,
        "augmented": augmented,
        "targets": target.to_dict(),
        "params": params.to_dict(),
    }
    if augmented:
        generator["prefix_tokens"] = list(prefix_tokens)
    return Trace(TraceHeader(max_len=max_len, generator=generator), tuple(trajectories))
