"""Blocks, a hinted store and the identical-blocks check shared by the read-path tests
(test_storage_sync_reads.py and test_storage_pipeline.py run the same loads on different
read paths, so they build and check them with the same code)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dualpath_cli.core.layout import BlockShape, Namespace, prefix_keys
from dualpath_cli.storage import PosixStore, StorageLoader, encode_block
from dualpath_cli.storage.header import file_nbytes
from dualpath_cli.storage.reads import PageCacheReads

BIG = BlockShape(n_layers=2, block_tokens=16, bytes_per_token_layer=8192)  # 256 KiB payload


def put_blocks(store: PosixStore, shape: BlockShape, n: int, seed: int) -> dict:
    """``n`` blocks of ``shape`` written to ``store``; block ``i`` is filled with ``i + seed``."""
    ns = Namespace(f"m{seed}", "layer_major", shape, "fp16")
    keys = prefix_keys(list(range(seed * 100_000, seed * 100_000 + 16 * n)), ns)
    blocks = {}
    for i, key in enumerate(keys):
        width = shape.bytes_per_token_layer // 2
        block = np.full((shape.n_layers, 16, width), i + seed, dtype=np.float16)
        blocks[key] = block
        store.put(*encode_block(key, block, ns))
    return blocks


def hinted_store(root: Path) -> PosixStore:
    """A page-cache store that already knows its usual block size (as after its first read),
    so even the first batch takes the native path."""
    store = PosixStore(root, engine="preadv")
    reads = store.read_path()
    assert isinstance(reads, PageCacheReads)
    reads.size_hint = file_nbytes(BIG.full_nbytes)
    return store


def page_cache(store: PosixStore) -> PageCacheReads:
    """The store's page-cache read path (where the split and pipelined reads live)."""
    reads = store.read_path()
    assert isinstance(reads, PageCacheReads)
    return reads


def assert_loads_identical(loader: StorageLoader, keys: list, blocks: dict,
                           rounds: int) -> None:
    """``rounds`` loads of ``keys`` all hit and return exactly ``blocks``; afterwards the
    read queue is empty (every block, byte, token and read accounted back)."""
    for _ in range(rounds):
        result = loader.load(keys, timeout=30)
        assert result.store_hits == len(keys) and result.misses == 0
        for key, block in zip(keys, result.blocks, strict=True):
            assert block is not None and np.array_equal(block.array(), blocks[key])
        result.release()
    q = loader.read_queue
    assert (q.blocks, q.bytes, q.tokens, q.in_flight) == (0, 0, 0, 0)
