"""A recording as a workload: the served turns it holds as a dualpath trace, and the file
sniffing that lets every ``--trace`` take a recording.

Why one place: ``sim run|compare|capacity --trace``, ``dualpath trace convert`` and the twin
(services/twin.py) all replay a recording's served turns; they read them through
:func:`recorded_trace` and :func:`recorded_starts`, so the trace an operator converts is the
one the twin replays. What carries over (docs/trace-format.md, "Recordings as traces"):
each agent's turn chain with every prompt length and generated length, the shared prefixes
the cluster hit across conversations, and each agent's first arrival (``start_s``); what
cannot (token ids, block hashes beyond the first turns' shared-prefix keys, the cluster's
own hits and evictions, the client's time between turns) is documented there.

How a recording is told apart (:func:`is_recording`): by its content, never only its name:
the first bytes say whether it is gzip or zstd compressed, and the first line whether it is
a recording's header; anything else goes to the trace reader (a dualpath trace or a Mooncake
request log), whose errors are one line each.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import orjson

from dualpath_cli.errors import TraceError, UsageError
from dualpath_cli.services.recording import read_recording, trace_from_decisions
from dualpath_cli.services.recording_stream import Tail, complete_lines
from dualpath_cli.telemetry.recording import FORMAT as RECORDING_FORMAT
from dualpath_cli.telemetry.recording import Recording
from dualpath_cli.workload.trace_format import Trace, decode_lines

__all__ = ["is_recording", "read_recording_trace", "recorded_trace", "recorded_starts",
           "trace_with_arrivals"]

_EXPECTED = ("expected a dualpath trace (docs/trace-format.md), a Mooncake request log or "
             "a recording (dualpath record)")
#: The first bytes of a gzip member and of a zstd frame.
_MAGIC = (b"\x1f\x8b", b"\x28\xb5\x2f\xfd")

def is_recording(path: str | Path) -> bool:
    """Whether ``path`` is a recording (its first line, decompressed as its first bytes
    say, is a recording's header). A plain file that is not one is left to the trace
    reader, whose errors name what is wrong with it.

    Raises:
        TraceError: a compressed file that is not a recording, or cannot be decompressed.
    """
    p = Path(path)
    if not p.is_file():
        return False  # the trace reader names what it is
    with p.open("rb") as raw:
        compressed = any(raw.read(4).startswith(m) for m in _MAGIC)
    try:
        first = next((raw for raw in complete_lines(p, Tail()) if raw.strip()), None)
        obj = orjson.loads(first) if first is not None else None
    except (OSError, EOFError, orjson.JSONDecodeError) as err:
        if not compressed:
            return False
        raise TraceError(f"{p}: a compressed file that is not a recording ({err}); "
                         f"{_EXPECTED}") from None
    except UsageError as err:  # a .zst file without the zstandard module
        raise TraceError(f"{p}: {err}") from None
    if (isinstance(obj, dict) and obj.get("kind") == "header"
            and obj.get("format") == RECORDING_FORMAT):
        return True
    if compressed:
        raise TraceError(f"{p}: a compressed file that is not a recording; {_EXPECTED}")
    return False


def recorded_trace(rec: Recording, source: str) -> Trace:
    """The served turns of ``rec`` as a trace: rebuilt from its decisions
    (services/recording.py ``trace_from_decisions``) where they hold the turns' block chains
    (the ``trace`` lines leave them out), else its ``trace`` lines (a clean end wrote them),
    else rebuilt from its decisions.

    Raises:
        UsageError: the recording served no turn (nothing to replay).
        TraceError: its trace lines do not decode.
    """
    rebuilt = trace_from_decisions(rec.decisions) if rec.decisions else None
    if rebuilt is not None and rebuilt.header.outputs_stored:
        return rebuilt
    if rec.trace_lines:
        return decode_lines((json.dumps(r) for r in rec.trace_lines), f"{source} (trace)")
    trace = rebuilt
    if trace is None:
        raise UsageError(f"{source}: no served turns to replay (the decision log is empty; "
                         "record while the cluster serves traffic)")
    return trace


def recorded_starts(rec: Recording) -> tuple[float, ...]:
    """Per agent of the replay (the trace's order: agent ids sorted), the second its first
    turn arrived after the first agent's: the story's arrival, else the first turn's
    decision time; 0 for an agent whose first turn is not in the window (it was already
    running when the window opened)."""
    first: dict[int, float] = {}
    agents: set[int] = set()
    rid_of: dict[int, int] = {}
    for d in rec.decisions:
        if d.kind != "turn":
            continue
        agents.add(d.agent)
        if d.turn == 0 and d.agent not in first:
            first[d.agent] = d.at
            rid_of[d.agent] = d.rid
    for agent, rid in rid_of.items():
        arrival = (rec.stories.get(rid) or {}).get("arrival")
        if isinstance(arrival, int | float) and math.isfinite(arrival):
            first[agent] = min(first[agent], float(arrival))
    t0 = min(first.values(), default=0.0)
    return tuple(first[a] - t0 if a in first else 0.0 for a in sorted(agents))


def trace_with_arrivals(rec: Recording, source: str) -> Trace:
    """:func:`recorded_trace` with each trajectory's ``start_s`` (:func:`recorded_starts`),
    so an offline replay starts each agent when the cluster saw it arrive; the header's
    ``generator`` says where the trace came from. Without the decisions' own agents (a
    recording whose trace lines name others) the arrivals are left out."""
    trace = recorded_trace(rec, source)
    starts = recorded_starts(rec)
    trajectories = trace.trajectories
    arrivals = len(starts) == len(trajectories)
    if arrivals:
        trajectories = tuple(replace(t, start_s=round(s, 6))
                             for t, s in zip(trajectories, starts, strict=True))
    generator = {**trace.header.generator, "from": "dualpath record", "recording": source,
                 "arrivals": "first turn's arrival per agent" if arrivals else "not known"}
    return Trace(replace(trace.header, generator=generator), trajectories)


def read_recording_trace(path: str | Path,
                         on_cut: Callable[[str], None] | None = None) -> Trace:
    """The recording at ``path`` as a trace with arrivals (:func:`trace_with_arrivals`).

    Raises:
        RecordingError: an unreadable recording (one line).
        UsageError: a recording that served no turn.
    """
    return trace_with_arrivals(read_recording(path, on_cut=on_cut), str(path))
