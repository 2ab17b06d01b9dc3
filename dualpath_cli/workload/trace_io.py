"""The only module of workload/ that touches files: read, detect and atomically write traces.

Everything else in workload/ is pure; this module opens files and hands lines to the decoders.
Writes go to a temporary file in the target directory, then ``os.replace`` it into place, so a
reader never sees a half-written trace.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal, TextIO

from dualpath_cli.atomicio import atomic_write_lines
from dualpath_cli.errors import TraceError
from dualpath_cli.limits import LIMITS, limit_value
from dualpath_cli.workload.mooncake import MooncakeRequest, decode_mooncake
from dualpath_cli.workload.trace_format import FORMAT_NAME, Trace, decode_lines, encode_lines

__all__ = ["TraceFormat", "read_trace", "write_trace", "read_mooncake", "detect_format"]

TraceFormat = Literal["dualpath", "mooncake"]


def _bounded_lines(handle: TextIO, path: Path) -> Iterator[str]:
    """The lines of ``handle``, each at most the ``trace_line_bytes`` limit long.

    ``/dev/zero`` or a file without newlines would otherwise be read whole into memory.
    """
    most = int(limit_value("trace_line_bytes"))
    number = 0
    while True:
        line = handle.readline(most + 1)
        if not line:
            return
        number += 1
        if len(line) > most and not line.endswith("\n"):
            raise TraceError(f"{path}:{number}: line longer than the limit of {most:,} "
                             f"characters (raise it with {LIMITS['trace_line_bytes'].env_var}"
                             "=N)")
        yield line


@contextmanager
def _open(path: Path) -> Iterator[Iterator[str]]:
    """Open a trace for reading; any OS or encoding problem becomes a one-line TraceError."""
    if "\0" in str(path):  # open() raises ValueError, not OSError, on one
        raise TraceError(f"{str(path)!r}: cannot read: a path with a NUL byte")
    try:
        if path.is_dir():
            raise TraceError(f"{path}: cannot read: a directory")
        with open(path, encoding="utf-8") as handle:
            yield _bounded_lines(handle, path)
    except UnicodeDecodeError as err:
        raise TraceError(f"{path}: not a UTF-8 text file ({err.reason})") from None
    except OSError as err:
        raise TraceError(f"{path}: cannot read: {err.strerror or err}") from None


def read_trace(path: str | os.PathLike[str]) -> Trace:
    """Read and validate a dualpath trace (raises TraceError ``FILE:LINE: reason``)."""
    p = Path(path)
    with _open(p) as handle:
        return decode_lines(handle, str(p))


def read_mooncake(path: str | os.PathLike[str]) -> list[MooncakeRequest]:
    """Read and validate a Mooncake trace (raises TraceError ``FILE:LINE: reason``)."""
    p = Path(path)
    with _open(p) as handle:
        return decode_mooncake(handle, str(p))


def detect_format(path: str | os.PathLike[str]) -> TraceFormat:
    """Tell a dualpath trace from a Mooncake trace by the first non-blank line.

    Raises:
        TraceError: the file is empty, the line is not a JSON object, or it looks like neither.
    """
    p = Path(path)
    with _open(p) as handle:
        for number, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw)
            except json.JSONDecodeError as err:
                raise TraceError(f"{p}:{number}: invalid JSON: {err.msg} at column "
                                 f"{err.colno}") from None
            except ValueError:  # an integer of more than 4,300 digits
                raise TraceError(f"{p}:{number}: invalid JSON: a number too long to "
                                 "read") from None
            except RecursionError:
                raise TraceError(f"{p}:{number}: invalid JSON: nested too deeply") from None
            if isinstance(obj, dict) and obj.get("format") == FORMAT_NAME:
                return "dualpath"
            if isinstance(obj, dict) and "hash_ids" in obj and "input_length" in obj:
                return "mooncake"
            raise TraceError(f"{p}:{number}: unknown trace format: neither a "
                             f"{FORMAT_NAME!r} header nor a Mooncake request; pass --format")
    raise TraceError(f"{p}: empty file: no trace lines")


def write_trace(path: str | os.PathLike[str], trace: Trace) -> None:
    """Write a trace atomically (temp file in the same directory, fsync, ``os.replace``).

    Raises:
        TraceError: the directory does not exist or is not writable.
    """
    p = Path(path)
    try:
        atomic_write_lines(p, encode_lines(trace))
    except OSError as err:
        raise TraceError(f"{p}: cannot write: {err.strerror or err}") from None


