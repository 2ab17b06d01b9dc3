"""The stores' removal generation and the prefix lookup that trusts it: every path that
removes a block moves the generation (in any process), and a lookup after a removal is
exact, while a lookup with nothing removed stats only the blocks it has not seen."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dualpath_cli.core.layout import (
    BlockKey,
    BlockShape,
    Namespace,
    PresentPrefixCache,
    longest_cached_prefix,
    prefix_keys,
)
from dualpath_cli.core.policies import SchedParams
from dualpath_cli.runtime.scheduler import SchedulerService
from dualpath_cli.runtime.turns import TurnRequest
from dualpath_cli.runtime.wire import Done, encode
from dualpath_cli.storage import (
    HEADER_SIZE,
    BufferPool,
    KVStore,
    MemoryStore,
    PosixStore,
    ReadOp,
    ReplicatedStore,
    encode_block,
)
from dualpath_cli.storage import posix as posix_mod
from dualpath_cli.storage.store import removal_generation
from dualpath_cli.telemetry.registry import MetricsRegistry
from dualpath_cli.transfer import InProcFabric
from dualpath_cli.transfer.base import Message

NS = Namespace("m", "layer_major", BlockShape(2, 4, 16), "fp16")


def _put(store: KVStore, key: BlockKey) -> int:
    header, payload = encode_block(key, np.full((2, 4, 8), key.raw[0], np.float16), NS)
    store.put(header, payload)
    return header.file_nbytes


def _keys(n: int, first: int = 1) -> list[BlockKey]:
    return [BlockKey(bytes([first + i]) * 16) for i in range(n)]


def _posix(root: Path, **kw: object) -> PosixStore:
    return PosixStore(root, registry=MetricsRegistry(), **kw)  # type: ignore[arg-type]


def _removal_paths(make: Callable[[], KVStore], other: Callable[[], KVStore] | None
                   ) -> None:
    """Each removal path moves the generation; writes and reads do not."""
    store = make()
    keys = _keys(6)
    size = 0
    for key in keys:
        size = _put(store, key)
    gen = removal_generation(store)
    assert gen is not None and removal_generation(store) == gen  # stable while nothing goes
    _put(store, _keys(1, 40)[0])
    ops = [ReadOp(k) for k in keys[:2]]
    store.read_batch(ops, BufferPool(0))
    assert all(op.ok for op in ops)
    for op in ops:
        assert op.buffer is not None
        op.buffer.release()
    assert removal_generation(store) == gen, "a write or a read moved the generation"
    seen = {gen}

    def moved(what: str) -> None:
        now = removal_generation(store)
        assert now is not None and now not in seen, f"{what} did not move the generation"
        seen.add(now)

    assert store.delete(keys[0])
    moved("delete")
    assert store.delete(keys[0]) is False
    assert removal_generation(store) in seen  # nothing removed: unchanged
    assert store.quarantine(keys[1], "test")
    moved("quarantine")
    assert store.gc(capacity_bytes=3 * size).evicted_blocks >= 1
    moved("gc")
    if other is not None:  # another opener of the same root (another process's view)
        second = other()
        assert second.delete(next(k for k in keys if store.contains(k)))
        moved("a delete by another opener")
        assert second.quarantine(next(k for k in keys if store.contains(k)), "test")
        moved("a quarantine by another opener")


def test_posix_removal_paths_move_the_generation(tmp_path: Path) -> None:
    _removal_paths(lambda: _posix(tmp_path), lambda: _posix(tmp_path))


def test_memory_removal_paths_move_the_generation() -> None:
    _removal_paths(lambda: MemoryStore(registry=MetricsRegistry()), None)


def test_replicated_removals_follow_every_root(tmp_path: Path) -> None:
    roots = [tmp_path / "a", tmp_path / "b"]
    _removal_paths(lambda: ReplicatedStore([_posix(r) for r in roots], hot_reads=0,
                                           registry=MetricsRegistry(), primary_home=True),
                   lambda: _posix(roots[0]))
    assert removal_generation(ReplicatedStore([_posix(roots[0]), object()],  # type: ignore[list-item]
                                              hot_reads=0)) is None


@pytest.mark.parametrize("kind", ["posix", "memory"])
def test_capacity_eviction_and_a_corrupt_read_move_it(tmp_path: Path, kind: str) -> None:
    keys = _keys(4)
    probe = MemoryStore(registry=MetricsRegistry())
    size = _put(probe, keys[0])
    store: PosixStore | MemoryStore = (
        _posix(tmp_path, capacity_bytes=2 * size) if kind == "posix"
        else MemoryStore(capacity_bytes=2 * size, registry=MetricsRegistry()))
    _put(store, keys[0])
    _put(store, keys[1])
    gen = store.removals()
    _put(store, keys[2])  # evicts keys[0]
    assert not store.contains(keys[0]) and store.removals() != gen
    gen = store.removals()
    if isinstance(store, PosixStore):  # corrupt a block on disk: the read quarantines it
        with open(store.path(keys[2]), "r+b") as fh:
            fh.seek(HEADER_SIZE)
            fh.write(b"\xff\xff")
    else:
        blob = bytearray(store.raw(keys[2]))
        blob[HEADER_SIZE] ^= 0xFF
        store.set_raw(keys[2], bytes(blob))
    op = ReadOp(keys[2])
    store.read_batch([op], BufferPool(0))
    assert op.error is not None and not store.contains(keys[2])
    assert store.removals() != gen


@pytest.mark.e2e
def test_a_removal_in_another_process_moves_it(tmp_path: Path) -> None:
    store = _posix(tmp_path)
    key = _keys(1)[0]
    _put(store, key)
    gen = store.removals()
    code = ("import sys; from dualpath_cli.storage import PosixStore; "
            "from dualpath_cli.core.layout import BlockKey; "
            "sys.exit(0 if PosixStore(sys.argv[1]).delete(BlockKey.from_hex(sys.argv[2])) "
            "else 3)")
    subprocess.run([sys.executable, "-c", code, str(tmp_path), key.hex], check=True,
                   timeout=60)
    assert not store.contains(key) and store.removals() != gen


def test_the_counter_file_is_rewritten_when_large_and_unlinked_when_full(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = _posix(tmp_path)
    keys = _keys(8)
    for key in keys:
        _put(store, key)
    monkeypatch.setattr(posix_mod, "_REMOVALS_ROTATE", 2)
    counter = tmp_path / posix_mod.REMOVALS_FILE
    seen = {store.removals()}
    for key in keys[:4]:
        store.delete(key)
        assert store.removals() not in seen
        seen.add(store.removals())
        assert counter.stat().st_size <= 2  # rewritten once past the limit
    real_write = os.write

    def full(fd: int, data: bytes) -> int:
        if os.fstat(fd).st_ino == counter.stat().st_ino:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(posix_mod.os, "write", full)
    store.delete(keys[4])
    assert not counter.exists()  # the byte could not be added: the file went instead
    monkeypatch.setattr(posix_mod.os, "write", real_write)
    assert store.removals() not in seen  # a new file: a new generation


def test_a_root_where_the_counter_cannot_be_made_has_no_generation(tmp_path: Path) -> None:
    store = _posix(tmp_path)
    (tmp_path / ".dualpath").write_text("not a directory")
    assert store.removals() is None and removal_generation(store) is None


# -- the lookup ---------------------------------------------------------------------------

ACTIONS = st.lists(st.tuples(st.sampled_from(["grow", "remove", "add", "other", "cut",
                                              "written", "written_late"]),
                             st.integers(0, 2), st.integers(0, 40), st.integers(0, 30)),
                   max_size=30)


@settings(max_examples=200, deadline=None)
@given(ACTIONS)
def test_the_lookup_equals_a_full_walk(actions: list[tuple[str, int, int, int]]) -> None:
    """Whatever is removed or added between lookups (removals move the generation), the
    cache's answer equals checking every block; with nothing removed it checks only the
    blocks after those it found before."""
    present: set[BlockKey] = set()
    generation = 0
    cache = PresentPrefixCache(sessions=2)
    prompts: dict[int, list[int]] = {}
    checked: list[BlockKey] = []

    def contains(key: BlockKey) -> bool:
        checked.append(key)
        return key in present

    for kind, session, n, limit in actions:
        prompt = prompts.get(session, [])
        if kind == "grow":
            prompt = prompt + list(range(n))
        elif kind == "cut":
            prompt = prompt[:n]
        elif kind == "other":
            prompt = [n + 100] * (limit + 3)
        keys = prefix_keys(prompt, NS)
        if kind == "remove" and keys:
            present.discard(keys[n % len(keys)])
            generation += 1
        elif kind == "add" and keys:
            present.update(keys[:n % (len(keys) + 1)])
        elif kind.startswith("written") and keys:
            # a turn's engine wrote its first m blocks and says so as it answers; the
            # generation was read at the turn's lookup, before the writes ("late": a
            # block was removed between that read and the note)
            seen, m = generation, 1 + n % len(keys)
            if kind == "written_late":
                present.discard(keys[limit % len(keys)])
                generation += 1
            present.update(keys[:m])
            cache.note(session, seen, m, keys[m - 1])
        prompts[session] = prompt
        checked.clear()
        before = cache.checked
        hits = cache.hits(session, keys, limit, generation, contains)
        assert hits == longest_cached_prefix(keys[:limit], lambda k: k in present)
        assert cache.checked - before == len(checked)
        unknown = PresentPrefixCache()
        assert unknown.hits(session, keys, limit, None, lambda k: k in present) == hits
        assert len(cache) <= 2


def test_a_grown_prompt_checks_only_its_new_blocks() -> None:
    present = set(prefix_keys(list(range(400)), NS))
    cache = PresentPrefixCache()
    calls: list[BlockKey] = []

    def contains(key: BlockKey) -> bool:
        calls.append(key)
        return key in present

    keys = prefix_keys(list(range(300)), NS)
    assert cache.hits(1, keys, 74, "g", contains) == 74 and len(calls) == 74
    calls.clear()
    keys = prefix_keys(list(range(360)), NS)
    assert cache.hits(1, keys, 89, "g", contains) == 89 and len(calls) == 89 - 74
    calls.clear()
    assert cache.hits(1, keys, 89, "moved", contains) == 89 and len(calls) == 89


def _count_contains(store: PosixStore) -> list[BlockKey]:
    """Make ``store.contains`` record each key it is asked about; returns that record."""
    stats: list[BlockKey] = []
    real = store.contains

    def counted(key: BlockKey) -> bool:
        stats.append(key)
        return real(key)

    store.contains = counted  # type: ignore[method-assign]
    return stats


def _scheduler(store: KVStore) -> SchedulerService:
    params = SchedParams(alpha=1 << 20, beta=1 << 20, block_tokens=NS.shape.block_tokens)
    return SchedulerService(InProcFabric(), store, NS, "dualpath", params, 4096)


def test_the_scheduler_lookup_after_a_removal_is_exact(tmp_path: Path) -> None:
    """Turn 1 finds its blocks; turn 2 (grown) stats only the new ones; a block removed by
    another opener of the root (an engine's eviction) is missed at once by turn 3."""
    store = _posix(tmp_path)
    prompt = np.arange(1, 202, dtype=np.int64)  # 201 tokens: 50 full blocks looked up
    keys = prefix_keys(prompt.tolist() + list(range(500, 540)), NS)
    for key in keys[:55]:
        _put(store, key)
    stats = _count_contains(store)
    sched = _scheduler(store)
    try:
        def cached(tokens: np.ndarray, turn: int) -> int:
            stats.clear()
            sched.submit(TurnRequest(7, turn, tokens, 4))
            return sched.queue[-1].cached // NS.shape.block_tokens

        assert cached(prompt, 0) == 50 and len(stats) == 50
        grown = np.concatenate([prompt, np.arange(500, 540)])  # 241 tokens: 60 blocks
        assert cached(grown, 1) == 55 and len(stats) == 6  # 5 new hits and the first miss
        _posix(tmp_path).delete(keys[20])  # another process's eviction
        assert cached(grown, 2) == 20 and len(stats) == 21
        _put(store, keys[20])  # written again: found again (additions need no generation)
        assert cached(grown, 3) == 55
        for key in keys[:3]:  # removed by hand, not through a store: not seen (documented)
            os.unlink(store.path(key))
        assert cached(grown, 4) == 55 and len(stats) == 1
        _posix(tmp_path).delete(keys[40])
        assert cached(grown, 5) == 0  # the generation moved: every block checked again
    finally:
        sched.ep.close()


def test_blocks_a_turn_stored_need_no_stat_at_the_next_lookup(tmp_path: Path) -> None:
    """A DE's done says how many of the turn's blocks are stored (``Done.stored``): the
    agent's next lookup takes those as present without a stat, checks from the first one
    a write failed on, and walks everything once the store has removed a block since."""
    store = _posix(tmp_path)
    prompt = np.arange(1, 202, dtype=np.int64)  # 201 tokens: 50 full blocks looked up
    out = tuple(range(600, 640))
    chain = prefix_keys(prompt.tolist() + list(out[:-1]), NS)  # 60 blocks: what a DE keeps
    stats = _count_contains(store)
    sched = _scheduler(store)
    sched.register(0, "decode", 0, 0)
    grown = np.concatenate([prompt, np.asarray(out), np.arange(700, 720)])  # 65 blocks
    try:
        def done(f: Any, stored: int) -> None:  # as a DE that stored ``stored`` blocks
            header, frames = encode(Done(0, f.rid, f.att, out, 0, 0.0, stored=stored))
            sched._handle(Message(header, frames))

        def turn(tokens: np.ndarray, n: int, stored: int | None = None) -> int:
            """Submit turn ``n``; answer it with ``done(stored)`` if given."""
            stats.clear()
            sched.submit(TurnRequest(7, n, tokens, len(out)))
            f = sched.queue.pop()
            if stored is not None:
                done(f, stored)
            return f.cached // NS.shape.block_tokens

        for key in chain[:50]:
            _put(store, key)
        assert turn(prompt, 0) == 50 and len(stats) == 50
        for key in chain[50:]:
            _put(store, key)
        assert turn(prompt, 1, stored=60) == 50  # the DE wrote blocks 50-59
        assert turn(grown, 2) == 60 and stats == [prefix_keys(grown.tolist(), NS)[60]]
        # a write failed at block 55: from there on each block is checked again
        assert turn(prompt, 3, stored=55) == 50
        assert turn(grown, 4) == 60 and len(stats) == 6
        # a removal after the turn's lookup (before its blocks were written): no trust
        sched.submit(TurnRequest(7, 6, prompt, len(out)))
        f = sched.queue.pop()
        _posix(tmp_path).delete(chain[10])
        done(f, 60)
        assert turn(grown, 7) == 10 and len(stats) == 11
    finally:
        sched.ep.close()


def test_a_store_without_a_generation_is_walked_in_full() -> None:
    class Plain:
        def __init__(self) -> None:
            self.inner = MemoryStore(registry=MetricsRegistry())
            self.calls = 0

        def contains(self, key: BlockKey) -> bool:
            self.calls += 1
            return self.inner.contains(key)

        def __getattr__(self, name: str) -> object:
            return getattr(self.inner, name)

    store = Plain()
    prompt = np.arange(1, 82, dtype=np.int64)  # 20 blocks looked up
    for key in prefix_keys(prompt.tolist(), NS):
        _put(store.inner, key)
    assert removal_generation(store) is None
    sched = _scheduler(store)  # type: ignore[arg-type]
    try:
        for turn in range(2):
            store.calls = 0
            sched.submit(TurnRequest(3, turn, prompt, 4))
            assert sched.queue[-1].cached == 80 and store.calls == 20
    finally:
        sched.ep.close()

