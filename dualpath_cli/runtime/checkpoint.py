"""The scheduler's checkpoint: its queues, assignments, thresholds and counters, on disk.

Why: a scheduler killed with ``-9`` (OOM killer, a node reboot, an operator's mistake) must
not take the admitted turns with it (issue 16, item 3). :func:`capture` takes one consistent
snapshot of a :class:`~dualpath_cli.runtime.scheduler.SchedulerService` under its lock (the
turns in flight and where each waits: global FIFO, a DE group's private queue, the PE queue
or dispatched on a PE/DE pair; the engines it knows with their addresses; alpha, beta, the
quota, the read side, the controllers; the request id, ordinal and decision sequence
counters; its control endpoint). :func:`restore` puts them into a fresh scheduler before its
thread starts. Callers add their own sections (the live cluster adds sessions, idempotency
keys and joined nodes) to the same file.

The file (:func:`write` / :func:`read`) is one header line (format, version, body length and
its SHA-256) and a JSON body, replaced atomically (:mod:`dualpath_cli.atomicio`): a reader
sees the previous checkpoint or the new one, never half. A file that is truncated, altered
or of an unknown version is refused with :class:`CheckpointError` (one line) and moved aside
(``NAME.corrupt-UTC``), never deleted.

What a restore does with turns that were dispatched: they are re-queued at the head of the
FIFO with a new attempt number, and their old PE and DE are told to cancel the old attempt.
A ``first``/``done`` the engines sent while the scheduler was down may have died in the
killed process's socket buffers, so waiting for them could hang a turn forever; the old
attempt's late answers are ignored (their attempt number is stale). The model is
deterministic, so the re-run produces the same tokens.

Pure runtime: imports only :mod:`~dualpath_cli.runtime`, ``core`` and the foundation.
"""

from __future__ import annotations

import base64
import collections
import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dualpath_cli.atomicio import atomic_write_bytes
from dualpath_cli.errors import DualPathError
from dualpath_cli.runtime.sched_state import EngineRow, FlightRow, SchedulerState
from dualpath_cli.runtime.scheduler import SchedulerService
from dualpath_cli.runtime.turns import TurnRequest

log = logging.getLogger(__name__)

__all__ = ["FORMAT", "VERSION", "CheckpointError", "Restored", "capture", "grab", "build",
           "restore",
           "encode_checkpoint", "decode_checkpoint", "write", "read", "set_aside", "rebind",
           "Checkpointer", "PromptSpool", "read_spool"]

FORMAT = "dualpath-scheduler-checkpoint"
VERSION = 1
_MAX_BYTES = 1 << 30  # a checkpoint larger than this is not one of ours
#: Request ids one scheduler incarnation issues at most. A restored scheduler starts at the
#: next multiple of it after the checkpoint's ``next_rid``: turns its predecessor admitted
#: after the last checkpoint may still run on the engines, which kept running, and a new
#: turn given one of their ids got its KV mixed with theirs (wrong tokens served).
RID_EPOCH = 1 << 32


class CheckpointError(DualPathError):
    """A checkpoint that cannot be used (truncated, altered, unknown version)."""

    exit_code = 2


# -- the scheduler's section ---------------------------------------------------------------
def _tokens_out(tokens: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(tokens, dtype="<i8").tobytes()).decode()


def _tokens_in(text: str) -> np.ndarray:
    raw = base64.b64decode(text.encode(), validate=True)
    if len(raw) % 8:
        raise ValueError("token bytes are not a whole number of int64")
    return np.frombuffer(raw, dtype="<i8").astype(np.int64)


def capture(sched: SchedulerService, spool: PromptSpool | None = None) -> dict[str, Any]:
    """One consistent snapshot of ``sched`` as plain JSON data: :func:`grab` (under its
    lock) then :func:`build` (outside it).

    ``spool``: prompts go to it once per turn and the snapshot holds only their place
    (``prompt``), so a checkpoint's size is the turns' metadata, not their prompts; without
    one each prompt is in the snapshot (``tokens``, base64 int64).
    """
    return build(grab(sched), spool)


