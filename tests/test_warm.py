"""Warm-up (issue 14 item 7): the Warmer fills a loader's DRAM cache under its cap, a warmed
prefix then hits DRAM where a cold one reads the store, and bad template files are refused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import wait_until

from dualpath_cli.core.layout import BlockKey, BlockShape, Namespace, prefix_keys
from dualpath_cli.services.live import LiveCluster
from dualpath_cli.storage import MemoryStore, StorageLoader, encode_block
from dualpath_cli.storage.header import file_nbytes
from dualpath_cli.storage.warm import Warmer
from dualpath_cli.telemetry.registry import MetricsRegistry
from dualpath_cli.telemetry.warmup import Template

SHAPE = BlockShape(2, 16, 64)
NS = Namespace("m", "layer_major", SHAPE, "fp16")
BLOCK = file_nbytes(SHAPE.full_nbytes)


def _store(tokens: list[int]) -> tuple[MemoryStore, list[BlockKey]]:
    store = MemoryStore()
    keys = prefix_keys(tokens, NS)
    for i, key in enumerate(keys):
        store.put(*encode_block(key, np.full((2, 16, 32), i, dtype=np.float16), NS))
    return store, keys


class FakeClock:
    """Time that moves only when the limiter sleeps."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.slept += seconds


def _value(reg: MetricsRegistry, name: str) -> float:
    return sum(row["value"] for row in reg.snapshot().get(name, []))


def test_warm_fills_the_cache_then_a_request_hits_dram() -> None:
    tokens = list(range(16 * 12))
    store, keys = _store(tokens)
    reg = MetricsRegistry()
    with StorageLoader(store, cache_bytes=64 * BLOCK, registry=reg) as loader:
        clock = FakeClock()
        warmer = Warmer(loader, keys, 50 * BLOCK, block_nbytes=BLOCK, registry=reg,
                        clock=clock, sleep=clock.sleep)
        progress = warmer.run()
        assert progress.state == "done" and progress.read == len(keys)
        assert progress.bytes == len(keys) * BLOCK and progress.remaining == 0
        assert _value(reg, "dualpath_storage_warm_bytes_total") == len(keys) * BLOCK
        assert _value(reg, "dualpath_storage_warm_blocks_remaining") == 0
        # the warm-up's own reads are not a request's lookup: no DRAM lookups counted
        hits = {r["labels"]["tier"]: r["value"]
                for r in reg.snapshot()["dualpath_storage_cache_misses_total"]}
        assert hits.get("dram", 0) == 0
        result = loader.load(keys, timeout=10)
        try:
            assert result.dram_hits == len(keys) and result.store_hits == 0
        finally:
            result.release()


def test_a_cold_loader_reads_the_store() -> None:
    store, keys = _store(list(range(16 * 4)))
    with StorageLoader(store, cache_bytes=64 * BLOCK, registry=MetricsRegistry()) as loader:
        result = loader.load(keys, timeout=10)
        try:
            assert result.store_hits == len(keys) and result.dram_hits == 0
        finally:
            result.release()


def test_the_limiter_holds_the_cap_on_its_own_accounting() -> None:
    store, keys = _store(list(range(16 * 40)))
    rate = 4.5 * BLOCK  # bytes/s: one-block chunks, one every ~0.22 s of fake time
    with StorageLoader(store, cache_bytes=64 * BLOCK, registry=MetricsRegistry()) as loader:
        clock = FakeClock()
        warmer = Warmer(loader, keys, rate, block_nbytes=BLOCK, chunk_s=0.5,
                        clock=clock, sleep=clock.sleep)
        t0 = clock.now
        progress = warmer.run()
    assert progress.read == len(keys)
    assert warmer.chunk == 2 and len(warmer.submits) == len(keys) // 2
    for at, before in warmer.submits:  # chunk k starts only once 0..k-1 fit under the cap
        assert before <= rate * (at - t0) + 1e-6
    # and it does not dawdle either: the whole warm-up took what the cap allows
    assert abs((clock.now - t0) - len(keys) * BLOCK / rate) < 1e-6


