"""A live cluster that survives its scheduler's ``kill -9``: checkpoint, restore, one answer.

Why apart from :mod:`~dualpath_cli.services.live`: the live cluster serves; this module makes
what it admitted outlive its process (issue 16, item 3). :class:`TurnKeys` maps a client's
idempotency key (HTTP ``Idempotency-Key``) to the turn it admitted, so a resubmission gets
the same turn (running, or its kept answer) instead of a second run. :class:`LiveCheckpoint`
writes the scheduler's section (:mod:`dualpath_cli.runtime.checkpoint`) with the live
cluster's own (sessions, keys with their answers, the names of the turns it carries:
chatcmpl- ids and clients' x-request-id) and the joined nodes
(:class:`~dualpath_cli.cluster.join.JoinService`) into one file, and puts them all back into
a new process before its scheduler starts.

After a restart: every admitted turn is in the scheduler's queues again (those that were
dispatched with a new attempt number); a key whose turn had finished answers from the kept
result without running it; nodes that joined reconnect to the same control port.
"""

from __future__ import annotations

import collections
import hashlib
import math
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np

from dualpath_cli.cluster.join import JoinService
from dualpath_cli.cluster.system import RuntimeSystem
from dualpath_cli.errors import UsageError
from dualpath_cli.runtime import checkpoint as ckpt
from dualpath_cli.runtime.options import RuntimeOptions
from dualpath_cli.runtime.sched_state import SchedulerState
from dualpath_cli.runtime.scheduler import SchedulerService
from dualpath_cli.runtime.turns import Ticket, TurnResult
from dualpath_cli.telemetry.request_ids import RequestAliases
from dualpath_cli.telemetry.view import AuditEntry

__all__ = ["KEYS_KEPT", "KeyConflict", "TurnKeys", "Admissions", "LiveCheckpoint",
           "check_key", "checkpoint_path", "calibrated_rate"]

T = TypeVar("T")

#: Idempotency keys remembered (oldest finished first out). Each finished one keeps its
#: answer's tokens in every checkpoint, so this bounds the checkpoint's size.
KEYS_KEPT = 1024
_KEY_CHARS = 200


class KeyConflict(UsageError):
    """An idempotency key reused for a different turn (HTTP 422)."""


def check_key(key: str) -> str:
    """``key`` if it is a usable idempotency key (1-200 printable ASCII characters).

    Raises:
        UsageError: it is not.
    """
    if not 0 < len(key) <= _KEY_CHARS or not key.isascii() or not key.isprintable():
        raise UsageError(f"Idempotency-Key: 1-{_KEY_CHARS} printable ASCII characters")
    return key


def checkpoint_path(port: int) -> Path:
    """The scheduler checkpoint of the cluster on ``port``, in the state directory."""
    from dualpath_cli.services import statefile

    return statefile.checkpoint_path(port)


def calibrated_rate(path: Path) -> float | None:
    """The FLOP/s rate the checkpointed launcher calibrated (``None``: no usable checkpoint).

    Why: a restart reuses it instead of calibrating again (seconds on a loaded host, most of
    a restarted scheduler's start); :meth:`LiveCheckpoint.restore` judges the file itself.
    """
    try:
        rate = float(ckpt.decode_checkpoint(path.read_bytes())["live"]["flops_rate"])
    except (OSError, ckpt.CheckpointError, KeyError, TypeError, ValueError):
        return None
    return rate if math.isfinite(rate) and rate > 0 else None


def _digest(tokens: list[int], gen: int, session: str | None) -> str:
    h = hashlib.blake2b(digest_size=16)
    h.update(np.asarray(tokens, dtype="<i8").tobytes())
    h.update(f"|{gen}|{session}".encode())
    return h.hexdigest()


