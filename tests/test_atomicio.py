"""Atomic writes: concurrent writers to one target never collide, and failures leave no file."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from dualpath_cli.atomicio import atomic_write_bytes, atomic_write_lines, atomic_write_text


def test_concurrent_writers_each_leave_a_whole_file(tmp_path: Path) -> None:
    target = tmp_path / "access.json"
    start = threading.Barrier(8)
    errors: list[BaseException] = []

    def writer(i: int) -> None:
        start.wait()
        try:
            for _ in range(50):
                atomic_write_text(target, f"writer {i}\n" * 100, fsync=False)
        except BaseException as err:  # collected and asserted below
            errors.append(err)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    lines = target.read_text().splitlines()
    assert len(lines) == 100 and len(set(lines)) == 1  # one writer's whole content
    assert sorted(os.listdir(tmp_path)) == ["access.json"]  # no temp file left behind


def test_lines_get_newlines_and_mode(tmp_path: Path) -> None:
    target = tmp_path / "t.jsonl"
    atomic_write_lines(target, ["a", "b"])
    assert target.read_text() == "a\nb\n"
    assert (target.stat().st_mode & 0o777) == 0o644


def test_a_failing_writer_leaves_the_old_file_and_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "t.jsonl"
    target.write_text("old\n")

    def lines() -> Iterator[str]:
        yield "new"
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        atomic_write_lines(target, lines())
    assert target.read_text() == "old\n"
    assert sorted(os.listdir(tmp_path)) == ["t.jsonl"]


def test_missing_directory_raises_oserror(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        atomic_write_text(tmp_path / "nope" / "x", "y")


def test_bytes_are_written_exactly_with_mode_and_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "chart.png"
    data = bytes(range(256)) * 40 + b"\r\n\n"  # every byte value, line ends untouched
    atomic_write_bytes(target, data, mode=0o600)
    assert target.read_bytes() == data
    assert (target.stat().st_mode & 0o777) == 0o600
    assert sorted(os.listdir(tmp_path)) == ["chart.png"]


def test_bytes_replace_an_existing_file(tmp_path: Path) -> None:
    target = tmp_path / "chart.png"
    target.write_bytes(b"old chart")
    atomic_write_bytes(target, b"new", fsync=False)
    assert target.read_bytes() == b"new"
    assert sorted(os.listdir(tmp_path)) == ["chart.png"]


def test_a_failed_byte_write_leaves_the_old_file_and_no_temp(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "chart.png"
    target.write_bytes(b"old chart")

    def no_space(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_space)  # fails after the temp file has the data
    with pytest.raises(OSError, match="No space"):
        atomic_write_bytes(target, b"new chart")
    assert target.read_bytes() == b"old chart"
    assert sorted(os.listdir(tmp_path)) == ["chart.png"]


def test_bytes_into_a_missing_directory_raise_oserror(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        atomic_write_bytes(tmp_path / "nope" / "x.png", b"y")
    assert os.listdir(tmp_path) == []
