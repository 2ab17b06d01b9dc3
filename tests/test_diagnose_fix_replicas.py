"""Hot-block replicas for ``diagnose long-tail --fix``.

Units: a primary-root store with replica roots (what a launched cluster opens with
``--replica-root``) copies a named block verified, readers that did not make the copy find
it by probing and spread their reads over the copies, a corrupt copy is never served (the
read falls back, the copy is quarantined and dropped) and is counted as a corrupt block
found, a block corrupt on every copy reads as corrupt (not missing), the replicate
service refuses a store without replica roots, and the long-tail rule judges a replicated
block by its busiest copy.

End to end (one test, a real ``dualpath launch --replica-root ... --inject hot_blocks``):
diagnose names the hot block, ``--fix`` copies it through the API (token, audited), the
engines' per-copy read counters then show its reads spread over every root, a later
diagnose finds it cooled, and every copy verifies (checksums) with no corrupt read counted.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import numpy as np
import pytest
from conftest import CLI, recording, run_cli, wait_until

from dualpath_cli.api.client import DualPathClient
from dualpath_cli.core.layout import BlockKey, BlockShape, Namespace, prefix_keys
from dualpath_cli.diagnose.model import Evidence, Severity
from dualpath_cli.diagnose.workflows.long_tail import long_tail
from dualpath_cli.services import statefile
from dualpath_cli.services.replicate import NoReplicaRoots, replicate_blocks
from dualpath_cli.storage import (
    HEADER_SIZE,
    PosixStore,
    ReplicatedStore,
    encode_block,
    read_one,
)
from dualpath_cli.storage.buffers import BufferPool
from dualpath_cli.storage.loader import StorageLoader
from dualpath_cli.storage.replicas import PROBE_EVERY
from dualpath_cli.storage.store import ReadOp
from dualpath_cli.telemetry import MetricsRegistry
from dualpath_cli.telemetry.recording import Extras, Sample

if TYPE_CHECKING:
    from conftest import Launched

SHAPE = BlockShape(n_layers=3, block_tokens=16, bytes_per_token_layer=64)
NS = Namespace("m", "layer_major", SHAPE, "fp16")


def _block(seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((3, 16, 32)).astype(np.float16)


def _stores(tmp_path: Path, n: int = 3) -> list[Path]:
    return [tmp_path / f"root{i}" for i in range(n)]


def _open(roots: list[Path]) -> ReplicatedStore:
    return ReplicatedStore([PosixStore(r) for r in roots], hot_reads=0,
                           registry=MetricsRegistry(), primary_home=True)


def _read(store: ReplicatedStore, key: Any) -> bytes:
    got = read_one(store, key)
    assert got is not None
    try:
        return got.array().tobytes()
    finally:
        got.release()


def test_a_copied_block_is_found_by_other_readers_and_reads_spread(tmp_path: Path) -> None:
    roots = _stores(tmp_path)
    writer, reader = _open(roots), _open(roots)
    key = prefix_keys(list(range(16)), NS)[0]
    block = _block()
    writer.put(*encode_block(key, block, NS))
    assert [PosixStore(r).contains(key) for r in roots] == [True, False, False]
    for _ in range(PROBE_EVERY):  # one copy: nothing to spread, nothing counted per copy
        assert _read(reader, key) == block.tobytes()
    assert reader.copy_reads(key) == {}

    held, added = writer.replicate(key, 3)
    assert held == [0, 1, 2] and added == [1, 2]
    assert all(PosixStore(r).contains(key) for r in roots)
    assert writer.replicate(key, 3) == ([0, 1, 2], [])  # idempotent
    # the reader learns of the copies from the files within PROBE_EVERY reads
    for _ in range(PROBE_EVERY):
        assert _read(reader, key) == block.tobytes()
    assert reader.copies(key) == [0, 1, 2]
    for _ in range(30):
        assert _read(reader, key) == block.tobytes()
    spread = reader.copy_reads(key)
    assert set(spread) == {str(r) for r in roots}
    assert min(spread.values()) >= 9 and sum(spread.values()) >= 30
    # a store opened later finds the copies at once
    assert _open(roots).copies(key) == [0, 1, 2]


def test_a_corrupt_copy_is_never_served(tmp_path: Path) -> None:
    roots = _stores(tmp_path)
    store = _open(roots)
    key = prefix_keys(list(range(16)), NS)[0]
    block = _block(1)
    store.put(*encode_block(key, block, NS))
    store.replicate(key, 3)
    bad = PosixStore(roots[1]).path(key)
    raw = bytearray(bad.read_bytes())
    raw[HEADER_SIZE + 10] ^= 0xFF  # a payload byte: only the checksum can tell
    bad.write_bytes(bytes(raw))
    for _ in range(9):
        assert _read(store, key) == block.tobytes()
    assert store.copies(key) == [0, 2]  # dropped once it failed
    assert not bad.exists() and any((roots[1] / "quarantine").iterdir())


def _corrupt(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    raw[HEADER_SIZE + 10] ^= 0xFF  # a payload byte: only the checksum can tell
    path.write_bytes(bytes(raw))


def _corrupt_reads(registry: MetricsRegistry) -> float:
    return sum(c.value for fam in registry.families()
               if fam.spec.name == "dualpath_storage_corrupt_blocks_total"
               for _, c in fam.children())


@pytest.mark.parametrize("reads_before", [0, 1])
def test_a_block_corrupt_on_every_copy_reads_as_corrupt_whichever_copy_is_tried_first(
        tmp_path: Path, reads_before: int) -> None:
    # the drill's corrupt_block after long-tail --fix: both copies corrupt. The first copy
    # tried was quarantined, the fallback tried the other (corrupt: quarantined) and then
    # the home again, found it gone, and the read ended "missing": no surface counted it
    roots = _stores(tmp_path, 2)
    store = _open(roots)
    key = prefix_keys(list(range(16)), NS)[0]
    store.put(*encode_block(key, _block(2), NS))
    store.replicate(key, 2)
    for _ in range(reads_before):  # which copy the rotation tries first
        _read(store, key)
    for r in roots:
        _corrupt(PosixStore(r).path(key))
    op = ReadOp(key)
    store.read_batch([op], BufferPool(1 << 24))
    assert not op.ok and not op.missing and op.io_error is None
    assert op.error is not None and op.error.reason == "checksum"
    assert all(any((r / "quarantine").iterdir()) for r in roots)


def test_the_loader_counts_a_corrupt_copy_once_served_or_not(tmp_path: Path) -> None:
    roots = _stores(tmp_path, 2)
    registry = MetricsRegistry()
    store = ReplicatedStore([PosixStore(r) for r in roots], hot_reads=0, registry=registry,
                            primary_home=True)
    keys = prefix_keys(list(range(32)), NS)
    for i, key in enumerate(keys):
        store.put(*encode_block(key, _block(i), NS))
        store.replicate(key, 2)
    with StorageLoader(store, registry=registry, block_tokens=16) as loader:
        _corrupt(PosixStore(roots[1]).path(keys[0]))  # one copy: the other serves it
        for _ in range(2):  # whichever copy the rotation takes, a read meets the bad one
            got = loader.load([keys[0]])
            assert got.blocks[0] is not None and got.corrupt == 0
            got.release()
        assert _corrupt_reads(registry) == 1
        for r in roots:  # every copy: a miss, counted once
            _corrupt(PosixStore(r).path(keys[1]))
        got = loader.load([keys[1]])
        assert got.blocks[0] is None and got.corrupt == 1
        assert got.reasons == {0: "quarantined"}
        got.release()
        assert _corrupt_reads(registry) == 2


def test_replicate_service_checks_its_input_and_reports_missing_blocks(
        tmp_path: Path) -> None:
    roots = _stores(tmp_path)
    with pytest.raises(NoReplicaRoots, match="--replica-root"):
        replicate_blocks(roots[0], [], ["ab" * 16])
    with pytest.raises(Exception, match="not a block key"):
        replicate_blocks(roots[0], roots[1:], ["xyz"])
    key = prefix_keys(list(range(16)), NS)[0]
    PosixStore(roots[0]).put(*encode_block(key, _block(), NS))
    missing = "cd" * 16
    old, new = replicate_blocks(roots[0], roots[1:], [key.hex, missing], copies=2)
    assert old["blocks"][key.hex] == [str(roots[0])]
    assert new["blocks"][key.hex] == [str(roots[0]), str(roots[1])]
    assert new["added"][key.hex] == [str(roots[1])]
    assert missing in new["errors"] and new["blocks"][missing] == []


def _hot_window(copies: dict[str, int] | None) -> Evidence:
    """Two samples 5 s apart: block ``hot`` read 300 times of the store's 1,000 reads."""
    from test_diagnose_rules import make_view

    hot = "ab" * 16
    first = Extras(block_reads={hot: 0, "cd" * 16: 0}, store_block_reads=0,
                   block_copy_reads={hot: dict.fromkeys(copies or {}, 0)} if copies else {})
    last = replace(first, block_reads={hot: 300, "cd" * 16: 40}, store_block_reads=1000,
                   block_copy_reads={hot: copies} if copies else {})
    return Evidence([Sample(0.0, make_view(0), first), Sample(5.0, make_view(5), last)], [])


