"""`dualpath storage inspect | verify | gc | bench` through the real entry point."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dualpath_cli.cli.app import main
from dualpath_cli.core.layout import BlockShape, Namespace, prefix_keys
from dualpath_cli.storage import HEADER_SIZE, PosixStore, encode_block, read_one
from dualpath_cli.storage import native as native_mod

SHAPE = BlockShape(n_layers=2, block_tokens=16, bytes_per_token_layer=64)


def populated(root: Path) -> tuple[PosixStore, list]:
    store = PosixStore(root)
    for model in ("a", "b"):
        ns = Namespace(model, "layer_major", SHAPE, "fp16")
        keys = prefix_keys(list(range(48)), ns)
        for i, key in enumerate(keys):
            store.put(*encode_block(key, np.full((2, 16, 32), i, dtype=np.float16), ns))
    keys = list(store.keys())
    for _ in range(3):
        read_one(store, keys[0]).release()  # type: ignore[union-attr]
    store.flush_access_counts()
    return store, keys


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict]:
    code = main(list(argv))
    out = capsys.readouterr().out
    return code, json.loads(out)


def test_inspect_reports_blocks_namespaces_and_hottest(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, keys = populated(tmp_path)
    code, data = run_json(capsys, "storage", "inspect", str(tmp_path), "--json")
    assert code == 0
    assert data["blocks"] == 6
    assert {n["namespace"].split("/")[0]: n["blocks"] for n in data["namespaces"]} == {
        "a": 3, "b": 3}
    assert data["hottest"][0] == {"key": keys[0].hex, "reads": 3}
    assert main(["storage", "inspect", str(tmp_path)]) == 0
    assert "namespaces" in capsys.readouterr().out


def test_verify_exit_0_when_clean_and_2_with_quarantine_when_corrupt(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store, keys = populated(tmp_path)
    code, data = run_json(capsys, "storage", "verify", str(tmp_path), "--json")
    assert code == 0 and data["checked"] == 6 and data["corrupt"] == []
    path = store.path(keys[2])
    raw = bytearray(path.read_bytes())
    raw[HEADER_SIZE + 9] ^= 0x08
    path.write_bytes(bytes(raw))
    code, data = run_json(capsys, "storage", "verify", str(tmp_path), "--json")
    assert code == 2
    assert data["corrupt"] == [{"key": keys[2].hex, "reason": "checksum",
                                "detail": "payload checksum mismatch"}]
    assert not path.exists() and len(store.quarantined()) == 1
    assert main(["storage", "verify", str(tmp_path)]) == 0  # quarantined: clean again


def test_gc_evicts_to_capacity(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    populated(tmp_path)
    code, data = run_json(capsys, "storage", "gc", str(tmp_path), "--capacity", "16KiB",
                          "--json")
    assert code == 0 and data["evicted_blocks"] == 4
    assert PosixStore(tmp_path).usage().blocks == 2


def test_bad_inputs_are_one_line_usage_errors(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["storage", "verify", str(tmp_path / "nope")]) == 3  # UNKNOWN: cannot look
    err = capsys.readouterr().err
    assert "not a directory" in err and "Traceback" not in err
    assert main(["storage", "gc", str(tmp_path), "--capacity", "lots"]) == 2
    assert "invalid byte size 'lots'" in capsys.readouterr().err
    assert main(["storage", "bench", "--queue-depth", "0"]) == 2


def test_bench_json_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, data = run_json(capsys, "storage", "bench", "--root", str(tmp_path), "--size",
                          "1MiB", "--block-size", "64KiB", "--queue-depth", "1,4",
                          "--seconds", "0", "--json")
    assert code == 0
    assert [(r["block_size"], r["queue_depth"], r["mode"]) for r in data["rows"]] == [
        (65536, 1, "page_cache"), (65536, 4, "page_cache")]
    assert all(r["loader_gbps"] > 0 for r in data["rows"])
    assert all(r["request_kib"] is None for r in data["rows"])  # page cache: no device reads
    assert list(tmp_path.iterdir()) == []  # bench files removed
    assert data["page_cache_read_path"] == native_mod.native_info().as_dict()


def test_bench_shows_a_fallback_to_python_reads(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """An operator sees from the bench that the native read path is not in use."""
    lost = native_mod.NativeInfo(False, False, None, None,
                                 "unavailable (no C compiler): pure-Python reads")
    monkeypatch.setattr(native_mod, "native_info", lambda: lost)
    argv = ["storage", "bench", "--root", str(tmp_path), "--size", "256KiB", "--block-size",
            "64KiB", "--queue-depth", "1", "--seconds", "0"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert "page-cache read path: unavailable (no C compiler): pure-Python reads" in out
    assert "warning: the native read path is not in use" in err
    code, data = run_json(capsys, *argv, "--json")
    assert code == 0 and data["page_cache_read_path"] == lost.as_dict()


def test_bench_direct_reports_request_size(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    code, data = run_json(capsys, "storage", "bench", "--root", str(tmp_path), "--size",
                          "4MiB", "--block-size", "1MiB", "--queue-depth", "1", "--direct",
                          "--seconds", "0", "--json")
    assert code == 0
    (row,) = data["rows"]
    assert row["mode"] == "direct" and row["loader_gbps"] > 0
    if row["request_kib"] is None:  # no block device under tmp (tmpfs, overlay) or no
        return  # O_DIRECT there: nothing to count
    assert row["request_kib"] > 0  # the device counters moved (other processes may share
    # the device, so the size itself is not pinned here; DiskRequests has its own test)
