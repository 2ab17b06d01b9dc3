"""Each request's story as the scheduler sees it: why its blocks missed, and its timeline.

**Misses.** Why a prompt's KV blocks missed the store: one reason per missed block, per lookup.

The scheduler's prefix lookup finds the longest run of a prompt's chain keys in the store;
every block after it is recomputed. This module names each such block's reason:

* ``quarantined`` / ``read_failed`` / ``timed_out`` / ``evicted`` / ``cancelled``: a block the
  previous attempt's lookup found, at or after the one an engine could not read (the
  engine's read-failed report names why; the chain after it is unusable for the same
  reason); a key seen quarantined stays so for later lookups;
* ``evicted``: the key is the one this agent's previous turn wrote (same chain, same place),
  so it was stored and has gone since (capacity or gc), aged since that turn ended;
* ``prefix_diverged``: the previous turn stored a block at this place but this prompt's key
  differs: the prompt changed at or before this block (a new system prompt, an edited
  history), so the chain no longer matches;
* ``never_stored``: new tokens, beyond anything the agent's previous turns stored.

It keeps, per agent, the chain keys its last finished turn stored (a bounded LRU of agents;
16 bytes a block in one bytes object: 25 KiB for a 100K-token context at 64-token blocks),
a bounded record of quarantined keys, and the lookup of each request in flight. Counts go to
``dualpath_kv_{requested,hit}_tokens_total{tier="store"}``,
``dualpath_kv_miss_blocks_total{tier="store"}`` and the evicted-block age histogram; each
lookup's summary goes into the request's decision (``inputs["lookup"]``), with the prompt's
chain of block ids (:data:`ID_MASK`: the first 8 bytes of each key) as a delta from the agent's
previous turn's (``chain_base`` ids equal to it, then the ``chain`` ids after them), so a
recording keeps what a replay must hit (services/recording.py ``trace_from_decisions``).

**Outcomes.** When a turn ends, its timeline (submitted, dispatched, the PE's and DE's facts
from ``first``/``done``) is kept in a bounded ring by request id, for ``dualpath explain``
and ``GET /api/v1/requests/{id}`` (diagnose/explain.py tells the story from it). The ring
packs them (:class:`~dualpath_cli.runtime.packed_ring.PackedRing`): a timeline's dicts
cost about 1.5 KB as objects, a few hundred bytes packed.
"""

from __future__ import annotations

import collections
import itertools
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dualpath_cli.core.layout import KEY_BYTES, BlockKey, Namespace, chain_digests
from dualpath_cli.runtime.packed_ring import PackedRing
from dualpath_cli.storage.tickets import MISS_REASONS
from dualpath_cli.telemetry.registry import MetricsRegistry

__all__ = ["ID_MASK", "Lookup", "RequestLedger", "block_ids", "reason_from_why"]

ID_MASK = (1 << 63) - 1
"""A block key's id: its first 8 bytes (big-endian) masked to 63 bits, a trace's block id
range (docs/trace-format.md)."""

_FAILURES = frozenset({"quarantined", "read_failed", "timed_out", "evicted", "cancelled"})