def test_long_tail_judges_a_replicated_block_by_its_busiest_copy() -> None:
    (hot,) = [f for f in long_tail(_hot_window(None)) if f.subject
              and f.subject.startswith("block ")]
    assert hot.severity is Severity.WARNING and "--fix" in (hot.action or "")
    assert hot.evidence["copies_needed"] == {"ab" * 16: 6}  # 300 reads, hot share 100
    spread = {f"/r{i}": 75 for i in range(4)}  # 75 per copy: under the 100 of a tenth
    findings = long_tail(_hot_window(spread))
    assert not [f for f in findings if f.severity and f.subject
                and f.subject.startswith("block ")]
    (ok,) = [f for f in findings if "spread over 4 copies" in f.title]
    assert ok.severity is Severity.OK and ok.evidence["busiest_copy_reads"] == 75
    uneven = {"/r0": 200, "/r1": 100}  # the busiest copy still takes a fifth
    (still,) = [f for f in long_tail(_hot_window(uneven)) if f.severity
                and f.subject and f.subject.startswith("block ")]
    assert "2 copies, 200 reads on the busiest" in still.title


# --- end to end -----------------------------------------------------------------------------


@pytest.fixture()
def replicated(launch_cluster: Callable[..., Launched],
               tmp_path: Path) -> tuple[str, int, list[Path]]:
    """``launch --replica-root`` x8 with node 1 reading two stored blocks 60 times a second.

    The hot share is the fault's reads against the workload's, and the workload's rate
    follows the host's speed: 60 a second keeps it over the rule's 10% on a fast host (30
    gave 9%: 120 of 1,327 reads in 4 s), and nine copies keep each copy's share of it under
    10% after the fix on a host slow enough that the hot blocks take up to 90% of reads.
    """
    roots = [tmp_path / "store", *(tmp_path / f"replica{i}" for i in range(8))]
    args = ["--store", str(roots[0]), "--policy", "basic",
            "--inject", "hot_blocks:node=1,count=2,rate=60"]
    for r in roots[1:]:
        args += ["--replica-root", str(r)]
    url, port, _ = launch_cluster(*args)
    return url, port, roots


