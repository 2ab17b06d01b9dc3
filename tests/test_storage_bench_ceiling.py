"""The verified-read ceiling of ``bench/storage.py``: it reads (and hashes) real block files,
and says None instead of a number when the native path it measures is unavailable."""

from __future__ import annotations

from pathlib import Path

import pytest

from dualpath_cli.storage import native as native_mod
from dualpath_cli.storage.benchmark import make_dataset, verified_ceiling_gbps


@pytest.mark.parametrize("workers,overlap", [(1, True), (1, False), (2, False)])
def test_ceiling_moves_the_data_set(tmp_path: Path, workers: int, overlap: bool) -> None:
    reader = native_mod.native_reader()
    if reader is None or not reader.hashes:
        pytest.skip(f"native read path unavailable: {native_mod.native_status()}")
    data = make_dataset(tmp_path, 64 << 10, 2 << 20)
    gbps = verified_ceiling_gbps(data, workers, overlap=overlap, min_seconds=0.01)
    assert gbps is not None and gbps > 0


def test_no_ceiling_without_the_native_path(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    data = make_dataset(tmp_path, 64 << 10, 1 << 20)
    monkeypatch.setattr(native_mod, "native_reader", lambda: None)
    assert verified_ceiling_gbps(data, 1, overlap=False, min_seconds=0.01) is None


@pytest.mark.parametrize("workers", [1, 2])
def test_a_reader_started_after_the_deadline_still_measures(tmp_path: Path,
                                                            workers: int) -> None:
    """The deadline is set before the threads start; on a loaded host a thread may start
    after it. Each reader still reads one whole pass, so the rate is never zero: here every
    thread starts late (no measuring time at all)."""
    reader = native_mod.native_reader()
    if reader is None or not reader.hashes:
        pytest.skip(f"native read path unavailable: {native_mod.native_status()}")
    data = make_dataset(tmp_path, 64 << 10, 1 << 20)
    gbps = verified_ceiling_gbps(data, workers, overlap=False, min_seconds=0.0)
    assert gbps is not None and gbps > 0