def grab(sched: SchedulerService) -> SchedulerState:
    """What a snapshot needs, copied under the scheduler's lock as plain rows (the least
    work while every fetch and message waits): pass it to :func:`build`."""
    return sched.export_state()


def build(grabbed: SchedulerState, spool: PromptSpool | None = None) -> dict[str, Any]:
    """The JSON snapshot of what :func:`grab` copied (prompts spooled or inlined)."""
    g, now = grabbed, grabbed.taken_at
    raw = sorted(g.flights, key=lambda r: r[0])  # admission order: the restored FIFO's order
    flights: list[dict[str, Any]] = [
        {"rid": rid, "agent": req.agent, "turn": req.turn, "gen": req.gen, "attempt": att,
         "age_s": round(now - submitted, 6), "max_hit_blocks": hit, "pe": pe, "de": de,
         "where": g.where.get(rid, "dispatched")}
        for rid, req, att, submitted, hit, pe, de in raw]
    state: dict[str, Any] = {
        "address": g.address, "next_rid": g.next_rid, "ordinal": g.ordinal,
        "decision_seq": g.decision_seq, "requeued": g.requeued, "policy": g.policy,
        "read_side": g.read_side, "alpha": g.alpha, "beta": g.beta, "z_factor": g.z_factor,
        "quota_s": g.quota_s, "sources": dict(g.sources), "controllers": dict(g.controllers),
        "controller_values": dict(g.controller_values), "flights": flights, "engines": [
            {"id": eid, "role": role, "node": node, "group": group, "address": address,
             "pid": pid, "alive": alive, "dead_why": why, "next_seq": seq}
            for eid, role, node, group, address, pid, alive, why, seq in g.engines]}
    if spool is None:
        for item, r in zip(flights, raw, strict=True):
            item["tokens"] = _tokens_out(r[1].tokens)
    else:  # finished turns forgotten (and a compaction) first: places then stay valid
        state["spool"] = spool.settle({r[0] for r in raw})
        for item, r in zip(flights, raw, strict=True):
            item["prompt"] = spool.put(r[0], r[1].tokens)
    return state


@dataclass(frozen=True, slots=True)
class Restored:
    """What :func:`restore` put back."""

    flights: int
    requeued: int
    engines: int
    decision_seq: int
    next_rid: int

    def to_dict(self) -> dict[str, int]:
        """Plain JSON form."""
        return dataclasses.asdict(self)


def restore(sched: SchedulerService, state: dict[str, Any], *, engines: bool,
            spool_dir: Path | None = None) -> Restored:
    """Put a :func:`capture` snapshot into ``sched`` (fresh, its thread not started).

    Args:
        sched: the new scheduler.
        state: the snapshot.
        engines: also restore the engines (nodes that joined keep running through a
            scheduler restart and reconnect); ``False`` when this launcher starts its own
            engines anew (their ids are re-registered by the system).
        spool_dir: where the snapshot's prompt spool is (beside the checkpoint file).

    Raises:
        CheckpointError: the snapshot does not fit this scheduler (a missing field, a
            different policy family), in one line.
    """
    try:
        prompts = read_spool(spool_dir, state) if "spool" in state else {}
        loaded = _loaded(state, prompts)
        flights, requeued = sched.import_state(loaded, with_engines=engines)
    except (KeyError, TypeError, ValueError) as err:
        raise CheckpointError(f"the checkpoint does not fit this scheduler "
                              f"({type(err).__name__}: {err})") from None
    return Restored(flights, requeued, len(loaded.engines) if engines else 0,
                    loaded.decision_seq, int(state["next_rid"]))


