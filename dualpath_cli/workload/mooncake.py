"""The public Mooncake trace format: validating decode and summary statistics.

One JSON object per line: ``timestamp`` (arrival in ms since the first request),
``input_length`` and ``output_length`` (tokens) and ``hash_ids``, one id per 512-token block
of the input. Equal ids mean equal blocks *with equal prefixes* (the ids are chained), so a
block can only be reused while every earlier block of the request matched. Other keys (some
tools add ``input_text`` or session ids) are ignored.

Prefix-hit ratio (``prefix_hit_ratio``) of an unbounded cache, defined exactly:

1. requests are taken in arrival order: by ``timestamp``, ties in file order;
2. for a request with ids ``h_0..h_{m-1}``, the hit is the longest prefix ``h_0..h_{j-1}``
   whose ids were all seen before (the walk stops at the first unseen id, even if later ids
   were seen), worth ``min(512 j, input_length)`` tokens (the last block may be partial);
3. then all of its ids become seen (no eviction);
4. the ratio is the sum of hit tokens over the sum of ``input_length``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

from dualpath_cli.errors import TraceError
from dualpath_cli.workload.trace_format import is_int, load_object

__all__ = ["MOONCAKE_BLOCK_TOKENS", "MooncakeRequest", "MooncakeStats", "decode_mooncake",
           "prefix_hits", "mooncake_stats"]

MOONCAKE_BLOCK_TOKENS = 512


@dataclass(frozen=True, slots=True)
class MooncakeRequest:
    """One request of a Mooncake trace."""

    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class MooncakeStats:
    """Summary of a Mooncake trace (see the module docstring for the hit ratio)."""

    requests: int
    mean_input_length: float
    mean_output_length: float
    prefix_hit_ratio: float
    hit_tokens: int
    input_tokens: int
    unique_blocks: int
    duration_s: float

    def to_dict(self) -> dict[str, float]:
        """All fields as a plain dict (the ``--json`` keys)."""
        return asdict(self)


def decode_mooncake(lines: Iterable[str], source: str) -> list[MooncakeRequest]:
    """Parse and validate Mooncake lines; blank lines are skipped.

    Raises:
        TraceError: ``SOURCE:LINE: reason`` for the first bad line; ``SOURCE: reason`` when
            there is no request at all.
    """
    out: list[MooncakeRequest] = []
    for number, raw in enumerate(lines, start=1):
        if raw.strip():
            out.append(_request(raw, f"{source}:{number}"))
    if not out:
        raise TraceError(f"{source}: empty Mooncake trace: no request lines")
    return out


def _request(raw: str, where: str) -> MooncakeRequest:
    obj = load_object(raw, where)
    for key in ("timestamp", "input_length", "output_length", "hash_ids"):
        if key not in obj:
            raise TraceError(f"{where}: missing field {key!r}")
    stamp = obj["timestamp"]
    if (isinstance(stamp, bool) or not isinstance(stamp, (int, float))
            or not math.isfinite(stamp) or stamp < 0):
        raise TraceError(f"{where}: 'timestamp' must be a non-negative number of ms, "
                         f"got {stamp!r}")
    length = _count(obj["input_length"], "input_length", where, 1)
    output = _count(obj["output_length"], "output_length", where, 0)
    ids = obj["hash_ids"]
    if not isinstance(ids, list) or not all(is_int(h) and h >= 0 for h in ids):
        raise TraceError(f"{where}: 'hash_ids' must be a list of non-negative integers")
    blocks = -(-length // MOONCAKE_BLOCK_TOKENS)
    if len(ids) > blocks:
        raise TraceError(f"{where}: {len(ids)} hash_ids for input_length {length}: at most "
                         f"{blocks} blocks of {MOONCAKE_BLOCK_TOKENS} tokens")
    return MooncakeRequest(float(stamp), length, output, tuple(ids))


def _count(value: object, name: str, where: str, low: int) -> int:
    if not is_int(value) or value < low:
        kind = "a positive" if low else "a non-negative"
        raise TraceError(f"{where}: {name!r} must be {kind} integer, got {value!r}")
    return int(value)


def prefix_hits(requests: Sequence[MooncakeRequest],
                block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> list[int]:
    """Hit tokens of every request (in the given order) under an unbounded prefix cache."""
    order = sorted(range(len(requests)), key=lambda i: requests[i].timestamp_ms)
    seen: set[int] = set()
    hits = [0] * len(requests)
    for i in order:
        req = requests[i]
        matched = 0
        for block in req.hash_ids:
            if block not in seen:
                break
            matched += 1
        hits[i] = min(matched * block_tokens, req.input_length)
        seen.update(req.hash_ids)
    return hits


def mooncake_stats(requests: Sequence[MooncakeRequest]) -> MooncakeStats:
    """Requests, mean input and output lengths, and the unbounded-cache prefix-hit ratio."""
    if not requests:
        raise ValueError("no requests")
    hit = sum(prefix_hits(requests))
    inputs = sum(r.input_length for r in requests)
    stamps = [r.timestamp_ms for r in requests]
    return MooncakeStats(
        requests=len(requests),
        mean_input_length=inputs / len(requests),
        mean_output_length=sum(r.output_length for r in requests) / len(requests),
        prefix_hit_ratio=hit / inputs,
        hit_tokens=hit,
        input_tokens=inputs,
        unique_blocks=len({h for r in requests for h in r.hash_ids}),
        duration_s=(max(stamps) - min(stamps)) / 1000.0,
    )