def test_already_cached_and_missing_blocks_are_counted_apart() -> None:
    store, keys = _store(list(range(16 * 6)))
    gone = BlockKey(b"\x01" * 16)
    with StorageLoader(store, cache_bytes=64 * BLOCK, registry=MetricsRegistry()) as loader:
        loader.load(keys[:2], timeout=10).release()  # two already in DRAM
        clock = FakeClock()
        progress = Warmer(loader, [*keys, gone], 1e9, block_nbytes=BLOCK, clock=clock,
                          sleep=clock.sleep).run()
    assert (progress.read, progress.cached, progress.missing) == (4, 2, 1)
    assert progress.state == "done" and progress.bytes == 4 * BLOCK


def test_stop_ends_a_warm_up_early() -> None:
    store, keys = _store(list(range(16 * 8)))
    with StorageLoader(store, cache_bytes=64 * BLOCK, registry=MetricsRegistry()) as loader:
        warmer = Warmer(loader, keys, BLOCK / 60, block_nbytes=BLOCK)  # a block a minute
        warmer.start()
        warmer.stop()  # interrupts the limiter's wait (a minute) at once
        progress = warmer.wait(10)
    assert progress.state == "stopped" and progress.done < len(keys)


# -- templates files -------------------------------------------------------------------------
def test_templates_files_in_yaml_and_json(tmp_path: Path) -> None:
    from dualpath_cli.services.warm import load_templates

    y = tmp_path / "t.yaml"
    y.write_text("templates:\n  - name: sys\n    text: hi there\n"
                 "  - name: ids\n    tokens: [1, 2, 3]\n  - name: trace\n    shared: [[42, 20]]\n")
    got = load_templates(y)
    assert [t.name for t in got] == ["sys", "ids", "trace"]
    assert got[0].tokens == tuple(b"hi there") and got[1].tokens == (1, 2, 3)
    assert len(got[2].tokens) == 20
    j = tmp_path / "t.json"
    j.write_text(json.dumps([{"name": "ids", "tokens": [4, 5]}]))
    assert load_templates(j)[0].tokens == (4, 5)


@pytest.mark.parametrize(("text", "why"), [
    ("", "expected a non-empty list"),
    ("templates: 3\n", "expected a non-empty list"),
    ("- {name: a}\n", "give exactly one of tokens, text, shared"),
    ("- {name: a, tokens: [1], text: x}\n", "got tokens, text"),
    ("- {name: a, tokens: [1, 300]}\n", "token id 300 is not an integer in"),
    ("- {name: a, tokens: [1]}\n- {name: a, text: b}\n", "duplicate name 'a'"),
    ("- {name: a, shared: [[1]]}\n", "expected \\[seed, tokens\\]"),
    ("- {name: a, tokenz: [1]}\n", "unknown key 'tokenz'"),
    ("- [1, 2]\n", "expected a mapping"),
    ("templates: [\n", "invalid YAML"),
    ("version: 2\ntemplates: []\n", "unsupported version 2"),
])
def test_bad_templates_files_are_refused_in_one_line(tmp_path: Path, text: str,
                                                     why: str) -> None:
    from dualpath_cli.services.warm import TemplateError, load_templates

    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(TemplateError, match=why) as err:
        load_templates(path)
    assert "\n" not in str(err.value) and str(err.value).startswith(str(path))