_ROW = re.compile(r'^(dualpath_storage_block_copy_reads_total|dualpath_storage_corrupt_blocks_'
                  r'total)\{([^}]*)\} ([0-9.e+]+)$')


def _copy_reads(url: str, block: str) -> tuple[dict[str, float], float]:
    """Reads of ``block`` per root, and corrupt blocks counted, from ``/metrics``."""
    per_root: dict[str, float] = {}
    corrupt = 0.0
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        m = _ROW.match(line)
        if m is None:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
        if m.group(1).startswith("dualpath_storage_corrupt"):
            corrupt += float(m.group(3))
        elif labels.get("block") == block:
            per_root[labels["root"]] = per_root.get(labels["root"], 0) + float(m.group(3))
    return per_root, corrupt


def _diagnose(env: dict[str, str], *args: str) -> tuple[int, dict[str, Any]]:
    done = run_cli(env, "diagnose", "long-tail", *args, "--json")
    assert done.stdout.strip(), done.stderr
    return done.returncode, json.loads(done.stdout)


def _hot_findings(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for r in doc["reports"] for f in r["findings"]
            if f["severity"] in ("WARNING", "CRITICAL") and f.get("rule") == "hot-block"]


def test_fix_replicates_the_hot_block_and_its_reads_spread_verified(
        env: dict[str, str], replicated: tuple[str, int, list[Path]], tmp_path: Path) -> None:
    url, port, roots = replicated
    rec = tmp_path / "cooled.jsonl.gz"
    # the workload's own reads run through every check (killed below): with the two hot
    # blocks as the only reads, each of 5 copies takes a tenth, the hot share itself
    work = subprocess.Popen([*CLI, "bench", "--url", url, "--agents", "4", "--turns", "300",
                             "--json"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        # the fault reads the first two stored blocks: wait (bounded) until it does
        def hot_reads() -> bool:
            assert work.poll() is None, "the bench ended before the hot reads"
            return max((float(v) for v in re.findall(
                r'^dualpath_storage_block_reads_total\{[^}]*\} ([0-9.e+]+)$',
                httpx.get(f"{url}/metrics", timeout=10).text, re.M)), default=0) >= 30

        wait_until(hot_reads, 90, "the hot reads",  # a round trip paces the loop, no sleep
                   pace=lambda: httpx.get(f"{url}/readyz", timeout=10))
        code, before = _diagnose(env, "--url", url, "--window", "4s")
        titles = [f"{f['severity']} {f['title']}" for r in before["reports"]
                  for f in r["findings"]]
        found = _hot_findings(before)
        assert code in (1, 2) and len(found) == 1, titles
        hot = found[0]
        assert hot["subject"] == "node D1", titles  # the node whose reads are hot
        block = next(iter(hot["evidence"]["hot_blocks"]))  # the hottest first
        assert len(block) == 32 and PosixStore(roots[0]).contains(BlockKey.from_hex(block))

        code, fixed = _diagnose(env, "--url", url, "--window", "3s", "--fix")
        (fix,) = [f for f in fixed["fixes"] if f["action"] == "replicate"]
        assert fix["applied"] and block in fix["blocks"], fix
        # a copy on every replica root (the finding's minimum, sized from one window's mix
        # of reads, is reported beside it)
        want = len(roots)
        held = fix["copies"][block]
        assert fix["needed"] >= 2 and len(held) == want and not fix["errors"], fix
        with DualPathClient.from_token_file(url, statefile.token_path(port)) as client:
            entry = client.status().audit[-1]
        assert entry.action == "replicate" and entry.seq == fix["audit"]

        # the engines find the copies and spread the block's reads over every root holding one
        deadline = time.monotonic() + 60
        first, _ = _copy_reads(url, block)
        while True:
            now, corrupt = _copy_reads(url, block)
            gained = {r: now.get(r, 0) - first.get(r, 0) for r in held}
            if len(now) == want and min(gained.values()) >= 10:
                break
            assert time.monotonic() < deadline, (first, now)
            httpx.get(f"{url}/readyz", timeout=10)  # a round trip paces the loop, no sleep
        assert max(gained.values()) <= 3 * min(gained.values()), gained
        assert corrupt == 0

        # the hot spot has cooled: no copy takes the hot share any more, live and from a
        # recording of the same seconds
        with recording(env, url, "4s", rec):
            live = _diagnose(env, "--url", url, "--window", "4s")
        for _code, after in (live, _diagnose(env, "--from", str(rec))):
            titles = [f"{f['severity']} {f['title']}" for r in after["reports"]
                      for f in r["findings"]]
            assert not any(block in f["evidence"]["hot_blocks"] for f in _hot_findings(after)
                           ), titles
            assert any(f"block {block[:12]} read" in t and f"spread over {want} copies" in t
                       for t in titles), titles
    finally:
        work.kill()
        work.communicate(timeout=60)
    # every copy holds the same verified bytes
    key = BlockKey.from_hex(block)
    payloads = []
    for r in held:
        got = read_one(PosixStore(Path(r)), key)  # raises on a checksum mismatch
        assert got is not None
        payloads.append(got.payload.tobytes())
        got.release()
    assert len(set(payloads)) == 1
    done = run_cli(env, "storage", "verify", held[1])
    assert done.returncode == 0, done.stdout + done.stderr
