"""The dualpath trace format (JSONL, version 1): pure encode and validating decode.

Layout (docs/trace-format.md is the reference)::

    {"format": "dualpath-trace", "version": 1, "max_len": 64000, "generator": {...}}
    {"agent_id": 0, "token_seed": 123, "turns": [[A_1, g_1], [A_2, g_2], ...]}
    {"agent_id": 1, "token_seed": 456, "prefix_seed": 789, "source": 17, "turns": [...]}
    {"agent_id": 2, "token_seed": 457, "shared": [[42, 2048]], "turns": [...]}
    {"agent_id": 3, "token_seed": 3, "start_s": 1.25, "turns": [...]}
    {"agent_id": 4, "token_seed": 4, "turns": [[900, 20], [300, 9]], "blocks": [[7, 8], [7, 9, 10]]}

A header whose trajectories carry ``blocks`` may say how many tokens one block id covers
(``"block_tokens"``, default 512: Mooncake's), and whether a turn's generated tokens' blocks
are stored when it ends (``"outputs_stored": true``: a recording of the runtime, whose decode
engine writes them; default false: only prompts are stored, as a request log's count has it).

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
    "DEFAULT_BLOCK_TOKENS",
    "TraceHeader",
    "Trace",
    "encode_lines",
    "decode_lines",
    "load_object",
    "is_int",
]

FORMAT_NAME = "dualpath-trace"
FORMAT_VERSION = 1

_HEADER_KEYS = {"format", "version", "max_len", "generator", "block_tokens", "outputs_stored"}
_REQUIRED = ("agent_id", "token_seed", "turns")
_OPTIONAL = ("prefix_seed", "source", "shared", "start_s", "blocks")

DEFAULT_BLOCK_TOKENS = 512
"""Tokens one ``blocks`` id covers when the header does not say (Mooncake's hash ids)."""
MAX_BLOCK_TOKENS = 1 << 20


@dataclass(frozen=True)
class TraceHeader:
    """First line of a trace: the cap on every total, how the trace was made, and how many
    tokens one id of a trajectory's ``blocks`` covers."""

    max_len: int
    generator: dict[str, Any] = field(default_factory=dict)
    version: int = FORMAT_VERSION
    block_tokens: int = DEFAULT_BLOCK_TOKENS
    outputs_stored: bool = False


@dataclass(frozen=True)
class Trace:
    """A header and its trajectories (agent ids unique, every total <= max_len)."""

    header: TraceHeader
    trajectories: tuple[Trajectory, ...]


def encode_lines(trace: Trace) -> Iterator[str]:
    """The trace as JSON lines (without newlines), header first."""
    head: dict[str, Any] = {"format": FORMAT_NAME, "version": trace.header.version,
                            "max_len": trace.header.max_len,
                            "generator": trace.header.generator}
    if trace.header.block_tokens != DEFAULT_BLOCK_TOKENS:
        head["block_tokens"] = trace.header.block_tokens
    if trace.header.outputs_stored:
        head["outputs_stored"] = True
    yield json.dumps(head, separators=(",", ":"))
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
        if traj.blocks:
            record["blocks"] = [list(chain) for chain in traj.blocks]
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
        traj = _trajectory(obj, where, header)
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
    block_tokens = obj.get("block_tokens", DEFAULT_BLOCK_TOKENS)
    if not is_int(block_tokens) or not 1 <= block_tokens <= MAX_BLOCK_TOKENS:
        raise TraceError(f"{where}: header field 'block_tokens' must be an integer in "
                         f"[1, {MAX_BLOCK_TOKENS}], got {block_tokens!r}")
    outputs_stored = obj.get("outputs_stored", False)
    if not isinstance(outputs_stored, bool):
        raise TraceError(f"{where}: header field 'outputs_stored' must be true or false, "
                         f"got {outputs_stored!r}")
    return TraceHeader(max_len=max_len, generator=generator, version=version,
                       block_tokens=block_tokens, outputs_stored=outputs_stored)


def _trajectory(obj: dict[str, Any], where: str, header: TraceHeader) -> Trajectory:
    max_len = header.max_len
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
    blocks = _blocks(obj.get("blocks"), where, turns, header.block_tokens)
    traj = Trajectory(agent_id, turns, token_seed=token_seed, prefix_seed=prefix_seed,
                      source=src, shared=shared, start_s=_start_s(obj.get("start_s"), where),
                      blocks=blocks)
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


def _blocks(value: object, where: str, turns: tuple[Turn, ...], block_tokens: int
            ) -> tuple[tuple[int, ...], ...]:
    """The optional block chains ``[[id, ...], ...]``: one per turn, each at most as many
    ids as the turn's prompt has blocks."""
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) != len(turns):
        raise TraceError(f"{where}: field 'blocks' must be a list of {len(turns)} lists of "
                         "block ids, one per turn")
    out: list[tuple[int, ...]] = []
    prompt = 0
    for i, (chain, turn) in enumerate(zip(value, turns, strict=True), start=1):
        prompt += turn.append
        if not isinstance(chain, list) or not all(is_int(h) and 0 <= h <= MAX_SEED
                                                   for h in chain):
            raise TraceError(f"{where}: turn {i}: blocks must be a list of integers in "
                             f"[0, {MAX_SEED}]")
        most = -(-prompt // block_tokens)
        if len(chain) > most:
            raise TraceError(f"{where}: turn {i}: {len(chain)} block ids for a prompt of "
                             f"{prompt} tokens: at most {most} blocks of {block_tokens}")
        out.append(tuple(chain))
        prompt += turn.gen
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
