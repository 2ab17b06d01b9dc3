"""Names and paths from API clients never touch the filesystem outside the store root.

Every route that takes a name, key or id from a client, over HTTP against a launched
in-process cluster with a store and a replica root: traversal (``../``), absolute paths, NUL
bytes, encoded slashes and look-alike digits are refused with a 4xx and a one-line reason,
and symlinks planted inside the store that lead out are never followed to read or write.
Each check snapshots the directories beside the store and the store itself.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from served_cluster import serve_with_token

from dualpath_cli.core.layout import BlockKey, BlockShape, Namespace, prefix_keys
from dualpath_cli.runtime.options import RuntimeOptions
from dualpath_cli.storage import PosixStore, encode_block

pytestmark = pytest.mark.e2e  # an API server over a live cluster

SLOW_HOST_S = 30.0
SHAPE = BlockShape(n_layers=3, block_tokens=16, bytes_per_token_layer=64)
NS = Namespace("m", "layer_major", SHAPE, "fp16")


@dataclass
class Served:
    url: str
    headers: dict[str, str]
    root: Path
    replica: Path
    outside: Path
    token: str


def _tree(*dirs: Path) -> dict[str, tuple[int, int, bool]]:
    """Every path under ``dirs`` (links not followed): size, mtime, is-a-link."""
    seen: dict[str, tuple[int, int, bool]] = {}
    for top in dirs:
        for base, subdirs, files in os.walk(top):
            for name in subdirs + files:
                st = os.lstat(os.path.join(base, name))
                seen[os.path.join(base, name)] = (st.st_size, st.st_mtime_ns,
                                                 os.path.islink(os.path.join(base, name)))
    return seen


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    base = tmp_path_factory.mktemp("paths")
    root, replica, outside = base / "kv", base / "replica", base / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("not the store's\n")
    opts = RuntimeOptions(block_tokens=8, heartbeat_timeout=SLOW_HOST_S, store_dir=root,
                          replica_dirs=(replica,))
    with serve_with_token(opts, base / "run" / "token") as s:
        token = s.auth.token
        yield Served(s.url, {"Authorization": f"Bearer {token}"}, root, replica, outside, token)


def _one_line_4xx(response: httpx.Response) -> None:
    assert 400 <= response.status_code < 500, (response.status_code, response.text)
    body: Any = response.json()
    detail = body.get("detail") if "detail" in body else body["error"]["message"]
    assert isinstance(detail, str) and detail and "\n" not in detail


BAD_KEYS = [
    "../../../../etc/passwd",
    "/etc/passwd",
    "..",
    "ab" * 15 + "/.",
    "ab" * 15 + "..",
    "../" + "ab" * 16,
    "ab" * 16 + "\x00",
    "\x00" + "ab" * 15 + "a",
    "ab" * 16 + "/../../x",
    "..%2F..%2Fetc%2Fpasswd",
    "ab" * 15 + "%2F",
    "\uff41\uff42" * 16,  # full-width letters
    "\u0661" * 32,  # Arabic-Indic digits
    "~/" + "a" * 30,
    "",
]


@pytest.mark.parametrize("key", BAD_KEYS)
def test_replicate_refuses_keys_that_are_not_block_keys(served: Served, key: str) -> None:
    before = _tree(served.root.parent)
    r = httpx.post(f"{served.url}/api/v1/store/replicate", json={"blocks": [key]},
                   headers=served.headers, timeout=30)
    _one_line_4xx(r)
    assert _tree(served.root.parent) == before


def _stored_block(seed: int) -> tuple[BlockKey, np.ndarray]:
    """A block's key and contents (not stored yet)."""
    rng = np.random.default_rng(seed)
    key = prefix_keys([seed * 100 + i for i in range(16)], NS)[0]
    block = rng.standard_normal((3, 16, 32)).astype(np.float16)
    return key, block


def test_a_block_symlinked_out_of_the_store_is_neither_read_nor_copied(
        served: Served) -> None:
    key, block = _stored_block(1)
    real = PosixStore(served.outside / "elsewhere")
    real.put(*encode_block(key, block, NS))  # a valid block, outside the store root
    target = real.path(key)
    link = PosixStore(served.root).path(key)
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target)
    try:
        before_out = _tree(served.outside)
        r = httpx.post(f"{served.url}/api/v1/store/replicate", json={"blocks": [key.hex]},
                       headers=served.headers, timeout=30)
        assert r.status_code == 200, r.text
        result = r.json()["new"]
        assert "outside" in result["errors"][key.hex] and "\n" not in result["errors"][
            key.hex]
        assert result["blocks"][key.hex] == []
        assert not PosixStore(served.replica).contains(key)  # nothing copied from outside
        assert _tree(served.outside) == before_out
        assert served.token not in r.text
    finally:
        link.unlink()