class TurnKeys:
    """Idempotency key -> (digest of the turn, its ticket); bounded to ``kept`` keys.

    Not thread-safe: the live cluster calls it under its lock.
    """

    def __init__(self, kept: int = KEYS_KEPT) -> None:
        self.kept = kept
        self._map: collections.OrderedDict[str, tuple[str, Ticket]] = (
            collections.OrderedDict())
        self.replayed = 0

    def find(self, key: str, tokens: list[int], gen: int,
             session: str | None) -> tuple[str, Ticket | None]:
        """The turn's digest and the ticket already admitted under ``key`` (or ``None``).

        A turn that was answered with an error (a drain cut it off) is forgotten: the
        resubmission runs it.

        Raises:
            KeyConflict: ``key`` names a different turn.
        """
        digest = _digest(tokens, gen, session)
        held = self._map.get(key)
        if held is None:
            return digest, None
        if held[0] != digest:
            raise KeyConflict(f"Idempotency-Key {key!r} was used for a different turn "
                              "(prompt, max_tokens or session differ); use a new key")
        ticket = held[1]
        if ticket.event.is_set() and ticket.error is not None:
            del self._map[key]
            return digest, None
        self.replayed += 1
        return digest, ticket

    def put(self, key: str, digest: str, ticket: Ticket) -> None:
        """Remember ``ticket`` under ``key``; forget the oldest finished keys beyond ``kept``."""
        self._map[key] = (digest, ticket)
        if len(self._map) > self.kept:
            for old in list(self._map)[:len(self._map) - self.kept]:
                if self._map[old][1].event.is_set():
                    del self._map[old]

    def __len__(self) -> int:
        return len(self._map)

    def snapshot(self, rids: dict[int, int]) -> list[dict[str, Any]]:
        """Each key with its digest and either the running turn's rid or the kept answer
        (``rids``: id(ticket) -> rid of the scheduler's turns in flight)."""
        out: list[dict[str, Any]] = []
        for key, (digest, ticket) in self._map.items():
            item: dict[str, Any] = {"key": key, "digest": digest}
            rid = rids.get(id(ticket))
            r = ticket.result
            if rid is not None:
                item["rid"] = rid
            elif ticket.event.is_set() and ticket.error is None and r is not None:
                item["result"] = {"tokens": r.tokens, "cached": r.cached,
                                  "attempts": r.attempts, "pe": r.pe, "de": r.de,
                                  "pe_tokens": r.pe_tokens, "rx_from_pe": r.rx_from_pe}
                if ticket.rid is not None:
                    item["result"]["rid"] = ticket.rid
            else:
                continue  # answered with an error, or lost: the resubmission runs it
            out.append(item)
        return out

    def restore(self, items: list[dict[str, Any]], tickets: dict[int, Ticket]) -> int:
        """Put :meth:`snapshot` back (``tickets``: rid -> the restored turn's ticket);
        how many keys came back."""
        n = 0
        for item in items:
            ticket: Ticket | None = None
            if "rid" in item:
                ticket = tickets.get(int(item["rid"]))
            elif "result" in item:
                r = item["result"]
                rid = r.get("rid")
                ticket = Ticket(rid=None if rid is None else int(rid))
                ticket.result = TurnResult([int(t) for t in r["tokens"]], 0.0, 0.0, 0.0,
                                           int(r["cached"]), int(r["attempts"]), int(r["pe"]),
                                           int(r["de"]), int(r["pe_tokens"]),
                                           int(r["rx_from_pe"]))
                ticket.finish()
            if ticket is not None:
                self._map[str(item["key"])] = (str(item["digest"]), ticket)
                n += 1
        return n


class Admissions(Protocol):
    """What a checkpoint needs of the live cluster (services/live.py's
    :class:`~dualpath_cli.services.live.LiveCluster`): its system, its admission state
    (sessions, the next agent id, idempotency keys) read and put back under its lock.

    Why a protocol: the live cluster builds its :class:`LiveCheckpoint`, so this module
    names what it uses instead of importing the live cluster back."""

    @property
    def system(self) -> RuntimeSystem: ...

    @property
    def opts(self) -> RuntimeOptions: ...

    @property
    def audit(self) -> list[AuditEntry]: ...

    @property
    def joins(self) -> JoinService | None: ...

    @property
    def turn_keys(self) -> TurnKeys: ...

    @property
    def aliases(self) -> RequestAliases: ...

    def export_sessions(self, during: Callable[[], T]
                        ) -> tuple[T, list[tuple[str, int, int]], int]: ...

    def import_sessions(self, sessions: Iterable[tuple[str, int, int]], next_agent: int,
                        tickets: Iterable[Ticket], during: Callable[[], T]) -> T: ...


def _flat(live: Admissions) -> SchedulerService:
    """The live cluster's one scheduler (a hierarchical one is not checkpointed: live.py
    starts it without a checkpoint)."""
    sched = live.system.scheduler
    if not isinstance(sched, SchedulerService):
        raise UsageError("the scheduler checkpoint covers a flat scheduler only; a "
                         "hierarchical one (scheduler.hierarchical) is not checkpointed")
    return sched


