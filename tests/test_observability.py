"""Hit rates with a denominator and miss reasons: each test causes misses and counts them.

The expected numbers come from what the test did to the store or the prompt (blocks the store
held before it was emptied, a changed first token, a corrupted block), not from the code
that attributes them.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from dualpath_cli.cluster.system import RuntimeSystem
from dualpath_cli.core.layout import BlockKey, BlockShape, Namespace, prefix_keys
from dualpath_cli.runtime.options import RuntimeOptions
from dualpath_cli.runtime.turns import TurnRequest
from dualpath_cli.storage import HEADER_SIZE, MemoryStore, StorageLoader, encode_block
from dualpath_cli.telemetry.registry import MetricsRegistry

BT = 8  # block tokens
GEN = 3


def _misses(system: RuntimeSystem, tier: str = "store") -> dict[str, float]:
    reg = system.scheduler.registry
    fam = reg.snapshot().get("dualpath_kv_miss_blocks_total", [])
    return {s["labels"]["reason"]: s["value"] for s in fam
            if s["labels"]["tier"] == tier and s["value"]}


def _turn(system: RuntimeSystem, agent: int, turn: int, prompt: list[int]) -> list[int]:
    result = system.submit(TurnRequest(agent, turn, np.asarray(prompt), GEN)).wait(120)
    return [int(t) for t in result.tokens]


@pytest.fixture()
def system() -> Iterator[tuple[RuntimeSystem, MemoryStore]]:
    store = MemoryStore()
    with RuntimeSystem(RuntimeOptions(policy="dualpath", block_tokens=BT,
                                      heartbeat_timeout=30.0), store) as sys_:
        yield sys_, store


def test_changed_system_prompt_shows_prefix_diverged(
        system: tuple[RuntimeSystem, MemoryStore]) -> None:
    sys_, store = system
    p0 = [(i * 7) % 250 + 1 for i in range(41)]
    out0 = _turn(sys_, 0, 0, p0)
    p1 = p0 + out0 + [200 + i for i in range(12)]
    out1 = _turn(sys_, 0, 1, p1)
    stored = len(list(store.keys()))  # every block this agent's turns wrote
    assert _misses(sys_).get("prefix_diverged", 0) == 0
    before = _misses(sys_)
    p2 = [251] + p1[1:] + out1 + [220 + i for i in range(12)]  # a new system prompt
    _turn(sys_, 0, 2, p2)
    after = _misses(sys_)
    lookup = (len(p2) - 1) // BT
    assert after["prefix_diverged"] - before.get("prefix_diverged", 0) == min(lookup, stored)
    assert (after["never_stored"] - before["never_stored"]
            == lookup - min(lookup, stored))
    # the decision log says the same for the request
    last = sys_.decisions()[-1]
    assert last.cached == 0
    assert last.inputs["lookup"]["misses"] == {
        k: v for k, v in {"prefix_diverged": min(lookup, stored),
                          "never_stored": lookup - min(lookup, stored)}.items() if v}


def test_emptied_store_shows_evicted_with_age(system: tuple[RuntimeSystem, MemoryStore]
                                              ) -> None:
    sys_, store = system
    p0 = [(i * 11) % 250 + 1 for i in range(50)]
    out0 = _turn(sys_, 3, 0, p0)
    stored = len(list(store.keys()))
    assert stored == (len(p0) + GEN - 1) // BT
    report = store.gc(capacity_bytes=0)  # capacity pressure: every block evicted
    assert report.evicted_blocks == stored
    p1 = p0 + out0 + [9] * 20
    _turn(sys_, 3, 1, p1)
    lookup = (len(p1) - 1) // BT
    got = _misses(sys_)
    assert got["evicted"] == stored
    assert got["never_stored"] == (len(p0) - 1) // BT + lookup - stored
    age = sys_.scheduler.registry.snapshot()["dualpath_kv_evicted_block_age_seconds"][0]
    assert age["count"] == stored and age["sum"] > 0
    look = sys_.decisions()[-1].inputs["lookup"]
    assert look["misses"]["evicted"] == stored and look["evicted_age_s"] > 0


def test_corrupted_block_shows_quarantined(system: tuple[RuntimeSystem, MemoryStore]) -> None:
    sys_, store = system
    p0 = [(i * 5) % 250 + 1 for i in range(40)]
    out0 = _turn(sys_, 4, 0, p0)
    p1 = p0 + out0 + [77] * 12
    stored = len(list(store.keys()))
    key = prefix_keys(p1, sys_.namespace)[2]
    raw = bytearray(store.raw(key))
    raw[HEADER_SIZE] ^= 0xFF  # one payload byte: the checksum fails, the store quarantines it
    store.set_raw(key, bytes(raw))
    before = _misses(sys_)
    _turn(sys_, 4, 1, p1)
    after = _misses(sys_)
    lookup = (len(p1) - 1) // BT
    # the second attempt could use blocks 0 and 1 only: the corrupt block 2 and the stored
    # chain after it missed because of the quarantine; the blocks past it were never stored
    assert after["quarantined"] - before.get("quarantined", 0) == stored - 2
    assert len(store.quarantined()) == 1
    first, second = [d for d in sys_.decisions() if d.turn == 1 and d.agent == 4]
    assert first.attempt == 0 and second.attempt == 1 and second.cached == 2 * BT
    assert second.inputs["lookup"]["misses"] == {"quarantined": stored - 2,
                                                 "never_stored": lookup - stored}
    assert first.inputs["lookup"]["misses"] == {"never_stored": lookup - stored}
    story, outcome = sys_.scheduler.request(second.rid)
    assert len(story) == 2 and outcome is not None and outcome["attempts"] == 2


def test_token_counters_give_hit_rates(system: tuple[RuntimeSystem, MemoryStore]) -> None:
    sys_, _ = system
    p0 = [(i * 13) % 250 + 1 for i in range(33)]
    out0 = _turn(sys_, 5, 0, p0)
    p1 = p0 + out0 + [5] * 10
    _turn(sys_, 5, 1, p1)
    snap = sys_.scheduler.registry.snapshot()
    req = {s["labels"]["tier"]: s["value"] for s in snap["dualpath_kv_requested_tokens_total"]}
    hit = {s["labels"]["tier"]: s["value"] for s in snap["dualpath_kv_hit_tokens_total"]}
    cached = [d.cached for d in sys_.decisions()]
    assert req["store"] == len(p0) + len(p1) == req["hbm"]
    assert hit["store"] == sum(cached) > 0 and hit["hbm"] == 0
    # per layer, the PE placed exactly the cached tokens in HBM (merged over engines)
    layers: dict[str, float] = {}
    for m in sys_.metrics().values():
        for s in m["metrics"].get("dualpath_kv_layer_hit_tokens_total", []):
            layers[s["labels"]["layer"]] = layers.get(s["labels"]["layer"], 0) + s["value"]
    assert layers and set(layers.values()) == {sum(cached)}


def _blocks(n: int) -> tuple[MemoryStore, list[BlockKey], int]:
    shape = BlockShape(2, 4, 16)
    ns = Namespace("m", "layer_major", shape, "fp16")
    store = MemoryStore()
    keys = [BlockKey(bytes([i + 1]) * 16) for i in range(n)]
    for key in keys:
        header, payload = encode_block(key, np.full((2, 4, 8), key.raw[0], np.float16), ns)
        store.put(header, payload)
    return store, keys, header.file_nbytes


def test_small_dram_buffer_shows_evicted_with_age() -> None:
    store, keys, size = _blocks(3)
    reg = MetricsRegistry()
    cache = 2 * size + size // 2  # room for two blocks, not three
    with StorageLoader(store, node=0, role="decode", cache_bytes=cache, block_tokens=4,
                       registry=reg) as loader:
        for key in keys:  # a, b, c: c evicts a
            loader.load([key], timeout=10).release()
        assert len(loader.cache) == 2
        again = loader.load([keys[0]], timeout=10)  # evicted: read from the store again
        assert again.dram_misses == {"evicted": 1} and again.store_hits == 1
        again.release()
        loader.load([keys[2]], timeout=10).release()  # still buffered: a DRAM hit
    value = reg.value
    assert value("dualpath_kv_miss_blocks_total", tier="dram", reason="evicted") == 1
    assert value("dualpath_kv_miss_blocks_total", tier="dram", reason="never_stored") == 3
    assert value("dualpath_kv_requested_tokens_total", tier="dram") == 5 * 4
    assert value("dualpath_kv_hit_tokens_total", tier="dram") == 1 * 4
    assert value("dualpath_kv_read_bytes_total", tier="dram", side="de") == size
    assert value("dualpath_kv_read_bytes_total", tier="store", side="de") == 4 * size
    age = reg.snapshot()["dualpath_kv_evicted_block_age_seconds"][0]
    assert age["count"] == 1 and age["sum"] >= 0


def test_corrupt_dram_discard_and_read_failure_reasons() -> None:
    store, keys, _ = _blocks(2)
    blob = bytearray(store.raw(keys[1]))
    blob[HEADER_SIZE] ^= 0xFF
    store.set_raw(keys[1], bytes(blob))
    with StorageLoader(store, node=0, cache_bytes=1 << 20, block_tokens=4,
                       registry=MetricsRegistry()) as loader:
        result = loader.load(keys, timeout=10)
        assert result.hit_prefix == 1 and result.why(1) == "quarantined"
        assert result.why(0) == ""
        result.release()
        assert loader.cache.miss_reason(keys[1]) == ("quarantined", None)
        store.delete(keys[0])
        loader.cache.clear()
        gone = loader.load([keys[0]], timeout=10)
        assert gone.why(0) == "evicted"  # in the store at lookup time, gone when read


def test_ledger_reasons_from_a_failed_read_cover_only_the_blocks_it_found() -> None:
    from dualpath_cli.runtime.ledger import RequestLedger, reason_from_why

    ns = Namespace("m", "layer_major", BlockShape(2, 4, 16), "fp16")
    reg = MetricsRegistry()
    ledger = RequestLedger(reg, ns)
    tokens = list(range(1, 42))  # 41 tokens: 10 blocks looked up
    keys = prefix_keys(tokens, ns)
    first = ledger.lookup(1, agent=9, keys=keys, prompt_tokens=41, hits=6, now=0.0)
    assert first.misses == {"never_stored": 4}
    assert ledger.failed(1, 3, "timed out: missing or corrupt block",
                         [k.hex for k in keys[:6]]) == "read_failed"
    assert reason_from_why("timed_out: slow store") == "timed_out"
    again = ledger.lookup(1, agent=9, keys=keys, prompt_tokens=41, hits=3, now=1.0)
    assert again.misses == {"read_failed": 3, "never_stored": 4}
    ledger.finished(1, 9, output=[7, 8, 9, 10, 11], tokens=tokens, timeline={}, now=2.0)
    assert ledger.outcome(1) is not None
    # the agent's next prompt: same chain for 11 blocks (41 + 4 output tokens, 45 // 4)
    follow = tokens + [7, 8, 9, 10] + list(range(50, 60))
    look = ledger.lookup(2, agent=9, keys=prefix_keys(follow, ns), prompt_tokens=len(follow),
                         hits=5, now=12.0)
    assert look.misses == {"evicted": 6, "never_stored": (len(follow) - 1) // 4 - 11}
    assert look.evicted_age_s == 10.0
    changed = [0] + follow[1:]
    look = ledger.lookup(3, agent=9, keys=prefix_keys(changed, ns),
                         prompt_tokens=len(changed), hits=0, now=12.0)
    assert look.misses == {"prefix_diverged": 11, "never_stored": (len(changed) - 1) // 4 - 11}
    assert reg.value("dualpath_kv_miss_blocks_total", tier="store", reason="evicted") == 6
