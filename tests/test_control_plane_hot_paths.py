"""The scheduler's hot paths at scale keep their results: incremental prefix keys, prompts as
buffer frames, kept engine loads, the ledger's chains, engine processes started early."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dualpath_cli.cluster.system import RuntimeSystem
from dualpath_cli.core.layout import (
    KEY_BYTES,
    BlockShape,
    DigestKeys,
    Namespace,
    PrefixKeyCache,
    chain_digests,
    chain_keys,
    first_difference,
    prefix_keys,
)
from dualpath_cli.runtime.ledger import RequestLedger, _own_prefix
from dualpath_cli.runtime.options import RuntimeOptions
from dualpath_cli.runtime.turns import Latch, Ticket
from dualpath_cli.runtime.wire import Decode, Prefill, TokenArray, WireError, decode, encode
from dualpath_cli.runtime.workloads import agentic_workload
from dualpath_cli.services.runner import run_agents
from dualpath_cli.telemetry.registry import MetricsRegistry
from dualpath_cli.transfer import InProcFabric, ZmqFabric

NS = Namespace("tiny", "layer_major", BlockShape(2, 4, 8))
TOKENS = st.lists(st.integers(0, 2**31 - 1), max_size=60)


@given(TOKENS, st.integers(0, 16), st.integers(0, 16))
def test_chain_keys_equal_the_reference_chain(tokens: list[int], first: int, span: int) -> None:
    ref = prefix_keys(tokens, NS)
    assert chain_keys(np.asarray(tokens, dtype=np.int64), NS) == ref
    assert chain_keys(tokens, NS) == ref
    first = min(first, len(ref))
    parent = ref[first - 1] if first else None
    assert chain_keys(tokens, NS, parent, first, first + span) == ref[first:first + span]
    assert chain_digests(tokens, NS, parent.raw if parent else None, first, first + span) == (
        b"".join(k.raw for k in ref[first:first + span]))


@given(TOKENS, st.integers(-20, 20), st.integers(-20, 20))
def test_digest_keys_read_as_the_list_of_their_keys(tokens: list[int], i: int, j: int) -> None:
    """What the scheduler keeps per session instead of key objects reads as the list."""
    ref = prefix_keys(tokens, NS)
    keys = DigestKeys(b"".join(k.raw for k in ref))
    assert len(keys) == len(ref) and list(keys) == ref and keys == ref and ref == keys
    assert keys[i:j] == ref[i:j] and keys == DigestKeys(keys.raw)
    if -len(ref) <= i < len(ref):
        assert keys[i] == ref[i]
    else:
        with pytest.raises(IndexError):
            keys[i]
    if ref:
        assert keys != ref[:-1] and keys != [*ref[:-1], ref[0] if len(ref) > 1 else None]


EDITS = st.lists(st.tuples(
    st.sampled_from(["append", "change", "cut", "other"]), st.integers(0, 3),
    st.lists(st.integers(0, 50), min_size=1, max_size=13), st.integers(0, 100)), max_size=12)


@settings(max_examples=150, deadline=None)
@given(EDITS, st.integers(1, 3), st.integers(8, 80))
def test_incremental_prefix_keys_equal_the_keys_from_scratch(
        edits: list[tuple[str, int, list[int], int]], sessions: int, max_tokens: int) -> None:
    """Whatever each session's next prompt is (its last one grown, changed anywhere, cut, or
    another), the cache answers prefix_keys of it, within small bounds that evict."""
    cache = PrefixKeyCache(NS, sessions=sessions, max_tokens=max_tokens)
    prompts: dict[int, list[int]] = {}
    for kind, session, tokens, where in edits:
        prompt = list(prompts.get(session, []))
        if kind == "append":
            prompt += tokens
        elif kind == "change" and prompt:
            prompt[where % len(prompt)] = tokens[0] + 51
        elif kind == "cut":
            prompt = prompt[:where % (len(prompt) + 1)]
        else:
            prompt = tokens * 3
        prompts[session] = prompt
        ref = prefix_keys(prompt, NS)
        assert cache.keys(session, np.asarray(prompt, dtype=np.int64)) == ref
        got = cache.prompt(session, prompt)  # the kept form: digests joined, uint32 tokens
        assert got.raw == b"".join(k.raw for k in ref) and got.keys == ref
        assert got.tokens.tolist() == prompt and not got.tokens.flags.writeable
        assert len(cache) <= sessions
    assert cache.hashed + cache.reused >= 0


def test_a_grown_prompt_hashes_only_its_new_blocks() -> None:
    cache = PrefixKeyCache(NS)
    prompt = np.arange(40)
    cache.keys(7, prompt)
    assert (cache.reused, cache.hashed) == (0, 10)
    cache.keys(7, np.concatenate([prompt, np.arange(9)]))
    assert (cache.reused, cache.hashed) == (10, 12)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 2**32 - 1), max_size=300), st.integers(-1, 320),
       st.integers(0, 320), st.sampled_from(["<u4", "<i4", "<i8"]), st.booleans())
def test_first_difference_equals_the_elementwise_comparison(
        tokens: list[int], where: int, n: int, dtype: str, strided: bool) -> None:
    """memcmp's answer (or numpy's, for strided arrays) is the first index whose elements
    differ, over the first ``n`` of the shorter array; ``n`` (clipped) when none does."""
    a = np.asarray(tokens, dtype=np.uint64).astype(dtype)
    b = a.copy()
    if 0 <= where < len(b):
        b[where] ^= 1
    if strided:  # every other element: not contiguous, numpy's path
        a, b = np.repeat(a, 2)[::2], np.repeat(b, 2)[::2]

    def elementwise(x: np.ndarray, y: np.ndarray) -> int:
        m = max(0, min(n, len(x), len(y)))
        return next((i for i in range(m) if x[i] != y[i]), m)

    shorter = b[: max(0, len(b) - 3)]
    assert first_difference(a, b, n) == elementwise(a, b)
    assert first_difference(a, shorter, n) == elementwise(a, shorter)


def test_first_difference_without_memcmp(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the C library cannot be loaded the comparison is numpy's, with the same
    answers, and the prefix cache still reuses the kept keys."""
    import dualpath_cli.core.layout as layout

    monkeypatch.setattr(layout, "_MEMCMP", None)
    a = np.arange(1000, dtype="<u4")
    b = a.copy()
    assert first_difference(a, b, 1000) == 1000
    b[637] = 5
    assert first_difference(a, b, 1000) == 637 and first_difference(a, b, 600) == 600
    cache = PrefixKeyCache(NS)
    cache.keys(1, np.arange(40))
    cache.keys(1, np.arange(49))
    assert (cache.reused, cache.hashed) == (10, 12)


