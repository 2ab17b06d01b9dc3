"""Agent trajectories: turns of appended and generated tokens, and their replay lengths.

The paper's replay semantics (Appendix A.3): round ``i`` appends ``A_i`` tokens (tool output,
or the task prompt in round 1) and forces exactly ``g_i`` generated tokens. The prompt of round
``i`` is ``Context_i + A_i`` where ``Context_i = A_1, G_1, ..., A_{i-1}, G_{i-1}``; the whole
context is a prefix-cache hit (hits only happen within a trajectory, no eviction), so the hit
length of round ``i`` equals ``len(Context_i)`` and only ``A_i`` needs prefill compute.

Turn indices are 0-based in code (``turns[0]`` is round 1 of the paper).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import accumulate

__all__ = ["Turn", "Trajectory", "truncate"]


@dataclass(frozen=True, slots=True)
class Turn:
    """One round: ``append`` new prompt tokens, then exactly ``gen`` generated tokens."""

    append: int
    gen: int

    @property
    def size(self) -> int:
        """Tokens this round adds to the trajectory (append + gen)."""
        return self.append + self.gen


@dataclass(frozen=True)
class Trajectory:
    """One agent's run.

    Attributes:
        agent_id: identity of the agent (unique within a trace).
        turns: the rounds, in order.
        token_seed: seeds the token ids of the base turns (see ``workload.tokens``); two
            agents augmented from the same base trajectory share it.
        prefix_seed: set when round 1 is a synthetic augmentation round; seeds that round's
            token ids so every augmented agent's prefix (hence every prefix-hash key) differs.
        source: index of the base trajectory this one was augmented from, if any.
        shared: the first turn's append starts with these shared-prefix segments
            ``(seed, tokens)``, whose token ids depend on the segment alone
            (``workload.tokens.shared_prefix_ids``): a system prompt that other
            conversations send too, so a global KV store hits it across conversations.
        start_s: seconds after the trace's first arrival at which this agent's first turn
            arrived (a recording's arrivals, ``dualpath trace convert``); ``None``: not
            known, an offline replay starts the agent at t = 0.
        blocks: empty, or one chain per turn: the ids of the turn's whole prompt (context
            plus append) in blocks of the trace's ``block_tokens``, chained as Mooncake's
            ``hash_ids`` are (equal ids: equal tokens *and* equal prefixes). A replay derives
            each block's token ids from its id, so a global KV store hits what the request log
            says it held, within a conversation and across conversations, at any depth
            (``workload.prefix_store``).
    """

    agent_id: int
    turns: tuple[Turn, ...]
    token_seed: int = 0
    prefix_seed: int | None = None
    source: int | None = None
    shared: tuple[tuple[int, int], ...] = ()
    start_s: float | None = None
    blocks: tuple[tuple[int, ...], ...] = ()
    _starts: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        sizes = [t.append + t.gen for t in self.turns]
        object.__setattr__(self, "_starts", tuple(accumulate(sizes, initial=0)))
        if self.shared:
            if any(n < 1 for _, n in self.shared):
                raise ValueError("shared-prefix segments hold at least one token each")
            if not self.turns or self.shared_tokens > self.turns[0].append:
                raise ValueError(f"agent {self.agent_id}: the shared prefix "
                                 f"({self.shared_tokens} tokens) is longer than the first "
                                 "turn's append")
        if self.blocks and len(self.blocks) != len(self.turns):
            raise ValueError(f"agent {self.agent_id}: {len(self.blocks)} block chains for "
                             f"{len(self.turns)} turns (one chain per turn)")

    @property
    def shared_tokens(self) -> int:
        """Tokens of the shared prefix at the start of the first turn (0: none)."""
        return sum(n for _, n in self.shared)

    @property
    def num_turns(self) -> int:
        """Number of rounds."""
        return len(self.turns)

    @property
    def total(self) -> int:
        """All tokens of the trajectory: sum of A_i + g_i (must stay <= MaxLen)."""
        return self._starts[-1]

    @property
    def total_append(self) -> int:
        """Sum of appended tokens (the prefill work when every context is a hit)."""
        return sum(t.append for t in self.turns)

    @property
    def total_gen(self) -> int:
        """Sum of generated tokens."""
        return sum(t.gen for t in self.turns)

    def context_length(self, i: int) -> int:
        """``len(Context_i)``: tokens of all earlier rounds (0 for the first turn)."""
        self._check(i)
        return self._starts[i]

    def hit_length(self, i: int) -> int:
        """Prefix-cache hit of turn ``i`` (= its context; hits stay within a trajectory)."""
        return self.context_length(i)

    def prompt_length(self, i: int) -> int:
        """Prompt sent in turn ``i``: context plus the appended tokens."""
        return self.context_length(i) + self.turns[i].append

    def context_lengths(self) -> tuple[int, ...]:
        """Context length of every turn, in order."""
        return self._starts[:-1]

    def mean_context(self) -> float:
        """Mean context length over this trajectory's turns (0 for an empty one)."""
        if not self.turns:
            return 0.0
        return sum(self._starts[:-1]) / len(self.turns)

    def _check(self, i: int) -> None:
        if not 0 <= i < len(self.turns):
            raise IndexError(f"turn {i} out of range for {len(self.turns)} turns")


def truncate(traj: Trajectory, max_len: int, block_tokens: int = 512) -> Trajectory:
    """Cut a trajectory at ``max_len`` total tokens, as the paper does when scaling appends.

    Whole turns that fit are kept; the first turn that does not fit keeps what fits of its
    append and at least one generated token (it is dropped if fewer than two tokens remain).
    """
    if traj.total <= max_len:
        return traj
    kept: list[Turn] = []
    used = 0
    for turn in traj.turns:
        room = max_len - used
        if turn.size <= room:
            kept.append(turn)
            used += turn.size
            continue
        if room >= 2:
            append = min(turn.append, room - 1)
            kept.append(Turn(append, min(turn.gen, room - append)))
        break
    shared = _clip_shared(traj.shared, kept[0].append if kept else 0)
    blocks: tuple[tuple[int, ...], ...] = ()
    if traj.blocks:  # the cut turn keeps the ids of the blocks it still covers (a cut
        # block keeps its id: its tokens are a prefix of the whole block's)
        blocks = traj.blocks[:len(kept)]
        if kept and kept[-1] != traj.turns[len(kept) - 1]:
            prompt = sum(t.size for t in kept[:-1]) + kept[-1].append
            blocks = (*blocks[:-1], blocks[-1][:-(-prompt // block_tokens)])
    return Trajectory(traj.agent_id, tuple(kept), traj.token_seed, traj.prefix_seed,
                      traj.source, shared, traj.start_s, blocks)


def _clip_shared(shared: tuple[tuple[int, int], ...], room: int
                 ) -> tuple[tuple[int, int], ...]:
    """The whole segments of ``shared`` that fit in ``room`` tokens (a cut segment would
    hold other ids than the whole one: it is dropped, and so is everything after it)."""
    out: list[tuple[int, int]] = []
    for seed, n in shared:
        if n > room:
            break
        out.append((seed, n))
        room -= n
    return tuple(out)