class LiveCheckpoint:
    """The checkpoint of one live cluster (see the module docstring).

    Args:
        live: the cluster (its scheduler not started yet when :meth:`restore` runs).
        path: the checkpoint file (``checkpoint-PORT.json`` in the state directory).
        interval_s / min_gap_s: :class:`~dualpath_cli.runtime.checkpoint.Checkpointer`'s.
    """

    def __init__(self, live: Admissions, path: Path, interval_s: float = 0.25,
                 min_gap_s: float = 0.05) -> None:
        self.live = live
        self.path = path
        self.spool = ckpt.PromptSpool(path)
        self.restored: dict[str, Any] | None = None
        self.writer = ckpt.Checkpointer(path, self.collect, self.signature, interval_s,
                                        min_gap_s, after_write=self.spool.retire)

    def signature(self) -> tuple[Any, ...]:
        """Cheap: counters that move whenever something worth a checkpoint happens."""
        sched = _flat(self.live)
        joins = self.live.joins
        return (sched.next_request_id, len(sched.flights), sched.log.last_seq,
                sched.requeued, len(sched.dead_events), sched.revived, len(sched.engines),
                len(self.live.audit), self.live.aliases.version,
                joins.snapshot()["next_node"] if joins is not None else 0)

    def collect(self) -> dict[str, Any]:
        """Every section, consistent with each other (the live lock, then the scheduler's)."""
        live = self.live
        sched = _flat(live)

        def scheduler_and_keys() -> tuple[SchedulerState, list[dict[str, Any]]]:
            grabbed = ckpt.grab(sched)
            rids = {id(t): rid for rid, t in grabbed.tickets.items()}
            return grabbed, live.turn_keys.snapshot(rids)

        (grabbed, keys), sessions, next_agent = live.export_sessions(scheduler_and_keys)
        # the names (chatcmpl- ids, a client's x-request-id) of the turns it carries: after
        # a restart, explain and GET /api/v1/requests/{id} still find them by those
        aliases = live.aliases.export(grabbed.tickets)
        joins = live.joins
        return {"scheduler": ckpt.build(grabbed, self.spool),
                "live": {"sessions": [list(row) for row in sessions],
                         "next_agent": next_agent, "keys": keys, "aliases": aliases,
                         "flops_rate": live.system.flops_rate, "written": time.time()},
                "joins": joins.snapshot() if joins is not None else None}

    def restore(self) -> dict[str, Any] | None:
        """Load the checkpoint (if any) into the not yet started cluster; what came back.

        Raises:
            CheckpointError: unusable (moved aside; the message says where).
        """
        sections = ckpt.read(self.path)
        if sections is None:
            return None
        try:
            self.restored = self._restore(sections)
        except ckpt.CheckpointError as err:  # read, but it does not fit: keep it aside
            raise ckpt.set_aside(self.path, err) from None
        return self.restored

    def _restore(self, sections: dict[str, Any]) -> dict[str, Any]:
        live = self.live
        sched = _flat(live)
        try:
            state = sections["scheduler"]
            own = sections["live"]
        except KeyError as err:
            raise ckpt.CheckpointError(f"checkpoint {self.path} has no {err} section"
                                       ) from None
        joined = not live.opts.local_engines
        rebound = ckpt.rebind(sched, str(state.get("address", ""))) if joined else False
        done = ckpt.restore(sched, state, engines=joined, spool_dir=self.path.parent)
        old = str(state.get("spool", "")).rpartition("-")[2]
        if old.isdigit():  # the old generation stays until a checkpoint names the new one
            self.spool.gen = int(old) + 1
        joins = live.joins
        if joins is not None and sections.get("joins"):
            joins.restore(sections["joins"])
        tickets = sched.tickets()
        try:
            sessions = [(str(name), int(agent), int(turns))
                        for name, agent, turns in own["sessions"]]
            items = list(own["keys"])
            keys = live.import_sessions(sessions, int(own["next_agent"]), tickets.values(),
                                        lambda: live.turn_keys.restore(items, tickets))
            named = live.aliases.restore(own.get("aliases") or ())  # none: an older file
        except (KeyError, TypeError, ValueError) as err:
            raise ckpt.CheckpointError(f"checkpoint {self.path}: its live section does "
                                       f"not fit ({type(err).__name__}: {err})") from None
        return {**done.to_dict(), "keys": keys, "aliases": named,
                "control_port_kept": rebound,
                "age_s": round(time.time() - float(own.get("written", time.time())), 3)}

    def start(self) -> None:
        """Write one checkpoint now (the restored state, or the empty start), then follow."""
        self.writer.write_now()
        self.writer.start()

    def poke(self) -> None:
        """Something changed: write soon."""
        self.writer.poke()

    def stop(self, keep: bool) -> None:
        """Stop writing; ``keep`` False (a clean drain) removes the file: nothing is left
        to restore, and the next launch starts afresh."""
        self.writer.stop(final=keep)
        self.spool.close(remove=not keep)
        if not keep:
            try:
                self.path.unlink()
            except FileNotFoundError:
                pass