def test_first_difference_uses_memcmp_for_contiguous_prompts(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A session's prompts (contiguous uint32) are compared by memcmp, once, over their
    common length in bytes; a difference is then located."""
    import dualpath_cli.core.layout as layout

    if layout._MEMCMP is None:
        pytest.skip("no C library to load memcmp from")
    calls: list[int] = []
    real = layout._MEMCMP

    def counted(x: int, y: int, size: int) -> int:
        calls.append(size)
        return real(x, y, size)

    monkeypatch.setattr(layout, "_MEMCMP", counted)
    a = np.arange(5000, dtype="<u4")
    b = np.concatenate([a, np.arange(7, dtype="<u4")])
    assert first_difference(a, b, 5000) == 5000 and calls == [20_000]
    b[4321] += 1
    assert first_difference(a, b, 5000) == 4321 and calls == [20_000, 20_000]


def test_a_latch_is_a_one_shot_event() -> None:
    """Tickets wait on Latch (one lock, no Condition): set before or after the wait, once
    or twice, from another thread; a wait that times out says so."""
    latch = Latch()
    assert not latch.is_set() and latch.wait(0) is False and latch.wait(0.01) is False
    waiting = threading.Thread(target=lambda: results.append(latch.wait(30)))
    results: list[bool] = []
    waiting.start()
    threading.Thread(target=latch.set).start()
    waiting.join(30)
    latch.set()  # a second set is a no-op
    assert results == [True] and latch.is_set() and latch.wait() and latch.wait(0)
    ticket = Ticket()
    with pytest.raises(TimeoutError):
        ticket.wait(0.01)
    ticket.fail(RuntimeError("cut off"))
    with pytest.raises(RuntimeError, match="cut off"):
        ticket.wait(0)


def _dispatches(tokens: Any) -> list[Decode | Prefill]:
    return [Decode(9, 1, 4, tokens, 4, 16, ("ab" * 16,), 8, "tcp://x:1", True),
            Prefill(9, 1, 5, tokens, 16, ("ab" * 16,), 8, "tcp://x:2", True, False)]


@pytest.mark.parametrize("fabric_cls", [InProcFabric, ZmqFabric])
def test_a_prompt_travels_as_one_int32_frame(fabric_cls: type) -> None:
    prompt = np.random.default_rng(3).integers(0, 1 << 30, 12_345)
    fabric = fabric_cls()
    a, b = fabric.endpoint("a"), fabric.endpoint("b")
    try:
        for msg in _dispatches(prompt):
            header, frames = encode(msg)
            assert "tokens" not in header and len(frames) == 2  # the prompt, the block keys
            assert frames[0].dtype == np.int32 and frames[0].nbytes == 4 * len(prompt)
            a.send(b.address, header, frames)
            raw = b.recv(timeout=5)
            assert raw is not None
            back = decode(raw.header, raw.buffers)
            assert back == msg and type(back) is type(msg)
            assert isinstance(back.tokens, TokenArray)
            np.testing.assert_array_equal(np.asarray(back.tokens, dtype=np.int64), prompt)
            assert back.tokens == tuple(prompt.tolist()) and list(back.tokens) == prompt.tolist()
            assert back.tokens[-3:] == tuple(prompt[-3:].tolist())
    finally:
        a.close()
        b.close()


def test_a_dispatch_carries_the_prompt_after_its_hit() -> None:
    """The scheduler sends the tokens from ``start`` (the hit's end) on; an engine's
    ``prompt()`` has the whole length, the hit's tokens (never computed) as zeros."""
    tail = np.arange(50, 58)
    for msg in (Decode(9, 1, 4, tail, 4, 16, ("ab" * 16,), 8, "tcp://x:1", True, 16),
                Prefill(9, 1, 5, tail, 16, ("ab" * 16,), 8, "tcp://x:2", True, False, 16)):
        header, frames = encode(msg)
        back = decode(header, frames)
        assert back == msg and back.start == 16 and len(back.tokens) == 8
        full = back.prompt()
        assert full.dtype == np.int64 and len(full) == 24
        assert full[16:].tolist() == tail.tolist() and not full[:16].any()
    assert _dispatches(tail)[0].prompt().tolist() == tail.tolist()  # start 0: all of it
    with pytest.raises(WireError, match="start 17 is outside 0..cached"):
        Decode(9, 1, 4, tail, 4, 16, ("ab" * 16,), 8, "tcp://x:1", True, 17)


def test_token_arrays_never_alias_the_callers_array() -> None:
    mine = np.arange(5, dtype=np.int32)
    msg = _dispatches(mine)[0]
    mine[0] = 99
    assert msg.tokens[0] == 0 and mine.flags.writeable


def test_a_dispatch_without_its_frame_is_refused() -> None:
    header, frames = encode(_dispatches((1, 2, 3))[0])
    with pytest.raises(WireError, match="carries 0 buffer frames; expected 2"):
        decode(header, [])
    with pytest.raises(WireError, match="not a 1-D integer array"):
        decode(header, [np.zeros((2, 2), np.int32), frames[1]])
    with pytest.raises(WireError, match="not a 1-D integer array"):
        decode(header, [np.zeros(3, np.float32), frames[1]])


def test_the_ledger_chain_is_the_prompt_and_output_keys() -> None:
    ledger = RequestLedger(MetricsRegistry(), NS)
    prompt = np.arange(100, 137)  # 9 full blocks and a token
    keys = prefix_keys(prompt.tolist(), NS)
    ledger.lookup(1, 5, keys, len(prompt), hits=3)
    output = list(range(900, 911))
    ledger.finished(1, 5, output, prompt, {})
    want = prefix_keys(prompt.tolist() + output[:-1], NS)
    assert ledger._chains[5][0] == b"".join(k.raw for k in want)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 99), min_size=1, max_size=40),
       st.lists(st.integers(0, 99), max_size=12), st.integers(0, 30))
