"""Generate Mooncake-format request logs of agent conversations that share prefixes.

Why: the public Mooncake trace may not be shipped, and tests and benchmarks need logs whose
prefix hits are known: conversations that share a system prompt, a task description and the
first tool outputs (agents started from one template fork at different depths), then grow
turn by turn with their own tool outputs and answers.

The shape, exactly: every conversation walks a prefix tree from its root: level ``d`` has
``branching[d]`` children under each node, and each node is a segment of tokens (a length
drawn once per node). A conversation's first prompt is the segments of its path plus a
segment of its own; each later turn's prompt is the previous prompt, the previous answer and
a new segment of its own (a tool output). Block ``j``'s id names the whole content up to the
end of block ``j`` (ids are chained, as Mooncake's are), so two prompts share block ``j``
exactly when they share every token up to its end. Arrival times: conversations start as a
Poisson process at ``rate_per_s``; a turn arrives ``think_s`` (exponential mean) after the
previous one's arrival plus a nominal service time.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from dualpath_cli.workload.mooncake import MOONCAKE_BLOCK_TOKENS, MooncakeRequest

__all__ = ["ConversationShape", "generate_conversations", "mooncake_lines"]


@dataclass(frozen=True, slots=True)
class ConversationShape:
    """Parameters of a generated log (defaults: a small agentic workload)."""

    conversations: int = 200
    branching: tuple[int, ...] = (2, 4, 3)   # system prompts, tasks per prompt, first tools
    shared_tokens: tuple[int, int] = (300, 3000)  # a tree segment's length range
    turns: tuple[int, int] = (2, 12)          # turns per conversation (inclusive range)
    own_tokens: tuple[int, int] = (50, 1500)  # a conversation's own segment per turn
    output_tokens: tuple[int, int] = (20, 400)
    rate_per_s: float = 2.0                   # conversation starts per second
    think_s: float = 3.0                      # mean gap between a turn's arrivals
    service_s: float = 1.0                    # nominal time a turn takes to be answered


def generate_conversations(shape: ConversationShape, seed: int) -> list[MooncakeRequest]:
    """The log's requests in arrival order (timestamps in ms from 0)."""
    rng = np.random.default_rng([seed, 36])
    ids = _BlockIds()
    tree_lengths: dict[tuple[int, ...], int] = {}
    requests: list[tuple[float, MooncakeRequest]] = []
    start_ms = 0.0
    for conv in range(shape.conversations):
        start_ms += float(rng.exponential(1000.0 / shape.rate_per_s))
        content: list[tuple[object, int]] = []  # (segment key, tokens)
        path: tuple[int, ...] = ()
        for width in shape.branching:
            path = (*path, int(rng.integers(0, width)))
            if path not in tree_lengths:
                tree_lengths[path] = int(rng.integers(shape.shared_tokens[0],
                                                      shape.shared_tokens[1] + 1))
            content.append((("tree", path), tree_lengths[path]))
        at = start_ms
        for turn in range(int(rng.integers(shape.turns[0], shape.turns[1] + 1))):
            own = int(rng.integers(shape.own_tokens[0], shape.own_tokens[1] + 1))
            content.append((("own", conv, turn), own))
            out = int(rng.integers(shape.output_tokens[0], shape.output_tokens[1] + 1))
            length = sum(n for _, n in content)
            requests.append((at, MooncakeRequest(round(at, 3), length, out,
                                                 ids.chain(content))))
            content.append((("answer", conv, turn), out))
            at += shape.service_s * 1000.0 + float(rng.exponential(shape.think_s * 1000.0))
    requests.sort(key=lambda r: r[0])
    return [r for _, r in requests]


def mooncake_lines(requests: Sequence[MooncakeRequest]) -> Iterator[str]:
    """The requests as Mooncake JSON lines (without newlines)."""
    for r in requests:
        yield json.dumps({"timestamp": r.timestamp_ms, "input_length": r.input_length,
                          "output_length": r.output_length, "hash_ids": list(r.hash_ids)},
                         separators=(",", ":"))


class _BlockIds:
    """Interns the content up to each block's end into small consecutive ids."""

    def __init__(self) -> None:
        self._ids: dict[tuple[object, ...], int] = {}

    def chain(self, content: Sequence[tuple[object, int]]) -> tuple[int, ...]:
        total = sum(n for _, n in content)
        out: list[int] = []
        end = 0
        while end < total:
            end = min(end + MOONCAKE_BLOCK_TOKENS, total)
            out.append(self._intern(_prefix_key(content, end)))
        return tuple(out)

    def _intern(self, key: tuple[object, ...]) -> int:
        found = self._ids.get(key)
        if found is None:
            found = self._ids[key] = len(self._ids)
        return found


def _prefix_key(content: Sequence[tuple[object, int]], end: int) -> tuple[object, ...]:
    """The content's first ``end`` tokens as a key: whole segments, then a cut one's length."""
    key: list[object] = []
    used = 0
    for seg, n in content:
        if used + n <= end:
            key.append(seg)
            used += n
            if used == end:
                break
        else:
            key.append((seg, end - used))
            break
    return tuple(key)
