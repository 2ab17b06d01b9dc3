"""Fault injection: the SPEC parser, the wire record, and each fault's effect on a served
cluster (a real LiveCluster with in-process engines behind a real uvicorn server; every check
reads what an operator reads: the view, the heartbeats, turn timings, status and audit)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import msgpack
import pytest
from conftest import wait_until
from served_cluster import serve_with_token

from dualpath_cli.api.auth import TokenAuth
from dualpath_cli.api.client import DualPathClient
from dualpath_cli.api.errors import Forbidden, Rejected, Unauthorized
from dualpath_cli.api.fake import FakeClient
from dualpath_cli.faultspec import Fault, FaultError, parse_fault, parse_faults
from dualpath_cli.runtime.hbm import HbmPool
from dualpath_cli.runtime.options import RuntimeOptions
from dualpath_cli.runtime.wire import decode, encode
from dualpath_cli.services.live import LiveCluster
from dualpath_cli.telemetry.view import ClusterView

#: The hbm-frag rule's warning level (diagnose/thresholds.py HBM_FRAG_WARN).
FRAG_WARN = 0.5
SLOW_HOST_S = 30.0
PROMPT = [(i * 7) % 250 + 1 for i in range(48)]  # 6 full blocks of 8 tokens


# --- the SPEC parser and the wire record -----------------------------------------------------
@pytest.mark.parametrize("spec", [
    "snic_throttle:node=1,fraction=0.25", "read_latency:node=0,latency=20ms",
    "read_errors:node=2,rate=0.1", "hot_blocks:node=0,count=3,rate=5",
    "hot_blocks:node=0,blocks=" + "ab" * 16 + "+" + "cd" * 16 + ",rate=20",
    "hbm_frag:engine=2,stride=4",
    "slow_compute:engine=1,factor=4", "store_full:node=1"])
def test_spec_round_trips_through_text_and_the_wire(spec: str) -> None:
    f = parse_fault(spec)
    assert parse_fault(f.spec()) == f and f.spec() == spec
    header, frames = encode(f)
    assert header["t"] == "fault" and frames == []
    assert decode(msgpack.unpackb(msgpack.packb(header))) == f


def test_defaults_and_replacement() -> None:
    assert parse_fault("hbm_frag:engine=3") == Fault("hbm_frag", engine=3, stride=4)
    assert parse_fault(" hot_blocks:node=1 ").count == 4
    faults = parse_faults(["slow_compute:engine=1,factor=2", "slow_compute:engine=1,factor=5",
                           "slow_compute:engine=2,factor=3"])
    assert [(f.engine, f.factor) for f in faults] == [(1, 5.0), (2, 3.0)]


@pytest.mark.parametrize(("spec", "reason"), [
    ("", "empty fault spec"),
    ("nic_throttle:node=1", "unknown fault kind 'nic_throttle'"),
    ("snic_throttle:fraction=0.5", "missing node"),
    ("snic_throttle:node=1", "missing fraction"),
    ("snic_throttle:node=1,fraction=0", "must be in (0, 1]"),
    ("snic_throttle:node=1,fraction=abc", "'abc' is not a number"),
    ("snic_throttle:node=-1,fraction=0.5", "whole number >= 0"),
    ("snic_throttle:node=1,fraction=0.5,speed=2", "unknown key 'speed'"),
    ("snic_throttle:node=1,node=2,fraction=0.5", "node given twice"),
    ("read_latency:node=1,latency=soon", "latency: invalid duration"),
    ("read_latency:node=1,latency=1h", "at most 10s"),
    ("read_errors:node=1,rate=2", "must be in (0, 1]"),
    ("hot_blocks:node=1,blocks=xyz", "not a block key (32 hex digits"),
    ("hot_blocks:node=1,blocks=" + "ab" * 16 + ",count=2", "blocks or count, not both"),
    ("hbm_frag:engine=1,stride=1", "whole number >= 2"),
    ("slow_compute:engine=1,factor=0.5", "must be in [1, 100]"),
    ("slow_compute:engine=1,factor", "'factor' is not key=value"),
    ("store_full:engine=1", "unknown key 'engine'"),
    ("store_full:", "missing node (e.g. store_full:node=1)"),
])
def test_bad_specs_give_one_line_naming_the_problem(spec: str, reason: str) -> None:
    with pytest.raises(FaultError) as err:
        parse_fault(spec)
    assert reason in str(err.value) and "\n" not in str(err.value)
    assert err.value.exit_code == 2


def test_pin_stride_fragments_free_space_and_compaction_undoes_it() -> None:
    pool = HbmPool(64, 8, with_data=False)
    pool.allocate(7, 10)
    assert pool.stats().fragmentation == 0.0
    taken = pool.pin_stride(-1, 4)
    st = pool.stats()
    assert taken == 54 // 4 and st.largest_free_run == 3
    assert st.fragmentation > FRAG_WARN
    pool.compact()
    assert pool.stats().fragmentation == 0.0
    assert pool.free(-1) == taken


@pytest.mark.e2e
def test_fake_client_checks_token_and_specs_like_the_server(
        one_view: ClusterView) -> None:
    fake = FakeClient(one_view)
    entry = fake.set_faults(["hbm_frag:engine=1"])
    assert entry.action == "faults" and entry.new["faults"][0]["engine"] == 1
    assert [f.kind for f in fake.status().faults] == ["hbm_frag"]
    with pytest.raises(Rejected, match="unknown fault kind"):
        fake.set_faults(["bogus:node=1"])
    assert fake.clear_faults().old["faults"] and fake.status().faults == ()
    with pytest.raises(Unauthorized):
        FakeClient(one_view, client_token=None).set_faults(["hbm_frag:engine=1"])
    with pytest.raises(Forbidden):
        FakeClient(one_view, client_token="nope").clear_faults()


# --- a served cluster ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveCluster, TokenAuth,
                                                                        str]]:
    # basic: the PE (node 0) reads every hit block through node 0's storage NIC, shaped to
    # 400 KB/s so a 6-block hit (about 50 KB) takes ~0.12 s to read
    opts = RuntimeOptions(policy="basic", prefill_nodes=1, decode_nodes=1, block_tokens=8,
                          hbm_blocks=64, snic_bw=400e3, heartbeat_timeout=SLOW_HOST_S)
    with serve_with_token(opts, tmp_path_factory.mktemp("run") / "token") as s:
        yield s.live, s.auth, s.url


@pytest.fixture(scope="module")
def one_view(served: tuple[LiveCluster, TokenAuth, str]) -> ClusterView:
    return served[0].view()


@pytest.fixture()
def client(served: tuple[LiveCluster, TokenAuth, str]) -> Iterator[DualPathClient]:
    live, auth, url = served
    with DualPathClient(url, auth.token, timeout=20) as c:
        yield c
        c.clear_faults()
    assert live.faults() == []


def _turn(live: LiveCluster, gen: int = 1) -> tuple[float, int, int]:
    """Submit PROMPT; (TTFT s, cached tokens, attempts)."""
    ticket = live.submit(list(PROMPT), gen)
    r = ticket.wait(60)
    live.done(ticket)
    return r.first_at - r.submitted, r.cached, r.attempts


def _cached_ttft(live: LiveCluster, n: int = 3) -> float:
    """Median TTFT of ``n`` turns that hit PROMPT's stored blocks."""
    out = []
    for _ in range(n):
        ttft, cached, _ = _turn(live)
        assert cached > 0
        out.append(ttft)
    return statistics.median(out)