def _own_prefix(chain: bytes, raw: bytes, hits: int) -> int:
    """How many of the first ``hits`` keys (``raw``: joined digests) the agent's own stored
    ``chain`` starts with.

    Keys are chained (a block's digest covers every token before it), so a key both hold
    at the same place means every key before it is equal too: the last hit key is compared
    (the common case: a turn hits its own whole context), else the first differing key is
    bisected, 16 bytes a step. Comparing the whole ~8 KB prefixes copied both, from a chain
    stored one agent-turn ago (cold)."""
    n = min(hits, len(chain) // KEY_BYTES)
    if n <= 0:
        return 0

    def same(i: int) -> bool:
        at = i * KEY_BYTES
        return chain[at:at + KEY_BYTES] == raw[at:at + KEY_BYTES]

    if same(n - 1):
        return n
    lo, hi = 0, n - 1  # keys before lo are equal; key hi differs
    while lo < hi:
        mid = (lo + hi) // 2
        if same(mid):
            lo = mid + 1
        else:
            hi = mid
    return lo


def block_ids(heads: bytes) -> list[int]:
    """The ids of keys whose first 8 bytes are joined in ``heads`` (:data:`ID_MASK`)."""
    return [h & ID_MASK for h in np.frombuffer(heads, ">u8").tolist()]


def _heads(raw: bytes, first: int) -> bytes:
    """The first 8 bytes of each key of ``raw`` (joined digests) from key ``first`` on."""
    if len(raw) <= first * KEY_BYTES:
        return b""
    return np.frombuffer(raw, np.uint8).reshape(-1, KEY_BYTES)[first:, :8].tobytes()


def reason_from_why(why: str) -> str:
    """The miss reason an engine's read-failed text starts with (``read_failed`` if none)."""
    word = why.split(":", 1)[0].strip()
    return word if word in _FAILURES else "read_failed"


@dataclass
class Lookup:
    """One prefix lookup of one request (the last attempt's).

    Args:
        prompt_tokens: tokens of the prompt.
        blocks: full blocks the lookup could hit (one token is always left to prefill).
        hit_blocks: blocks found, in order from the first.
        misses: missed blocks by reason.
        evicted_age_s: the oldest evicted block's age (``None``: none evicted).
        cross_blocks: hit blocks another conversation stored (the leading ones past the
            agent's own stored chain), counted in the cross-conversation hit tokens.
        lead: the prompt's first block key, 8 bytes in hex (``None``: no full block):
            conversations opening with the same block share a prefix.
        cross_key: the last cross-conversation hit block's key, 8 bytes in hex (``None``:
            none): the shared prefix those blocks are (keys are chained, so equal keys mean
            equal prefixes). The digital twin links recorded turns into shared-prefix
            segments by these (services/recording.py ``trace_from_decisions``).
        turn: the turn's index in its conversation (``None``: not known).
        chain_base: the prompt's leading block keys equal to the agent's previous turn's
            prompt keys (0 for a first turn, or when that turn is not remembered).
        chain_heads: the first 8 bytes of each prompt key after those, joined (ids:
            :func:`block_ids`); the prompt's chain is the previous turn's first
            ``chain_base`` ids and these.
        block_tokens: tokens one key covers (the runtime's block size).
    """

    prompt_tokens: int
    blocks: int
    hit_blocks: int
    misses: dict[str, int] = field(default_factory=dict)
    evicted_age_s: float | None = None
    keys: bytes = field(default=b"", repr=False)  # the prompt's keys, digests joined
    cross_blocks: int = 0
    lead: str | None = None
    cross_key: str | None = None
    turn: int | None = None
    chain_base: int = 0
    chain_heads: bytes = field(default=b"", repr=False)
    block_tokens: int = 0

    def as_dict(self, chain: bool = False) -> dict[str, Any]:
        """The decision-log form (JSON-ready); ``chain``: with the prompt's block ids as a
        delta (``chain_base``, ``chain``; the decision's, not the in-flight listing's)."""
        out = {"prompt_tokens": self.prompt_tokens, "blocks": self.blocks,
               "hit_blocks": self.hit_blocks, "misses": dict(self.misses),
               "evicted_age_s": self.evicted_age_s, "cross_blocks": self.cross_blocks,
               "lead": self.lead, "cross_key": self.cross_key}
        if chain and self.turn is not None:
            out.update(chain_base=self.chain_base, chain=block_ids(self.chain_heads),
                       block_tokens=self.block_tokens)
        return out


class RequestLedger:
    """Attributes missed blocks to reasons, counts tokens looked up and hit, and keeps the
    timelines of finished requests.

    Args:
        registry: the scheduler's registry.
        namespace: the prefix-key namespace (block tokens, for output blocks' keys).
        agents: agents whose last stored chain is remembered (LRU).
        quarantine_record: quarantined keys remembered.
        outcomes: finished requests whose timeline is kept (the decision ring's size).
        outcomes_bytes: bytes those timelines may hold, packed (the decision ring's
            budget).
    """

    def __init__(self, registry: MetricsRegistry, namespace: Namespace, *,
                 agents: int = 4096, quarantine_record: int = 65_536,
                 outcomes: int = 10_000, outcomes_bytes: int = 8 << 20) -> None:
        self.ns = namespace
        self.bt = namespace.shape.block_tokens
        self._agents_max = agents
        self._q_max = quarantine_record
        # agent -> (the chain its last finished turn stored, when, that turn, its prompt keys)
        self._chains: collections.OrderedDict[int, tuple[bytes, float, int | None, int]] = \
            collections.OrderedDict()
        self._quarantined: collections.OrderedDict[bytes, float] = collections.OrderedDict()
        # rid -> (first bad block, reason, end of the failed attempt's hits)
        self._failed: dict[int, tuple[int, str, int]] = {}
        self._lookups: dict[int, Lookup] = {}
        self._dispatched: dict[int, float] = {}
        self._first: dict[int, dict[str, Any]] = {}
        # by finishing order (seq), keyed by request id
        self._outcomes = PackedRing(max(1, outcomes), max(1, outcomes_bytes))
        self._finished_n = 0
        self._lock = threading.Lock()
        self.m_req = {t: registry.counter("dualpath_kv_requested_tokens_total", tier=t)
                      for t in ("store", "hbm")}
        self.m_hit = {t: registry.counter("dualpath_kv_hit_tokens_total", tier=t)
                      for t in ("store", "hbm")}
        self.m_miss = {r: registry.counter("dualpath_kv_miss_blocks_total", tier="store",
                                           reason=r) for r in MISS_REASONS}
        self.m_age = registry.histogram("dualpath_kv_evicted_block_age_seconds", tier="store")
        self.m_cross = registry.counter("dualpath_kv_cross_conversation_hit_tokens_total")

    def lookup(self, rid: int, agent: int, keys: Sequence[BlockKey] | bytes,
               prompt_tokens: int, hits: int, now: float | None = None,
               turn: int | None = None) -> Lookup:
        """Attribute the blocks after the first ``hits`` of ``keys`` (the lookup's limit:
        the prompt's full blocks less the one holding its last token) and count them.
        ``keys``: the prompt's keys, or their digests joined (``PromptKeys.raw``);
        ``turn``: the turn's index (its chain of block ids is then kept, :class:`Lookup`)."""
        now = time.monotonic() if now is None else now
        limit = max(0, (prompt_tokens - 1) // self.bt)
        raw = keys if isinstance(keys, bytes) else b"".join([k.raw for k in keys])
        look = Lookup(prompt_tokens, limit, hits, keys=raw, turn=turn, block_tokens=self.bt)
        with self._lock:
            chain, done_at, last_turn, last_prompt = self._chains.get(
                agent, (b"", now, None, 0))
            stored = len(chain) // KEY_BYTES
            if turn is not None:  # the chain as a delta from the previous turn's prompt
                if turn > 0 and last_turn == turn - 1:
                    look.chain_base = min(last_prompt, _own_prefix(
                        chain, raw, len(raw) // KEY_BYTES))
                look.chain_heads = _heads(raw, look.chain_base)
            failed = self._failed.get(rid)
            own = _own_prefix(chain, raw, hits)  # the rest of the hits: another's blocks
            look.cross_blocks = max(0, hits - own)
            look.lead = raw[:8].hex() if raw else None
            look.cross_key = (raw[(hits - 1) * KEY_BYTES:(hits - 1) * KEY_BYTES + 8].hex()
                              if hits > own else None)
            # past the agent's stored chain a block was never stored, unless it failed or
            # is quarantined: with neither to check, those are counted at once, not walked
            walk = limit if failed is not None or self._quarantined else min(limit, stored)
            if limit > max(hits, walk):
                look.misses["never_stored"] = limit - max(hits, walk)
            for i in range(hits, walk):
                key = raw[i * KEY_BYTES:(i + 1) * KEY_BYTES]
                if failed is not None and failed[0] <= i < failed[2]:
                    reason = failed[1]
                elif key in self._quarantined:
                    reason = "quarantined"
                elif i < stored and chain[i * KEY_BYTES:(i + 1) * KEY_BYTES] == key:
                    reason = "evicted"
                    age = max(0.0, now - done_at)
                    if look.evicted_age_s is None or age > look.evicted_age_s:
                        look.evicted_age_s = age
                elif i < stored:
                    reason = "prefix_diverged"
                else:
                    reason = "never_stored"
                look.misses[reason] = look.misses.get(reason, 0) + 1
            self._lookups[rid] = look
        self.m_req["store"].inc(prompt_tokens)
        if hits:
            self.m_hit["store"].inc(hits * self.bt)
            if hits > own:
                self.m_cross.inc((hits - own) * self.bt)
        for reason, n in look.misses.items():
            self.m_miss[reason].inc(n)
        if look.evicted_age_s is not None:
            self.m_age.observe_many([look.evicted_age_s] * look.misses.get("evicted", 0))
        return look

    def dispatched(self, rid: int, prompt_tokens: int, now: float | None = None) -> None:
        """A PE starts a prefill: every prompt token must be in its HBM, none is already
        (the runtime frees a turn's HBM when it ends, so the HBM tier never hits)."""
        with self._lock:
            self._dispatched[rid] = time.monotonic() if now is None else now
        self.m_req["hbm"].inc(prompt_tokens)

    def first(self, rid: int, facts: dict[str, Any] | None) -> None:
        """The PE's facts of the attempt that produced the first token."""
        if facts is not None:
            with self._lock:
                self._first[rid] = dict(facts)

    def outcome(self, rid: int) -> dict[str, Any] | None:
        """The finished request's timeline (``None``: unknown, running or forgotten)."""
        with self._lock:
            found = self._outcomes.newest(rid)
            return dict(found[2]) if found is not None else None

    def progress(self, rids: Sequence[int]) -> dict[int, dict[str, Any]]:
        """What is known so far of requests in flight (a read accessor for the in-flight
        listing): when each was dispatched and, once its first token is out, the PE's facts
        (``pe_facts``), with its last lookup (``lookup``)."""
        with self._lock:
            out = {}
            for rid in rids:
                facts, look = self._first.get(rid), self._lookups.get(rid)
                out[rid] = {"dispatched": self._dispatched.get(rid),
                            "pe_facts": dict(facts) if facts is not None else None,
                            "lookup": look.as_dict() if look is not None else {}}
            return out

    def finished_after(self, after: int | None, limit: int) -> list[tuple[int, dict[str, Any]]]:
        """Kept outcomes in the order the requests finished, oldest first, at most
        ``limit``: the newest when ``after`` is ``None``; else the first that finished after
        request ``after`` did (from the oldest kept when it is forgotten), so a reader pages
        forward. A read accessor (a recorder's cursor)."""
        with self._lock:
            if after is None:
                since: int | None = self._finished_n - max(0, limit)
            else:
                found = self._outcomes.newest(after)
                since = found[0] if found is not None else None
            return [(rid, dict(out)) for _, rid, out in
                    itertools.islice(self._outcomes.after(since), max(0, limit))]

    def last_lookup(self, rid: int) -> Lookup | None:
        """The request's last lookup (``None`` if none). What :meth:`Lookup.as_dict`
        shows of it is not changed once made, so a decision may keep it and read it later
        (its ``keys`` are dropped when the request finishes)."""
        with self._lock:
            return self._lookups.get(rid)

    def failed(self, rid: int, block: int, why: str, keys: Sequence[str]) -> str:
        """An engine could not read block ``block`` of ``rid`` (``keys``: the hit keys, hex);
        returns the reason. A quarantined key is remembered for later lookups."""
        reason = reason_from_why(why)
        with self._lock:
            look = self._lookups.get(rid)
            self._failed[rid] = (block, reason, look.hit_blocks if look else len(keys))
            if reason == "quarantined" and 0 <= block < len(keys):
                raw = bytes.fromhex(keys[block])
                self._quarantined[raw] = time.monotonic()
                self._quarantined.move_to_end(raw)
                if len(self._quarantined) > self._q_max:
                    self._quarantined.popitem(last=False)
        return reason

    def finished(self, rid: int, agent: int, output: Sequence[int] | np.ndarray,
                 tokens: Sequence[int] | np.ndarray,
                 timeline: dict[str, Any], now: float | None = None) -> bytes:
        """The turn ended: keep its outcome (``timeline``: submitted, first_at, done_at,
        attempts, rx_from_pe, the DE's facts) and remember the chain its DE stored (prompt
        and output full blocks, all but the last output token, whose KV is never computed).
        Returns that chain (digests joined; empty when the request's lookup is unknown)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            look = self._lookups.pop(rid, None)
            self._failed.pop(rid, None)
            out = {**timeline, "dispatched": self._dispatched.pop(rid, None),
                   "pe": self._first.pop(rid, None), "tokens_out": len(output)}
            self._finished_n += 1
            self._outcomes.append(self._finished_n, rid, out)
        if look is None:
            return b""
        # only the tokens after the prompt's keyed blocks are hashed, so only they are
        # joined with the output (the prompt has ~12K tokens; copying it cost more)
        start = len(look.keys) // KEY_BYTES * self.bt
        prompt = np.asarray(tokens).reshape(-1)
        tail = prompt[start:]
        skip = max(0, start - len(prompt))  # output tokens inside the keyed blocks already
        made = max(0, len(output) - 1 - skip)  # then all but the last output token
        if len(tail) + made >= self.bt:  # else no new full block: nothing to hash
            # built once as the hash reads them (uint32); a DE's output is a tuple of ints,
            # which np.fromiter converts without working out a dtype first
            seq = np.empty(len(tail) + made, "<u4")
            seq[:len(tail)] = tail
            if made:
                gen = (np.asarray(output).reshape(-1) if isinstance(output, np.ndarray)
                       else np.fromiter(output, np.int64, len(output)))
                seq[len(tail):] = gen[skip:skip + made]
            chain = look.keys + chain_digests(seq, self.ns, look.keys[-KEY_BYTES:] or None)
        else:
            chain = look.keys
        prompt_keys = len(look.keys) // KEY_BYTES
        look.keys = b""  # a decision may keep the lookup as evidence; the keys are not
        with self._lock:
            self._chains[agent] = (chain, now, look.turn, prompt_keys)
            self._chains.move_to_end(agent)
            if len(self._chains) > self._agents_max:
                self._chains.popitem(last=False)
        return chain

    def forget(self, rid: int) -> None:
        """Drop what is kept for a request that will not finish (failed or cut off)."""
        with self._lock:
            self._lookups.pop(rid, None)
            self._failed.pop(rid, None)
            self._dispatched.pop(rid, None)
            self._first.pop(rid, None)