def test_the_cli_refuses_a_bad_templates_file(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    from dualpath_cli.cli.app import main

    (tmp_path / "store" / "blocks").mkdir(parents=True)
    bad = tmp_path / "bad.json"
    bad.write_text('[{"name": "x", "tokens": [1, 2,]}]')
    assert main(["storage", "warm", str(tmp_path / "store"), "--templates", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "bad.json:1: invalid JSON" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_rates_are_a_share_of_the_nic_or_a_bandwidth() -> None:
    from dualpath_cli.errors import UsageError
    from dualpath_cli.services.warm import parse_rate

    assert parse_rate(None, 1e9) == pytest.approx(1e8)  # 10% by default
    assert parse_rate("25%", 1e9) == pytest.approx(2.5e8)
    assert parse_rate("200MB/s", 0.0) == pytest.approx(2e8)
    for bad, snic in (("10%", 0.0), ("0%", 1e9), ("0MB/s", 1e9), ("fast", 1e9)):
        with pytest.raises(UsageError):
            parse_rate(bad, snic)


def test_the_plan_walks_the_stored_prefix_and_shares_blocks() -> None:
    from dualpath_cli.services.warm import plan_warm

    tokens = list(range(16 * 6))
    store, keys = _store(tokens[:16 * 4])  # 4 of the 6 blocks stored
    plan = plan_warm([Template("a", tuple(tokens)), Template("b", tuple(tokens[:16 * 3]))],
                     NS, store.contains, BLOCK)
    assert plan.keys == keys and plan.nbytes == 4 * BLOCK
    assert [(t.blocks, t.stored, t.shared) for t in plan.templates] == [(6, 4, 0), (3, 3, 3)]
    assert any("holds 4 of its 6 blocks" in n for n in plan.notes)
    cut = plan_warm([Template("a", tuple(tokens))], NS, store.contains, BLOCK, 3 * BLOCK)
    assert cut.keys == keys[:3] and cut.dropped == 1


# -- live: the engines' DRAM caches, through the API --------------------------------------
def _tier_counts(live: LiveCluster, name: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for report in live.system.metrics(fresh=True, timeout=10).values():
        for row in (report.get("metrics") or {}).get(name, []):
            tier = row["labels"].get("tier", "")
            out[tier] = out.get(tier, 0.0) + row["value"]
    return out


def _serve(live: LiveCluster, prompt: list[int]) -> int:
    ticket = live.submit(prompt, 2, None)
    result = ticket.wait(60)
    live.done(ticket)
    return int(result.cached)


@pytest.mark.e2e
def test_after_a_live_warm_up_the_first_turn_hits_dram(tmp_path: Path) -> None:
    from dualpath_cli.api.app import create_app
    from dualpath_cli.api.auth import TokenAuth
    from dualpath_cli.api.client import DualPathClient
    from dualpath_cli.api.errors import Rejected, Unauthorized
    from dualpath_cli.api.server import ServerThread
    from dualpath_cli.runtime.options import RuntimeOptions

    template = [(i * 7) % 250 + 1 for i in range(40)]  # 5 blocks of 8 tokens
    opts = dict(block_tokens=8, store_dir=tmp_path / "store", dram_cache_bytes=8 << 20,
                heartbeat_timeout=30.0, flops_rate=1e9)

    def cluster() -> LiveCluster:
        live = LiveCluster(RuntimeOptions(**opts))  # type: ignore[arg-type]
        live.start()
        return live

    live = cluster()  # serve the template once: its blocks are stored
    try:
        _serve(live, template + [3, 4, 5])
        ns, store = live.system.namespace, live.system.store
        keys = prefix_keys(template, ns)
        wait_until(lambda: all(store.contains(k) for k in keys), 30,  # the DE persists
                   "the template's blocks to be stored", interval=0.05)  # after the turn
    finally:
        live.drain(10)

    live = cluster()  # a cold restart: the first turn reads the store
    try:
        before = _tier_counts(live, "dualpath_storage_cache_hits_total")
        assert _serve(live, template + [9, 9, 9]) == 40
        after = _tier_counts(live, "dualpath_storage_cache_hits_total")
        assert after.get("dram", 0) - before.get("dram", 0) == 0
        assert after.get("store", 0) - before.get("store", 0) >= 5
    finally:
        live.drain(10)

    live = cluster()  # a restart, then a warm-up through the API
    auth = TokenAuth.generate(tmp_path / "token")
    try:
        with ServerThread(create_app(live, auth)) as server:
            with DualPathClient(server.url, None, timeout=20) as anon:
                with pytest.raises(Unauthorized):
                    anon.warm([Template("sys", tuple(template))], rate="1GB/s")
            with DualPathClient(server.url, auth.token, timeout=20) as client:
                with pytest.raises(Rejected, match="token id 999"):
                    client.warm([Template("sys", (999,))], rate="1GB/s")
                started = client.warm([Template("sys", tuple(template))], rate="1GB/s")
                assert started.plan is not None and started.plan.blocks == 5
                assert started.engines is not None and len(started.engines) == 3
                status = wait_until(
                    lambda: (s := client.warm_status()).progress is not None
                    and s.progress.done and s, 30, "the warm-up to finish", interval=0.05)
                assert status.progress is not None
                assert status.progress.bytes == 3 * 5 * file_nbytes(
                    ns.shape.full_nbytes)  # every engine read the 5 blocks once
                assert any(a.action == "warm" for a in live.audit)
        before = _tier_counts(live, "dualpath_storage_cache_hits_total")
        assert _serve(live, template + [7, 7, 7]) == 40
        after = _tier_counts(live, "dualpath_storage_cache_hits_total")
        assert after.get("dram", 0) - before.get("dram", 0) >= 5  # every template block
        assert after.get("store", 0) - before.get("store", 0) == 0
    finally:
        live.drain(10)


def test_the_monitor_shows_a_warm_up_in_progress(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from test_diagnose_rules import decision, make_view

    from dualpath_cli.cli import monitor_cmd
    from dualpath_cli.services.recording import write_recording
    from dualpath_cli.telemetry.recording import Extras, Sample, extras_from_metrics_text

    text = ('dualpath_storage_warm_blocks_remaining{engine="0",node="0"} 3\n'
            'dualpath_storage_warm_blocks_remaining{engine="1",node="0"} 2\n'
            'dualpath_storage_warm_blocks_remaining{engine="2",node="1"} 0\n')
    assert extras_from_metrics_text(text).warm_blocks_remaining == {0: 5, 1: 0}
    path = tmp_path / "rec.jsonl.gz"
    samples = [Sample(v.at, v, Extras(warm_blocks_remaining={0: 5 - 2 * i}))
               for i, v in enumerate(make_view(i) for i in range(3))]
    write_recording(path, {"source": "test"}, samples, [decision(1)])
    assert monitor_cmd.main(["--from", str(path), "-m", "warm", "--json"]) == 0
    objs = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    left = [o["metrics"]["warm"]["rows"][0]["value"] for o in objs]
    assert left == [5, 3, 1]


def test_storage_dram_cache_gives_the_engines_a_cache_to_warm() -> None:
    from dualpath_cli.config import load_config
    from dualpath_cli.errors import ConfigError
    from dualpath_cli.runtime.options import options_from_config

    def opts(*sets: str) -> int:
        loaded = load_config(overrides=list(sets), environment=False)
        return options_from_config(loaded, flops_rate=1e9).dram_cache_bytes

    assert opts() == 0  # off by default: every read crosses the storage NIC
    assert opts("storage.dram_cache=8MiB") == 8 << 20
    with pytest.raises(ConfigError, match="storage.dram_cache"):
        opts("storage.dram_cache=lots")


def test_live_progress_waits_for_every_live_engine_it_warms() -> None:
    from dualpath_cli.services.warm import live_progress

    def report(left: int | None, nbytes: int = 0, alive: bool = True) -> dict:
        metrics = {} if left is None else {
            "dualpath_storage_warm_blocks_remaining": [{"labels": {}, "value": left}],
            "dualpath_storage_warm_bytes_total": [{"labels": {}, "value": nbytes}]}
        return {"alive": alive, "metrics": metrics}

    busy = live_progress({0: report(0, 10), 1: report(2, 5)}, [0, 1])
    assert (busy["done"], busy["blocks_remaining"], busy["bytes"]) == (False, 2, 15)
    assert not live_progress({0: report(0), 1: report(None)}, [0, 1])["done"]  # not yet
    assert live_progress({0: report(0), 1: report(3, alive=False)}, [0, 1])["done"]