def _loaded(state: dict[str, Any], prompts: dict[int, np.ndarray]) -> SchedulerState:
    """The snapshot's JSON as a :class:`SchedulerState` (request ids past the epoch of the
    checkpointed ones, ages made into this process's monotonic times)."""
    now = time.monotonic()
    flights: list[FlightRow] = []
    where: dict[int, str] = {}
    for item in state["flights"]:
        rid = int(item["rid"])
        tokens = prompts[rid] if "prompt" in item else _tokens_in(str(item["tokens"]))
        hit = item["max_hit_blocks"]
        flights.append((rid, TurnRequest(int(item["agent"]), int(item["turn"]), tokens,
                                         int(item["gen"])),
                        int(item["attempt"]), now - float(item["age_s"]),
                        None if hit is None else int(hit), int(item["pe"]), int(item["de"])))
        where[rid] = str(item["where"])
    engines: list[EngineRow] = [
        (int(e["id"]), str(e["role"]), int(e["node"]), int(e["group"]), str(e["address"]),
         int(e["pid"]), bool(e["alive"]), str(e["dead_why"]), int(e["next_seq"]))
        for e in state["engines"]]
    return SchedulerState(
        address=str(state.get("address", "")),
        next_rid=(int(state["next_rid"]) // RID_EPOCH + 1) * RID_EPOCH,
        ordinal=int(state["ordinal"]), decision_seq=int(state["decision_seq"]),
        requeued=int(state["requeued"]), policy=str(state.get("policy", "")),
        read_side=str(state["read_side"]), alpha=int(state["alpha"]),
        beta=int(state["beta"]), z_factor=float(state["z_factor"]),
        quota_s=float(state["quota_s"]),
        sources={str(k): str(v) for k, v in state["sources"].items()},
        controllers={str(k): bool(v) for k, v in state["controllers"].items()},
        controller_values={str(k): float(v) for k, v in state["controller_values"].items()},
        flights=flights, where=where, engines=engines)


def rebind(sched: SchedulerService, address: str) -> bool:
    """Bind ``sched``'s control endpoint to ``address`` again (before its thread starts).

    Why: nodes that joined send to the address they were given; a scheduler that comes
    back on it is reached again without the nodes doing anything (ZeroMQ reconnects).
    Returns False (the new, random address stays) when the fabric cannot bind a given port
    or the port is taken; the nodes then re-join (services/node.py).
    """
    import zmq

    from dualpath_cli.transfer.zmq_fabric import ZmqEndpoint

    if not isinstance(sched.ep, ZmqEndpoint) or sched.address == address:
        return sched.address == address
    host, _, port = address.removeprefix("tcp://").rpartition(":")
    if not port.isdigit():
        return False
    try:
        ep = sched.ep.bound_to(host, int(port))
    except zmq.ZMQError:  # the port is taken
        return False
    sched.ep.close()
    sched.ep, sched.address = ep, ep.address
    return True


# -- the prompt spool ---------------------------------------------------------------------------
class PromptSpool:
    """Admitted turns' prompts, each appended once to ``NAME.prompts-GEN`` beside the file.

    Why: a prompt is the bulk of a turn's state (thousands of tokens) and never changes, so
    rewriting every prompt in every checkpoint would make each write as large as all the
    prompts in flight (21 MB and about a second for 1,000 turns of 2,000 tokens). Instead a
    checkpoint names each prompt's place (offset, tokens, width, CRC-32) in the spool, and
    writes only metadata. The spool grows by each new turn's prompt; once it holds four
    times the live prompts (and more than 64 MiB) the live ones are copied to the next
    generation, which the next checkpoint names, and older generations are removed after it
    is written (:meth:`retire`).
    """

    def __init__(self, checkpoint: Path, generation: int = 0, compact_bytes: int = 64 << 20
                 ) -> None:
        self.dir = checkpoint.parent
        self.stem = checkpoint.name
        self.gen = generation
        self.compact_bytes = compact_bytes
        self.size = 0
        self._where: dict[int, list[int]] = {}  # rid -> [offset, tokens, width, crc]
        self._tokens: dict[int, np.ndarray] = {}  # live prompts (for a compaction)
        self._fh: Any = None

    def path(self, generation: int | None = None) -> Path:
        """The spool file of ``generation`` (default: the current one)."""
        return self.dir / f"{self.stem}.prompts-{self.gen if generation is None else generation}"

    def _open(self) -> Any:
        if self._fh is None:
            fd = os.open(self.path(), os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_TRUNC,
                         0o600)
            self._fh = os.fdopen(fd, "ab", buffering=0)
            self.size = 0
        return self._fh

    def put(self, rid: int, tokens: np.ndarray) -> list[int]:
        """Turn ``rid``'s prompt's place in the spool (appended the first time)."""
        where = self._where.get(rid)
        if where is not None:
            return where
        arr = np.asarray(tokens)
        width = 4 if not arr.size or (int(arr.min()) >= -(1 << 31)
                                      and int(arr.max()) < (1 << 31)) else 8
        data = np.ascontiguousarray(arr, dtype=f"<i{width}").tobytes()
        fh = self._open()
        fh.write(data)
        where = [self.size, int(arr.size), width, zlib.crc32(data)]
        self.size += len(data)
        self._where[rid] = where
        self._tokens[rid] = arr
        return where

    def settle(self, live: set[int]) -> str:
        """Forget finished turns and compact when worth it (before this capture's
        :meth:`put` calls, whose places are then final); the spool file's name to record."""
        for rid in [r for r in self._where if r not in live]:
            del self._where[rid]
            self._tokens.pop(rid, None)
        live_bytes = sum(w[1] * w[2] for w in self._where.values())
        if self.size > self.compact_bytes and self.size > 4 * live_bytes:
            if self._fh is not None:
                self._fh.close()
                self._fh = None
            self.gen += 1
            kept = dict(self._tokens)
            self._where.clear()
            for rid, arr in kept.items():
                self.put(rid, arr)
        return self.path().name

    def retire(self) -> None:
        """Remove spool generations older than the current one (a checkpoint naming the
        current one was written)."""
        prefix = f"{self.stem}.prompts-"
        for old in self.dir.glob(prefix + "*"):
            tail = old.name[len(prefix):]
            if tail.isdigit() and int(tail) < self.gen:
                with contextlib.suppress(OSError):
                    old.unlink()

    def close(self, remove: bool = False) -> None:
        """Close the file; ``remove`` deletes every generation (nothing left to restore)."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        if remove:
            for old in self.dir.glob(f"{self.stem}.prompts-*"):
                with contextlib.suppress(OSError):
                    old.unlink()


def read_spool(spool_dir: Path | None, state: dict[str, Any]) -> dict[int, np.ndarray]:
    """The prompts a snapshot names in its spool, each checked against its CRC-32.

    Raises:
        CheckpointError: the spool is missing, short, or a prompt does not match.
    """
    name = str(state["spool"])
    if spool_dir is None or "/" in name or name.startswith("."):
        raise CheckpointError(f"the checkpoint names a prompt spool {name!r} it cannot read")
    path = spool_dir / name
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise CheckpointError(f"the checkpoint's prompt spool {path}: {err.strerror}"
                              ) from None
    out: dict[int, np.ndarray] = {}
    for item in state["flights"]:
        if "prompt" not in item:
            continue
        offset, n, width, crc = (int(v) for v in item["prompt"])
        data = raw[offset:offset + n * width]
        if width not in (4, 8) or len(data) != n * width or zlib.crc32(data) != crc:
            raise CheckpointError(f"the prompt of turn {item['rid']} in {path.name} is "
                                  "truncated or corrupt (its CRC-32 does not match)")
        out[int(item["rid"])] = np.frombuffer(data, dtype=f"<i{width}").astype(np.int64)
    return out


# -- the file ---------------------------------------------------------------------------------
def encode_checkpoint(sections: dict[str, Any]) -> bytes:
    """The file's bytes: a header line (format, version, length, SHA-256), then the body."""
    body = json.dumps(sections, separators=(",", ":")).encode()
    head = {"format": FORMAT, "version": VERSION, "bytes": len(body),
            "sha256": hashlib.sha256(body).hexdigest(), "written": time.time()}
    return json.dumps(head).encode() + b"\n" + body


def decode_checkpoint(raw: bytes, where: str = "the checkpoint") -> dict[str, Any]:
    """The sections of a checkpoint file's bytes.

    Raises:
        CheckpointError: not a checkpoint, another version, truncated or altered.
    """
    line, sep, body = raw.partition(b"\n")
    try:
        head = json.loads(line) if sep else None
    except ValueError:
        head = None
    if not isinstance(head, dict) or head.get("format") != FORMAT:
        raise CheckpointError(f"{where} is not a scheduler checkpoint (no header line)")
    if head.get("version") != VERSION:
        raise CheckpointError(f"{where} has version {head.get('version')!r}; this dualpath "
                              f"reads version {VERSION}")
    if head.get("bytes") != len(body):
        raise CheckpointError(f"{where} is truncated or padded ({len(body)} body bytes, "
                              f"the header says {head.get('bytes')})")
    if hashlib.sha256(body).hexdigest() != head.get("sha256"):
        raise CheckpointError(f"{where} is corrupt (its SHA-256 does not match the header)")
    try:
        sections = json.loads(body)
    except ValueError as err:  # the checksum matched: written so by a bug, still refused
        raise CheckpointError(f"{where} holds bad JSON ({err})") from None
    if not isinstance(sections, dict):
        raise CheckpointError(f"{where} holds no sections")
    return sections


def write(path: Path, sections: dict[str, Any], fsync: bool = False) -> int:
    """Replace ``path`` atomically with ``sections`` (mode 0600); bytes written.

    ``fsync`` False by default: a process killed with -9 loses nothing the kernel already
    has (the rename is atomic); only a power loss could lose the last interval.
    """
    data = encode_checkpoint(sections)
    atomic_write_bytes(path, data, mode=0o600, fsync=fsync)
    return len(data)


def read(path: Path) -> dict[str, Any] | None:
    """The checkpoint at ``path`` (``None`` when there is none).

    Raises:
        CheckpointError: unusable; the file is first moved aside to ``NAME.corrupt-UTC``
            (the message says where), so a restart starts afresh and nothing is deleted.
    """
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return None
    except OSError as err:
        raise CheckpointError(f"checkpoint {path}: cannot read it ({err.strerror})") from None
    try:
        if size > _MAX_BYTES:
            raise CheckpointError(f"checkpoint {path} is {size} bytes, more than any "
                                  "checkpoint this dualpath writes")
        return decode_checkpoint(path.read_bytes(), f"checkpoint {path}")
    except CheckpointError as err:
        raise set_aside(path, err) from None
    except OSError as err:
        raise CheckpointError(f"checkpoint {path}: cannot read it ({err.strerror})") from None


def set_aside(path: Path, err: Exception) -> CheckpointError:
    """Move an unusable checkpoint to ``NAME.corrupt-UTC`` (never delete it); the error
    to raise, its message ``err``'s plus where the file went."""
    aside = path.with_name(
        f"{path.name}.corrupt-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}")
    try:
        os.replace(path, aside)
    except OSError as move:
        return CheckpointError(f"{err}; could not move it aside ({move.strerror}): move or "
                               "remove it to start afresh")
    return CheckpointError(f"{err}; moved aside to {aside.name} (kept for inspection); "
                           "launch again to start without it")


class Checkpointer:
    """Writes a checkpoint when the state changed: on a poke, or every ``interval_s``.

    Why this cadence and not once per turn: a turn's admission and end only set an event
    and bump a counter (a few microseconds on the request's path); this thread then
    captures and writes at most once per ``min_gap_s`` (coalescing every change in that
    window into one write), and checks every ``interval_s`` for changes nobody poked about
    (an engine declared dead, a controller step). The scheduler's lock is held only to copy
    the turns' fields (about 1 ms for 1,000 turns in flight on a loaded host); the prompts
    go to the :class:`PromptSpool` once per turn, so a write is the turns' metadata (161 kB
    for 1,000 turns). The spacing of writes grows with their cost (``max_share``), so at
    any request rate the scheduler spends a bounded share of a core on it (``stats``). An
    admission lost in the window before the next write is not answered to anyone, and a
    client that resubmits with its idempotency key runs it then: still one answer.

    Args:
        path: the checkpoint file.
        collect: returns the sections to write (called on this thread).
        signature: a cheap value that changes whenever the state does (called often).
        interval_s: the longest time a change waits unnoticed.
        min_gap_s: the shortest time between two writes.
        after_write: called after each successful write (the prompt spool retires old
            generations).
        max_share: the largest share of a core the writes may take (the gap between two
            writes grows with their cost: with 1,000 turns of 2,000 tokens in flight a
            capture and write took about 30 ms on a loaded 2-core host, so writes come
            every 150 ms there; with 100 turns about 5 ms, so every 50 ms).
    """

    def __init__(self, path: Path, collect: Callable[[], dict[str, Any]],
                 signature: Callable[[], Any], interval_s: float = 0.25,
                 min_gap_s: float = 0.05, after_write: Callable[[], None] | None = None,
                 max_share: float = 0.2) -> None:
        self.path = path
        self.max_share = max_share
        self._last_cost = 0.0
        self._after_write = after_write
        self._collect = collect
        self._signature = signature
        self.interval_s = interval_s
        self.min_gap_s = min_gap_s
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="checkpoint", daemon=True)
        self._last_sig: Any = None
        self._write_lock = threading.Lock()
        self.writes = 0
        self.errors = 0
        self.last_error: str | None = None
        self.bytes = 0
        self.busy_s = 0.0
        self.last_write_at = 0.0
        self._recent: collections.deque[float] = collections.deque(maxlen=64)

    def start(self) -> None:
        """Start the writer thread."""
        self._thread.start()

    def poke(self) -> None:
        """Something changed (an admission, an answer): write soon."""
        self._wake.set()

    def write_now(self) -> bool:
        """Capture and write at once (on this thread); whether it was written."""
        with self._write_lock:
            t0 = time.perf_counter()
            sig = self._signature()
            try:
                self.bytes = write(self.path, self._collect())
            except (OSError, CheckpointError) as err:
                self.errors += 1
                self.last_error = f"{type(err).__name__}: {err}"
                if self.errors == 1 or self.errors % 100 == 0:  # said, not flooded
                    log.warning("scheduler checkpoint %s not written (%d failures so far): "
                                "%s; a restart would restore an older state", self.path,
                                self.errors, self.last_error)
                return False
            self._last_sig = sig
            if self._after_write is not None:
                self._after_write()
            self.writes += 1
            self.last_write_at = time.monotonic()
            spent = self._last_cost = time.perf_counter() - t0
            self.busy_s += spent
            self._recent.append(spent)
            return True

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval_s)
            self._wake.clear()
            if self._stop.is_set():
                return
            # at most max_share of a core: a write that took 30 ms waits 150 ms for the next
            spacing = max(self.min_gap_s, self._last_cost / self.max_share)
            gap = self.last_write_at + spacing - time.monotonic()
            if gap > 0 and self._stop.wait(gap):
                return
            if self._signature() != self._last_sig:
                self.write_now()

    def stats(self) -> dict[str, Any]:
        """Writes, errors, bytes of the last one, seconds spent, the last write's cost."""
        recent = sorted(self._recent)
        return {"path": str(self.path), "writes": self.writes, "errors": self.errors,
                "last_error": self.last_error, "bytes": self.bytes,
                "busy_s": round(self.busy_s, 6),
                "write_p50_ms": round(recent[len(recent) // 2] * 1e3, 3) if recent else None}

    def stop(self, final: bool = True) -> None:
        """End the thread; with ``final``, write once more if anything changed."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        if final and self._signature() != self._last_sig:
            self.write_now()
