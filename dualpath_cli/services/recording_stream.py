"""A recording's bytes on disk: written as they come, read back however the writer ended.

Why: a recording is an incident's evidence, written over minutes; a Ctrl-C, a SIGTERM or a
SIGKILL must not lose it. So the writer puts every line at the file's final name as it
comes and makes it readable every :data:`FLUSH_EVERY_S` seconds (plain JSONL flushed to the
OS; gzip closes a member, zstd a frame: both formats read a file of many back to back), and
the reader takes every complete line of a file that was cut short, dropping only the tail
that was being written (:class:`Tail` says how many bytes). A file without its ``end`` line
was cut short; one with it ended cleanly.
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from dualpath_cli.errors import UsageError

__all__ = ["FLUSH_EVERY_S", "LineWriter", "Tail", "complete_lines", "zstd_module"]

#: Seconds of recording at risk when the recorder is killed (it flushes at least this often).
FLUSH_EVERY_S = 2.0
_CHUNK = 1 << 20
_HOLD = 64 << 20


def zstd_module() -> Any:
    """The ``zstandard`` module, or the one-line reason a .zst recording cannot be used."""
    try:
        import zstandard
    except ImportError:
        raise UsageError("a .zst recording needs the 'zstandard' module, which is not "
                         "installed (pip install zstandard); use .jsonl.gz or .jsonl") from None
    return zstandard


def _codec(path: Path) -> str:
    name = path.name.lower()
    return "gz" if name.endswith(".gz") else "zst" if name.endswith(".zst") else "plain"


class LineWriter:
    """Lines into ``path`` (compressed by its suffix), each :meth:`flush` readable on disk.

    gzip: one member per flush (``gzip`` reads concatenated members); zstd: one frame per
    flush; plain: the lines as they are. A reader of a file whose writer was killed gets
    everything up to the last flush.
    """

    def __init__(self, path: Path | IO[bytes]) -> None:
        """``path``: the file to create, or an open binary stream (standard output) that
        gets plain lines and is flushed, never closed."""
        self._owned = isinstance(path, Path)
        self._codec = _codec(path) if isinstance(path, Path) else "plain"
        self._zstd: Any = zstd_module() if self._codec == "zst" else None
        self._raw: IO[bytes] = path.open("wb") if isinstance(path, Path) else path
        self._open: Any = None  # the current gzip member or zstd frame writer
        self._pending = False  # lines written since the last flush

    def write(self, line: str) -> None:
        """Append one line (it ends with a newline)."""
        data = line.encode("utf-8")
        if self._codec == "plain":
            self._raw.write(data)
        else:
            if self._open is None:
                self._open = (gzip.GzipFile(fileobj=self._raw, mode="wb", compresslevel=6)
                              if self._codec == "gz" else
                              self._zstd.ZstdCompressor(level=6).stream_writer(
                                  self._raw, closefd=False))
            self._open.write(data)
        self._pending = True

    def flush(self) -> None:
        """Make everything written so far readable on disk (ends a gzip member / zstd
        frame; nothing happens when nothing was written since the last flush)."""
        if not self._pending:
            return
        if self._open is not None:
            if self._codec == "gz":
                self._open.close()  # the member's trailer; the file stays open
                self._open = None
            else:  # the frame ends; the next write starts another one
                self._open.flush(self._zstd.FLUSH_FRAME)
        self._raw.flush()
        self._pending = False

    def close(self) -> None:
        """Flush and close the file (a stream given open is only flushed)."""
        try:
            self.flush()
        finally:
            if self._owned:
                self._raw.close()

    def __enter__(self) -> LineWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class Tail:
    """How a read file ended: ``dropped`` bytes at its end were not a complete line (or, in a
    compressed file, not a complete member or frame), ``cut`` when there were any."""

    dropped: int = 0

    @property
    def cut(self) -> bool:
        return self.dropped > 0


#: The first bytes of a gzip member and of a zstd frame.
_MAGIC = ((b"\x1f\x8b", "gz"), (b"\x28\xb5\x2f\xfd", "zst"))


def _sniffed(raw: IO[bytes]) -> str:
    """The compression of an open file by its first bytes (``plain`` for neither), so a
    recording reads whatever its name says; the file is left at its start."""
    head = raw.read(4)
    raw.seek(0)
    return next((codec for magic, codec in _MAGIC if head.startswith(magic)), "plain")


def complete_lines(path: Path, tail: Tail) -> Iterator[bytes]:
    """The complete lines of ``path`` (decompressed as its first bytes say: gzip, zstd or
    none), newline included; what follows the last of them is counted in ``tail.dropped``
    (bytes of the file), not read.

    Raises:
        OSError: the file cannot be read, or its compressed data is broken.
    """
    with path.open("rb") as raw:
        codec = _sniffed(raw)
        if codec == "plain":
            yield from _plain(raw, tail)
        else:
            yield from _split(_frames(raw, codec, tail), tail)


def _plain(raw: IO[bytes], tail: Tail) -> Iterator[bytes]:
    for line in raw:
        if not line.endswith(b"\n"):
            tail.dropped = len(line)
            return
        yield line


def _split(chunks: Iterator[bytes], tail: Tail) -> Iterator[bytes]:
    """Lines out of decompressed chunks; a last line without its newline is dropped."""
    carry = b""
    for chunk in chunks:
        parts = (carry + chunk).split(b"\n")
        carry = parts.pop()
        for part in parts:
            yield part + b"\n"
    if carry and not tail.dropped:
        tail.dropped = len(carry)


def _frames(raw: IO[bytes], codec: str, tail: Tail) -> Iterator[bytes]:
    """Decompressed bytes of each gzip member or zstd frame once it ends; an unfinished last
    one is dropped (``tail.dropped``: its compressed bytes). A member or frame is held until
    it ends, up to :data:`_HOLD` bytes (an older recorder wrote a whole file as one: that is
    released as it decodes, and only its undecoded tail is dropped)."""
    zstd = zstd_module() if codec == "zst" else None

    def new() -> Any:
        return zlib.decompressobj(31) if zstd is None else zstd.ZstdDecompressor().decompressobj()

    errors: tuple[type[BaseException], ...] = (zlib.error,) if zstd is None else (
        zlib.error, zstd.ZstdError)
    dec = new()
    started = 0  # compressed bytes fed to the unfinished member/frame
    held: list[bytes] = []  # its output, released when it ends
    while True:
        data = raw.read(_CHUNK)
        if not data:
            break
        while data:
            try:
                held.append(dec.decompress(data))
            except errors as err:
                raise OSError(f"not {codec} data: {err}") from None
            if not dec.eof:
                started += len(data)
                if sum(map(len, held)) > _HOLD:
                    yield b"".join(held)
                    held, started = [], 0
                break
            data = dec.unused_data
            yield b"".join(held)
            held, started, dec = [], 0, new()
    if started:
        tail.dropped = started