@pytest.mark.e2e
def test_patch_faults_auth_and_bad_specs(served: tuple[LiveCluster, TokenAuth, str]) -> None:
    live, auth, url = served
    body = {"faults": ["hbm_frag:engine=1"]}
    r = httpx.patch(f"{url}/api/v1/faults", json=body)
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    r = httpx.patch(f"{url}/api/v1/faults", json=body,
                    headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 403
    assert httpx.delete(f"{url}/api/v1/faults").status_code == 401
    good = {"Authorization": f"Bearer {auth.token}"}
    for bad, reason in (({"faults": ["hbm_frag:engine=9"]}, "engine 9 does not exist"),
                        ({"faults": ["snic_throttle:node=0,fraction=2"]}, "(0, 1]"),
                        ({"faults": ["warp:node=0"]}, "unknown fault kind 'warp'"),
                        ({"faults": []}, "faults"), ({"faults": [3]}, "faults"),
                        ({"faults": ["hbm_frag:engine=1"], "x": 1}, "x")):
        r = httpx.patch(f"{url}/api/v1/faults", json=bad, headers=good)
        assert r.status_code == 422, (bad, r.text)
        assert reason in r.json()["detail"] and "\n" not in r.json()["detail"]
    assert live.faults() == [] and not [a for a in live.audit if a.action == "faults"]


@pytest.mark.e2e
def test_hbm_frag_shows_in_the_view_is_listed_audited_and_cleared(
        served: tuple[LiveCluster, TokenAuth, str], client: DualPathClient) -> None:
    live, auth, _ = served

    def frag(eid: int) -> float:
        return next(e.hbm_fragmentation or 0.0 for e in client.view().engines
                    if e.engine_id == eid)

    assert client.status().faults == ()
    entry = client.set_faults(["hbm_frag:engine=1,stride=4"])
    assert entry.action == "faults" and entry.token_id == auth.token_id
    assert entry.old == {"faults": []}
    (new,) = entry.new["faults"]
    assert new.pop("since") > 0  # when it was injected; the cluster numbers it
    assert new == {"spec": "hbm_frag:engine=1,stride=4", "kind": "hbm_frag", "engine": 1,
                   "stride": 4, "id": 1}
    wait_until(lambda: frag(1) > FRAG_WARN, 10, "engine 1's fragmentation in the view")
    assert frag(0) < 0.05
    st = client.status()
    assert [f.spec() for f in st.faults] == ["hbm_frag:engine=1,stride=4"]
    assert st.audit[-1].action == "faults"
    # the cluster still serves turns on the fragmented engine (the pool is paged)
    assert _turn(live, gen=3)[2] == 1
    cleared = client.clear_faults()
    assert cleared.old["faults"][0]["engine"] == 1 and cleared.new == {"faults": []}
    wait_until(lambda: frag(1) < 0.05, 10, "engine 1's fragmentation to go")
    assert client.status().faults == ()


@pytest.mark.e2e
def test_slow_compute_raises_the_engines_busy_time_per_batch(
        served: tuple[LiveCluster, TokenAuth, str], client: DualPathClient) -> None:
    live, _, _ = served
    hbs = live.system.scheduler.heartbeats

    def busy_per_batch(turns: int) -> float:
        before = hbs()[0]
        assert before is not None
        for _ in range(turns):
            _turn(live)
        n0 = before.n
        wait_until(lambda: (hbs()[0] or before).n > n0 + 2, 5, "fresh heartbeats")
        after = hbs()[0]
        assert after is not None and after.batches > before.batches
        return (after.busy_s - before.busy_s) / (after.batches - before.batches)

    # other processes on a busy host only add to wall-clock busy time: take the least of
    # three measures where the engine is not slowed
    _turn(live)
    normal = min(busy_per_batch(2) for _ in range(3))
    client.set_faults(["slow_compute:engine=0,factor=6"])
    slow = busy_per_batch(4)
    assert slow > 3 * normal, (normal, slow)
    client.clear_faults()
    assert min(busy_per_batch(2) for _ in range(3)) < slow / 2


@pytest.mark.e2e
def test_snic_throttle_slows_the_nodes_reads(served: tuple[LiveCluster, TokenAuth, str],
                                             client: DualPathClient) -> None:
    live, _, _ = served
    _turn(live)  # PROMPT's blocks are stored
    base = _cached_ttft(live)
    client.set_faults(["snic_throttle:node=0,fraction=0.25"])
    throttled = _cached_ttft(live)
    # reads are ~0.12 s of a cached turn at full rate; at a quarter they take ~0.5 s
    assert throttled > base + 0.2, (base, throttled)
    client.clear_faults()
    assert _cached_ttft(live) < throttled - 0.15


@pytest.mark.e2e
def test_snic_throttle_needs_shaped_nics_and_a_real_node(client: DualPathClient) -> None:
    with pytest.raises(Rejected, match="node 7 does not exist"):
        client.set_faults(["snic_throttle:node=7,fraction=0.5"])


@pytest.mark.e2e
def test_read_latency_and_read_errors(served: tuple[LiveCluster, TokenAuth, str],
                                      client: DualPathClient) -> None:
    live, _, _ = served
    _turn(live)
    base = _cached_ttft(live)
    client.set_faults(["read_latency:node=0,latency=300ms"])
    assert _cached_ttft(live) >= base + 0.25
    client.clear_faults()
    requeued = live.view().scheduler.requeued_total
    client.set_faults(["read_errors:node=0,rate=1"])
    _, cached, attempts = _turn(live, gen=2)  # the turn survives: re-queued, recomputed
    assert attempts >= 2 and cached == 0
    assert live.view().scheduler.requeued_total > requeued
    client.clear_faults()
    assert _turn(live)[1] > 0  # reads work again


def _store_counter(live: LiveCluster, name: str, **labels: str) -> float:
    """A storage counter summed over the engines' fresh metrics, where its labels match."""
    total = 0.0
    for snap in live.system.metrics(fresh=True, timeout=5).values():
        for row in snap["metrics"].get(name, []):
            if all(row["labels"].get(k) == v for k, v in labels.items()):
                total += row["value"]
    return total


@pytest.mark.e2e
def test_read_errors_are_counted_on_the_node(served: tuple[LiveCluster, TokenAuth, str],
                                             client: DualPathClient) -> None:
    live, _, _ = served
    _turn(live)
    before = _store_counter(live, "dualpath_storage_read_errors_total", node="0",
                            reason="read_failed")
    client.set_faults(["read_errors:node=0,rate=1"])
    _turn(live, gen=2)  # served: its failed reads re-queued, the prefix recomputed
    assert _store_counter(live, "dualpath_storage_read_errors_total", node="0",
                          reason="read_failed") > before


@pytest.mark.e2e
def test_store_full_refuses_writes_as_enospc_and_turns_are_still_served(
        served: tuple[LiveCluster, TokenAuth, str], client: DualPathClient) -> None:
    live, _, _ = served
    _turn(live)
    full = {"node": "1", "reason": "full"}  # node 1: the decode node, which persists KV
    before = _store_counter(live, "dualpath_storage_write_errors_total", **full)
    client.set_faults(["store_full:node=1"])
    assert [f.kind for f in client.status().faults] == ["store_full"]
    other = [(i * 11) % 250 + 1 for i in range(40)]  # a new prompt: new blocks to persist
    tokens, _ = _serve(live, other, 3)
    assert len(tokens) == 3  # served all the same
    assert _store_counter(live, "dualpath_storage_write_errors_total", **full) > before
    assert _serve(live, other, 1)[1] == 0  # nothing of it was kept: no hit
    refused = _store_counter(live, "dualpath_storage_write_errors_total", **full)
    # status names the node whose store refused them (from the engines' metrics frames)
    wait_until(lambda: any(n.node == 1 and n.writes_refused > 0 and n.full == n.writes_refused
                           for n in client.status().storage), 30,
               "status listing node 1's refused writes")
    client.clear_faults()
    _serve(live, other, 1)  # stored now
    wait_until(lambda: _serve(live, other, 1)[1] > 0, 30,
               "the prompt's blocks stored once the store takes writes again")
    assert _store_counter(live, "dualpath_storage_write_errors_total", **full) == refused


def _serve(live: LiveCluster, prompt: list[int], gen: int) -> tuple[list[int], int]:
    """One turn of ``prompt``: (its tokens, cached tokens)."""
    ticket = live.submit(list(prompt), gen)
    r = ticket.wait(60)
    live.done(ticket)
    return r.tokens, r.cached


@pytest.mark.e2e
def test_hot_blocks_read_through_the_nodes_storage_nic(
        served: tuple[LiveCluster, TokenAuth, str], client: DualPathClient) -> None:
    live, _, _ = served
    _turn(live)
    hbs = live.system.scheduler.heartbeats

    def read_bytes() -> int:
        hb = hbs()[0]
        return hb.snic_read_bytes if hb is not None else 0

    idle = read_bytes()
    client.set_faults(["hot_blocks:node=0,count=2,rate=20"])
    wait_until(lambda: read_bytes() > idle + 20 * 8192, 10, "hot reads on node 0")
    client.clear_faults()
    # the loop stops: within a deadline, ten heartbeats in a row report no new reads
    deadline = time.monotonic() + 10
    while True:
        hb = hbs()[0]
        assert hb is not None
        n0, bytes0 = hb.n, hb.snic_read_bytes
        wait_until(lambda hb=hb, n0=n0: (hbs()[0] or hb).n >= n0 + 10, 5, "ten heartbeats")
        if read_bytes() == bytes0:
            break
        assert time.monotonic() < deadline, "hot reads went on after the fault was cleared"


@pytest.mark.e2e
def test_faults_reach_engine_processes_over_zeromq(tmp_path: Path) -> None:
    live = LiveCluster(RuntimeOptions(processes=True, store_dir=tmp_path,
                                      prefill_nodes=1, decode_nodes=1, block_tokens=8,
                                      hbm_blocks=64, heartbeat_timeout=SLOW_HOST_S))
    live.start()
    try:
        def frag() -> float:
            return next(e.hbm_fragmentation or 0.0 for e in live.view().engines
                        if e.engine_id == 1)

        live.set_faults([parse_fault("hbm_frag:engine=1,stride=4")], "test")
        wait_until(lambda: frag() > FRAG_WARN, 20, "a process engine's fragmentation")
        assert live.view().engines[1].pid is not None
        live.clear_faults("test")
        wait_until(lambda: frag() < 0.05, 20, "it to clear")
        assert [a.action for a in live.audit] == ["faults", "faults"]
    finally:
        live.drain(10)