def test_the_ledger_chain_hashes_only_the_tail(prompt: list[int], output: list[int],
                                               extra: int) -> None:
    """The chain a finished turn leaves equals its keys then the keys of prompt + output
    (all but the last output token) from there, however many keys the lookup had."""
    everything = prefix_keys(prompt + output, NS)
    least = (len(prompt) - 1) // NS.shape.block_tokens
    keys = everything[:least + min(extra, max(0, len(everything) - least))]
    ledger = RequestLedger(MetricsRegistry(), NS)
    ledger.lookup(1, 5, keys, len(prompt), hits=least)
    ledger.finished(1, 5, output, np.asarray(prompt), {})
    seq = prompt + output[:-1]
    want = keys + chain_keys(seq, NS, keys[-1] if keys else None, len(keys))
    assert ledger._chains[5][0] == b"".join(k.raw for k in want)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=2, max_size=60),
       st.lists(st.integers(0, 3), min_size=2, max_size=60), st.integers(0, 20),
       st.integers(0, 20))
def test_misses_counted_at_once_equal_the_walk(first: list[int], second: list[int],
                                               hit1: int, hit2: int) -> None:
    """Blocks past the agent's stored chain are counted ``never_stored`` without a walk;
    a ledger with a quarantined key (it must walk) attributes every miss the same."""
    quick = RequestLedger(MetricsRegistry(), NS)
    walked = RequestLedger(MetricsRegistry(), NS)
    walked._quarantined[b"\xff" * 16] = 0.0  # a key no prompt has
    looks = []
    for ledger in (quick, walked):
        keys = prefix_keys(first, NS)
        ledger.lookup(1, 5, keys, len(first), hits=min(hit1, (len(first) - 1) // 4),
                      now=1.0)
        ledger.finished(1, 5, [7, 7, 7, 7, 7], np.asarray(first), {}, now=2.0)
        keys = prefix_keys(second, NS)
        looks.append(ledger.lookup(2, 5, keys, len(second),
                                   hits=min(hit2, (len(second) - 1) // 4), now=3.0).as_dict())
    assert looks[0] == looks[1]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 3), max_size=60), st.lists(st.integers(0, 3), max_size=60),
       st.integers(0, 20))
def test_own_prefix_bisected_equals_the_key_by_key_count(stored: list[int],
                                                         prompt: list[int],
                                                         hits: int) -> None:
    """The agent's own hit blocks, found from the last hit key or by bisection on chained
    keys, are the leading keys its stored chain and the prompt share, counted one by one."""
    chain = b"".join(k.raw for k in prefix_keys(stored, NS))
    raw = b"".join(k.raw for k in prefix_keys(prompt, NS))
    hits = min(hits, len(raw) // KEY_BYTES)
    counted = 0
    while (counted < hits and counted < len(chain) // KEY_BYTES
           and chain[counted * KEY_BYTES:(counted + 1) * KEY_BYTES]
           == raw[counted * KEY_BYTES:(counted + 1) * KEY_BYTES]):
        counted += 1
    assert _own_prefix(chain, raw, hits) == counted


@pytest.mark.e2e
def test_kept_loads_equal_the_loads_counted_from_the_turns(tmp_path: Path) -> None:
    """After every message the scheduler handles, the loads it keeps per engine and per DE
    group, and the tokens routed to each DE group's queue (the fetches' input), equal the
    ones counted from every turn in flight."""
    opts = RuntimeOptions(prefill_nodes=1, decode_nodes=2, gpus_per_node=2, engines="emulated",
                          emulated_model="ds27b", emulated_hosts=1, emulated_speed=20.0,
                          store_dir=tmp_path, heartbeat_s=0.2, fetch_s=0.01)
    bad: list[str] = []
    checked, busy = [0], [0]
    with RuntimeSystem(opts) as system:
        sched = system.scheduler
        handle = sched.on_message

        def checked_handle(raw: Any) -> None:
            handle(raw)
            counted = sched._loads()
            by_group: dict[int, int] = {}
            for eid, tok in counted[1].items():
                if sched.engines[eid].role == "decode":
                    by_group[sched.engines[eid].group] = by_group.get(sched.engines[eid].group,
                                                                      0) + tok
            routed = {g: sum(len(f.req.tokens) for f in q) for g, q in sched.private.items()}
            want = [{k: v for k, v in d.items() if v} for d in (*counted, by_group, routed)]
            got = [{k: v for k, v in d.items() if v}
                   for d in (sched._seq, sched._tok, sched._hbm_used,
                             sched._de_group_tok, sched._routed_tok)]
            checked[0] += 1
            busy[0] += bool(want[0])
            if got != want and len(bad) < 3:
                bad.append(f"{raw.header.get('t')}: kept {got}, counted {want}")

        sched.on_message = checked_handle
        result = run_agents(system, agentic_workload(6, turns=3), timeout=60)
    assert not result.errors and len(result.turns) == 18
    # at least a fetch, a first and a done per turn, most of them with turns in flight
    assert checked[0] >= 3 * 18 and busy[0] >= 18 and not bad, bad


@pytest.mark.e2e
def test_warm_engine_processes_end_when_no_join_comes() -> None:
    from dualpath_cli.services.node import WarmCluster

    cluster = WarmCluster(2)
    procs = [p for p, _ in cluster._warm]
    assert len(procs) == 2 and all(p.is_alive() for p in procs)
    cluster.shutdown(timeout=30)
    assert all(p.exitcode is not None for p in procs)


@settings(max_examples=50, deadline=None)
@given(st.dictionaries(st.integers(0, 7), st.integers(0, 10_000), min_size=1),
       st.lists(st.integers(1, 5_000), max_size=20))
def test_a_routing_pass_shows_each_turn_the_loads_just_before_it(
        base: dict[int, int], lengths: list[int]) -> None:
    """A decision's ``de_route`` loads, made when read, are what a copy taken at each
    turn's routing held (what the scheduler used to keep per turn)."""
    from dualpath_cli.core.de_schedule import GroupLoads
    from dualpath_cli.runtime.turns import RoutePass

    loads = GroupLoads(base)
    routing = RoutePass([1, 2], loads.as_dict())
    copies = []
    for n in lengths:
        copies.append(loads.as_dict())
        routing.steps.append((loads.assign(n), n))
    for i, (copy, (group, _)) in enumerate(zip(copies, routing.steps, strict=True)):
        assert routing.route(i) == {"queue_head": [1, 2], "group_loads": copy,
                                    "group": group}


def test_a_dispatch_is_reported_only_when_a_report_raced_its_reads() -> None:
    """An engine counts a dispatch ``seen`` without a report (the scheduler charged its
    reads); a report sent by another thread while its reads were submitted may have
    counted them in ``rq`` but not in ``seen``, so one more goes out at once."""
    import types

    from dualpath_cli.runtime.context import EngineContext

    reports: list[int] = []
    ctx = types.SimpleNamespace(_report_lock=threading.Lock(), _report_n=0, seen=-1)
    ctx.report_queue = lambda: reports.append(ctx.seen)
    EngineContext.dispatched(ctx, 4, lambda: None)  # type: ignore[arg-type]
    EngineContext.dispatched(ctx, 5)  # type: ignore[arg-type]
    assert ctx.seen == 5 and reports == []

    def submit_while_a_loader_reports() -> None:
        ctx._report_n += 1  # what EngineContext._report does, under the lock

    EngineContext.dispatched(ctx, 6, submit_while_a_loader_reports)  # type: ignore[arg-type]
    assert ctx.seen == 6 and reports == [6]


def test_a_prompt_handed_over_read_only_is_kept_without_a_copy() -> None:
    """``token_ids`` makes the form the scheduler keeps (uint32, read-only, a new array):
    ``prompt`` keeps it as it is, with the keys an int64 prompt gets; a writable one is
    copied (its owner may change it)."""
    from dualpath_cli.core.layout import PrefixKeyCache, token_ids

    ids = list(range(100, 137))
    handed = token_ids(ids)
    assert handed.dtype == np.dtype("<u4") and not handed.flags.writeable
    with pytest.raises(OverflowError):
        token_ids([-1])
    kept = PrefixKeyCache(NS).prompt(1, handed)
    assert kept.tokens is handed
    assert kept.keys == PrefixKeyCache(NS).prompt(1, np.asarray(ids, np.int64)).keys
    writable = np.asarray(ids, np.uint32)
    copied = PrefixKeyCache(NS).prompt(1, writable).tokens
    assert copied is not writable and not copied.flags.writeable
    writable[0] = 7  # the caller's array changes; the kept prompt does not
    assert int(copied[0]) == 100