def test_a_replica_directory_symlinked_out_of_the_store_is_not_written(
        served: Served) -> None:
    key, block = _stored_block(2)
    PosixStore(served.root).put(*encode_block(key, block, NS))
    shard = PosixStore(served.replica).path(key).parent.parent  # blocks/<h[:2]>
    shard.parent.mkdir(parents=True, exist_ok=True)
    escape = served.outside / "shard"
    escape.mkdir()
    shard.symlink_to(escape, target_is_directory=True)
    try:
        before_out = _tree(served.outside)
        r = httpx.post(f"{served.url}/api/v1/store/replicate", json={"blocks": [key.hex]},
                       headers=served.headers, timeout=30)
        assert r.status_code == 200, r.text
        result = r.json()["new"]
        assert "outside" in result["errors"][key.hex]
        assert result["blocks"][key.hex] == [str(served.root)]
        assert _tree(served.outside) == before_out  # nothing written through the link
    finally:
        shard.unlink()


def test_a_plain_block_is_still_replicated(served: Served) -> None:
    key, block = _stored_block(3)
    PosixStore(served.root).put(*encode_block(key, block, NS))
    r = httpx.post(f"{served.url}/api/v1/store/replicate", json={"blocks": [key.hex]},
                   headers=served.headers, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["new"]["blocks"][key.hex] == [str(served.root), str(served.replica)]
    assert PosixStore(served.replica).contains(key)


@pytest.mark.parametrize("path", [
    "/api/v1/requests/..%2F..%2Fetc%2Fpasswd",
    "/api/v1/requests/%2Fetc%2Fpasswd",
    "/api/v1/requests/1%00",
    "/api/v1/requests/-1",
    "/v1/models/..%2F..%2Fetc%2Fpasswd",
    "/v1/models/%2Fetc%2Fpasswd",
    "/api/v1/join/..%2F..%2Fetc%2Fpasswd",
    "/api/v1/engines/..%2F0/compact",
])
def test_ids_in_the_path_are_refused_without_touching_files(served: Served,
                                                            path: str) -> None:
    before = _tree(served.root.parent)
    method = "POST" if path.endswith("/compact") else "GET"
    r = httpx.request(method, f"{served.url}{path}", headers=served.headers, timeout=30)
    _one_line_4xx(r)
    assert _tree(served.root.parent) == before


@pytest.mark.parametrize("body", [
    {"templates": [{"name": "../../../../tmp/x", "tokens": [1, 2, 3]}]},
    {"templates": [{"name": "/etc/passwd", "text": "abc"}]},
    {"templates": [{"name": "a\x00b", "tokens": [1]}]},
    {"templates": [{"name": "t", "file": "/etc/passwd"}]},
    {"templates": [{"name": "t", "text": "x", "path": "../../x"}]},
    {"templates": [{"name": "t", "shared": [[0, 16]]}], "rate": "../../x"},
])
def test_warm_templates_take_no_path(served: Served, body: dict[str, Any]) -> None:
    before = _tree(served.root.parent)
    r = httpx.post(f"{served.url}/api/v1/storage/warm", json=body, headers=served.headers,
                   timeout=30)
    if r.status_code >= 400:
        _one_line_4xx(r)
    after = _tree(served.root.parent)
    assert {p for p in after if not p.startswith(str(served.root))} == {
        p for p in before if not p.startswith(str(served.root))}


@pytest.mark.parametrize("body", [
    {"faults": ["read_errors:path=../../etc/passwd"]},
    {"faults": ["hot_blocks:keys=../../etc/passwd"]},
    {"faults": ["/etc/passwd"]},
    {"faults": ["../../x=1"]},
    {"faults": ["slow_store:\x00"]},
])
def test_fault_specs_take_no_path(served: Served, body: dict[str, Any]) -> None:
    before = _tree(served.root.parent)
    r = httpx.patch(f"{served.url}/api/v1/faults", json=body, headers=served.headers,
                    timeout=30)
    _one_line_4xx(r)
    assert _tree(served.root.parent) == before
