"""The dualpath trace format (JSONL, version 1): pure encode and validating decode.

Layout (docs/trace-format.md is the reference)::

    {"format": "dualpath-trace", "version": 1, "max_len": 64000, "generator": {...}}
    {"agent_id": 0, "token_seed": 123, "turns": [[A_1, g_1], [A_2, g_2], ...]}
    {"agent_id": 1, "token_seed": 456, "prefix_seed": 789, "source": 17, "turns": [...]}
    {"agent_id": 2, "token_seed": 457, "shared": [[42, 2048]], "turns": [...]}
    {"agent_id": 3, "token_seed": 3, "start_s": 1.25, "turns": [...]}

Decoding raises :class:`~dualpath_cli.errors.TraceError` with ``SOURCE:LINE: reason`` for the
first bad line. File access lives in ``trace_io``; this module only sees strings.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from dualpath_cli.errors import TraceError
from dualpath_cli.workload.tokens import MAX_SEED
from dualpath_cli.workload.trajectory import Trajectory, Turn

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "TraceHeader",
    "Trace",
    "encode_lines",
    "decode_lines",
    "load_object",
    "is_int",
]

FORMAT_NAME = "dualpath-trace"
FORMAT_VERSION = 1

_HEADER_KEYS = {"format", "version", "max_len", "generator"}
_REQUIRED = ("agent_id", "token_seed", "turns")
_OPTIONAL = ("prefix_seed", "source", "shared", "start_s")


@dataclass(frozen=True)
class TraceHeader:
    """First line of a trace: the cap on every total, and how the trace was made."""

    max_len: int
    generator: dict[str, Any] = field(default_factory=dict)
    version: int = FORMAT_VERSION


@dataclass(frozen=True)
class Trace:
    """A header and its trajectories (agent ids unique, every total <= max_len)."""

    header: TraceHeader
    trajectories: tuple[Trajectory, ...]


def encode_lines(trace: Trace) -> Iterator[str]:
    """The trace as JSON lines (without newlines), header first."""
    yield json.dumps({"format": FORMAT_NAME, "version": trace.header.version,
                      "max_len": trace.header.max_len, "generator": trace.header.generator},
                     separators=(",", ":"))
    for traj in trace.trajectories:
        record: dict[str, Any] = {"agent_id": traj.agent_id, "token_seed": traj.token_seed}
        if traj.prefix_seed is not None:
            record["prefix_seed"] = traj.prefix_seed
        if traj.source is not None:
            record["source"] = traj.source
        if traj.shared:
            record["shared"] = [[seed, n] for seed, n in traj.shared]
        if traj.start_s is not None:
            record["start_s"] = traj.start_s
        record["turns"] = [[t.append, t.gen] for t in traj.turns]
        yield json.dumps(record, separators=(",", ":"))


def decode_lines(lines: Iterable[str], source: str) -> Trace:
    """Parse and validate a trace; blank lines are skipped.

    Raises:
        TraceError: ``SOURCE:LINE: reason`` for the first bad line, or ``SOURCE: reason``
            for an empty input.
    """
    header: TraceHeader | None = None
    trajectories: list[Trajectory] = []
    first_line: dict[int, int] = {}
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        where = f"{source}:{number}"
        obj = load_object(raw, where)
        if header is None:
            header = _header(obj, where)
            continue
        traj = _trajectory(obj, where, header.max_len)
        if traj.agent_id in first_line:
            raise TraceError(f"{where}: duplicate agent_id {traj.agent_id} "
                             f"(first on line {first_line[traj.agent_id]})")
        first_line[traj.agent_id] = number
        trajectories.append(traj)
    if header is None:
        raise TraceError(f"{source}: empty trace: expected a {FORMAT_NAME!r} header line")
    return Trace(header, tuple(trajectories))


def load_object(raw: str, where: str) -> dict[str, Any]:
    """One JSON-object line of a trace (ours or Mooncake's), or a one-line TraceError
    naming ``where``: bad JSON, a number too long or nested too deep, not an object."""
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as err:
        raise TraceError(f"{where}: invalid JSON: {err.msg} at column {err.colno}") from None
    except ValueError:  # an integer of more than 4,300 digits
        raise TraceError(f"{where}: invalid JSON: a number too long to read") from None
    except RecursionError:
        raise TraceError(f"{where}: invalid JSON: nested too deeply") from None
    if not isinstance(obj, dict):
        raise TraceError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    return obj


def is_int(value: object) -> TypeGuard[int]:
    """An int that is not a bool (JSON's true is not a count)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _header(obj: dict[str, Any], where: str) -> TraceHeader:
    if obj.get("format") != FORMAT_NAME:
        raise TraceError(f"{where}: not a dualpath trace: the first line must be a header "
                         f'with "format": "{FORMAT_NAME}"')
    unknown = sorted(set(obj) - _HEADER_KEYS)
    if unknown:
        raise TraceError(f"{where}: unknown header field {unknown[0]!r}; expected "
                         f"{', '.join(sorted(_HEADER_KEYS))}")
    version = obj.get("version")
    if not is_int(version):
        raise TraceError(f"{where}: header field 'version' must be an integer")
    if version != FORMAT_VERSION:
        raise TraceError(f"{where}: unsupported trace version {version}; this reader "
                         f"supports version {FORMAT_VERSION}")
    max_len = obj.get("max_len")
    if not is_int(max_len) or max_len < 1:
        raise TraceError(f"{where}: header field 'max_len' must be a positive integer, "
                         f"got {max_len!r}")
    generator = obj.get("generator", {})
    if not isinstance(generator, dict):
        raise TraceError(f"{where}: header field 'generator' must be an object")
    return TraceHeader(max_len=max_len, generator=generator, version=version)


def _trajectory(obj: dict[str, Any], where: str, max_len: int) -> Trajectory:
    for key in _REQUIRED:
        if key not in obj:
            raise TraceError(f"{where}: missing field {key!r}")
    unknown = sorted(set(obj) - set(_REQUIRED) - set(_OPTIONAL))
    if unknown:
        raise TraceError(f"{where}: unknown field {unknown[0]!r}; expected "
                         f"{', '.join(_REQUIRED + _OPTIONAL)}")
    agent_id = _bounded(obj["agent_id"], "agent_id", where, 0, MAX_SEED)
    token_seed = _bounded(obj["token_seed"], "token_seed", where, 0, MAX_SEED)
    prefix_seed = obj.get("prefix_seed")
    if prefix_seed is not None:
        prefix_seed = _bounded(prefix_seed, "prefix_seed", where, 0, MAX_SEED)
    src = obj.get("source")
    if src is not None:
        src = _bounded(src, "source", where, 0, MAX_SEED)
    turns = _turns(obj["turns"], where)
    shared = _shared(obj.get("shared"), where, turns[0].append)
    traj = Trajectory(agent_id, turns, token_seed=token_seed, prefix_seed=prefix_seed,
                      source=src, shared=shared, start_s=_start_s(obj.get("start_s"), where))
    if traj.total > max_len:
        raise TraceError(f"{where}: agent {agent_id}: total {traj.total} tokens exceeds "
                         f"max_len {max_len}")
    return traj


def _shared(value: object, where: str, first_append: int) -> tuple[tuple[int, int], ...]:
    """The optional shared-prefix segments ``[[seed, tokens], ...]`` of the first turn."""
    if value is None:
        return ()
    if not isinstance(value, list) or not value:
        raise TraceError(f"{where}: field 'shared' must be a non-empty list of [seed, tokens]")
    out: list[tuple[int, int]] = []
    for i, seg in enumerate(value, start=1):
        if not isinstance(seg, list) or len(seg) != 2:
            raise TraceError(f"{where}: shared segment {i}: expected [seed, tokens], "
                             f"got {seg!r}")
        seed = _bounded(seg[0], "shared seed", where, 0, MAX_SEED)
        n = _bounded(seg[1], "shared tokens", where, 1, MAX_SEED)
        out.append((seed, n))
    total = sum(n for _, n in out)
    if total > first_append:
        raise TraceError(f"{where}: the shared prefix ({total} tokens) is longer than the "
                         f"first turn's append ({first_append})")
    return tuple(out)


def _start_s(value: object, where: str) -> float | None:
    """The optional first arrival ``start_s`` (seconds >= 0 after the trace's first)."""
    if value is None:
        return None
    if (not isinstance(value, int | float) or isinstance(value, bool)
            or not math.isfinite(value) or value < 0):
        raise TraceError(f"{where}: field 'start_s' must be a number of seconds >= 0, "
                         f"got {value!r}")
    return float(value)


def _bounded(value: object, name: str, where: str, low: int, high: int) -> int:
    if not is_int(value) or not low <= value <= high:
        raise TraceError(f"{where}: field {name!r} must be an integer in [{low}, {high}], "
                         f"got {value!r}")
    return int(value)


def _turns(value: object, where: str) -> tuple[Turn, ...]:
    if not isinstance(value, list) or not value:
        raise TraceError(f"{where}: field 'turns' must be a non-empty list of [append, gen]")
    turns: list[Turn] = []
    for i, pair in enumerate(value, start=1):
        if not isinstance(pair, list) or len(pair) != 2:
            raise TraceError(f"{where}: turn {i}: expected [append, gen], got {pair!r}")
        append, gen = pair
        for name, amount in (("append", append), ("gen", gen)):
            if not is_int(amount) or amount < 1:
                raise TraceError(f"{where}: turn {i}: {name} must be a positive integer, "
                                 f"got {amount!r}")
        turns.append(Turn(append, gen))
    return tuple(turns)
