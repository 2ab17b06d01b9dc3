"""What a global KV store hits for a chain of block ids: one rule for stats, sim and twin.

Why one module: the simulator, ``trace stats`` and the twin must count the hits a global,
content-addressed store sees (a request log's prefix hits, within a conversation and across
conversations, at any depth), and must count them the same way as the independent count of a
Mooncake log (``workload.mooncake.prefix_hits``).

The rule, exactly (a chain is the ids of one prompt's blocks of ``block_tokens`` tokens,
chained: equal ids mean equal tokens and equal prefixes):

1. the hit is the longest leading run of the chain's ids already stored, worth
   ``min(block_tokens * run, prompt_tokens)`` tokens (the last block may be partial);
2. of those, the tokens of the leading blocks the conversation's own previous prompt sent
   too (same ids) are hits *within* the conversation; the rest are *cross-conversation* hits
   (a shared system prompt, a tool output another agent sent first, a forked conversation);
3. then every id of the chain is stored (nothing is evicted);
4. where a trace says so (a recording of the runtime: ``outputs_stored``), a turn's generated
   tokens' whole blocks are stored too: before the conversation's next prompt is looked up,
   the ids of that prompt's chain covering the previous prompt and its generated tokens but
   the last (whose KV is never computed) are stored (:meth:`GlobalPrefixStore.store_context`);
   they are the conversation's own blocks (hits on them are within the conversation).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["ChainHit", "GlobalPrefixStore"]


@dataclass(frozen=True, slots=True)
class ChainHit:
    """Hit tokens of one prompt, and how many of them another conversation stored."""

    tokens: int
    cross: int


class GlobalPrefixStore:
    """An unbounded store of chained block ids."""

    __slots__ = ("block_tokens", "_stored")

    def __init__(self, block_tokens: int) -> None:
        if block_tokens < 1:
            raise ValueError(f"block_tokens must be positive, got {block_tokens}")
        self.block_tokens = block_tokens
        self._stored: set[int] = set()

    def __len__(self) -> int:
        return len(self._stored)

    def lookup(self, chain: Sequence[int], prompt_tokens: int,
               previous: Sequence[int] = ()) -> ChainHit:
        """The hit of a prompt of ``prompt_tokens`` tokens whose blocks are ``chain``;
        ``previous``: the chain of the conversation's previous prompt (none for a first)."""
        stored = self._stored
        bt = self.block_tokens
        tokens = own = 0
        same = True
        for j, block in enumerate(chain):
            if tokens >= prompt_tokens or block not in stored:
                break
            n = min(bt, prompt_tokens - tokens)
            tokens += n
            same = same and j < len(previous) and previous[j] == block
            if same:
                own += n
        return ChainHit(tokens, tokens - own)

    def store(self, chain: Sequence[int]) -> None:
        """Store every id of ``chain``."""
        self._stored.update(chain)

    def store_context(self, chain: Sequence[int], context_tokens: int,
                      previous: Sequence[int] = ()) -> tuple[int, ...]:
        """Store the ids of ``chain`` (the next prompt's) whose blocks lie within its first
        ``context_tokens`` tokens less one: the previous turn's prompt and generated tokens,
        as a runtime whose decode engine writes them back holds them (rule 4). Returns
        ``previous`` (the previous prompt's chain) extended by the generated blocks' ids: the
        conversation's own chain, the ``previous`` of :meth:`lookup`."""
        ids = chain[:max(0, context_tokens - 1) // self.block_tokens]
        self._stored.update(ids)
        return (*previous, *ids[len(previous):])

    def replay_hit(self, chain: Sequence[int], prompt_tokens: int,
                   previous: Sequence[int] = (), context_tokens: int | None = None
                   ) -> ChainHit:
        """What a replay of one turn hits, without storing its chain: rule 4 first where
        ``context_tokens`` (the previous turns' tokens) is given, then :meth:`lookup`, capped
        so one token of the prompt is always computed (its cross part within the cap).
        ``trace stats`` and the simulator count a turn by this one method."""
        if context_tokens is not None:
            previous = self.store_context(chain, context_tokens, previous)
        found = self.lookup(chain, prompt_tokens, previous)
        tokens = min(found.tokens, prompt_tokens - 1)
        return ChainHit(tokens, min(found.cross, tokens))

    def visit(self, chain: Sequence[int], prompt_tokens: int,
              previous: Sequence[int] = ()) -> ChainHit:
        """``lookup`` then ``store``: one request as the store sees it."""
        hit = self.lookup(chain, prompt_tokens, previous)
        self._stored.update(chain)
        return hit
