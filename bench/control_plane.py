"""The control plane at the paper's scale: scheduler CPU with 1,152 emulated engines, joins.

Usage::

    python bench/control_plane.py [--json] [--parts cpu,inproc,join,hier] [--rate 2400]
        [--seconds 20] [--speed 10] [--hosts 4] [--pd 48P96D]

docs/benchmarks.md gives the commands its figures come from. Parts (``--json`` prints one
object with these keys):

* ``sched_cpu_cores_48p96d`` (part ``cpu``): a launcher-side
  :class:`~dualpath_cli.cluster.system.RuntimeSystem` with ``--pd`` x 8 emulated engines
  (:mod:`dualpath_cli.runtime.emulated`: the real wire protocol over real ZeroMQ sockets, time
  from the ds660b-on-hopper cost model, ``--speed`` emulated seconds per real second) in
  ``--hosts`` processes. A driver thread submits Table 2 64K agents' turns open-loop at
  ``--rate`` turns/s; every turn goes through the scheduler's queue, its DE and PE fetches
  (groups pull every ``--fetch``), its dispatches and the engines' reports, and the scheduler
  handles its messages in batches (``--batch-window``). Measured over ``--seconds`` after
  ``--warmup``: the scheduler thread's CPU, the CPU of ``submit()`` (its prefix lookup runs
  on the caller's thread) and the process's native threads (ZeroMQ's I/O thread and reaper,
  pyzmq's garbage-collector thread: ``native_threads_*``), per turn and per message.
  Goal: under 1 core at the paper's ~2,400 turns/s (the paper: under 10).

  Where the machine cannot reach 2,400 turns/s the value is extrapolated term by term and
  ``extrapolated`` says so: heartbeats and idle fetches at their rates at this scale; CPU per
  turn (``submit()``, ``first``, ``done``; working fetches, which carry the groups'
  read-queue reports, per decision) x 2,400; the loop around the handlers and the native
  threads, per message x the messages at 2,400 turns/s; the 50 ms sweeps as measured. The
  bench's own timing wrappers are taken out twice: their cost calibrated on a stand-in
  (``bench_wrapper_us_per_call``), and their excess in the run, measured by a second window
  of ``--seconds`` without them (``wrapper_excess_*``; ``unwrapped_window``,
  ``with_wrappers_cores_at_paper_rate``). ``--paper-batches`` lengthens the run's fetch
  period by 2,400 / ``--rate`` so each fetch carries the turns it would at the paper's rate.
  ``--pin launcher|scheduler`` (a diagnosis) keeps the emulator hosts off the first CPU;
  ``periodic_rates_reached`` under ~0.9 says their timers fell behind, and the fetch term
  then reads low.
* ``sched_cpu_inproc_48p96d`` (part ``inproc``): the same scheduler at the paper's arrival
  pattern without its wall-clock rate (see :func:`run_inproc`): CPU per turn of every
  receive and handler and of the scheduler's ZeroMQ threads; ``total_cores_at_paper_rate``.
  ``--inproc-start steady`` starts the agents drawn before the window at a turn drawn
  uniformly from their trajectories (the steady state's prompts, ~33K tokens on average)
  instead of their first (~14K).
* ``join_s`` (part ``join``): from a node's ``--join`` request to its engines serving (its
  engine processes started and imported before the request), and from a node's death (its
  engine processes SIGKILLed) to its in-flight turns re-queued (the scheduler's
  ``dead_events``), with real engines on loopback. Goal: under 2 s each.
* ``hier_vs_flat`` (part ``hier``): hierarchical vs flat scheduling in the simulator at
  ``--pd`` and ``--big-pd`` (480P960D): per shape, the wall time of every scheduling call
  (p50/p99, and per turn) and the simulated JCT of the same offline agents, flat and with
  the default sub-schedulers (12 at 48P96D, 120 at 480P960D).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import itertools
import json
import multiprocessing
import os
import platform
import sys
import tempfile
import threading
import time
import types
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import zmq

from dualpath_cli.cluster.system import RuntimeSystem
from dualpath_cli.config.model import parse_pd
from dualpath_cli.runtime.gctune import pace_gc_for_scheduler
from dualpath_cli.runtime.options import DEFAULT_BATCH_WINDOW_S, RuntimeOptions
from dualpath_cli.runtime.scheduler import SchedulerService
from dualpath_cli.runtime.turns import Ticket, TurnRequest
from dualpath_cli.transfer.base import Message
from dualpath_cli.workload.build import synthetic_trace
from dualpath_cli.workload.tokens import append_token_ids
from dualpath_cli.workload.trajectory import Trajectory

PAPER_RATE = 2400.0  # turns/s the paper's 48P96D serves (bench/scheduler.py, same figure)
GOAL_CORES = 1.0


def _thread_cpu(tid: int) -> float:
    """User + system CPU seconds of thread ``tid`` of this process."""
    for t in psutil.Process().threads():
        if t.id == tid:
            return t.user_time + t.system_time
    raise RuntimeError(f"thread {tid} is gone")


class Driver:
    """Open-loop turn arrivals at ``rate``/s from a pool of agents (one turn in flight each).

    An agent whose turn is done goes back to the idle pool with its context extended by the
    prompt's appended tokens and the generated ones (as ``runner.run_agents`` does); a new
    agent is taken from the trace when none is idle. Turns that could not be sent on time
    (the driver fell behind) are counted, not queued up.
    """

    def __init__(self, system: RuntimeSystem, trajectories: list[Trajectory],
                 rate: float, dtype: str = "uint32", steady: bool = False) -> None:
        self.system = system
        self.rate = rate
        self.dtype = np.dtype(dtype)  # of the prompts handed over (_handed_over)
        # steady: an agent drawn before the window starts at a turn drawn uniformly, its
        # context made as _context_before does (the steady state's prompt lengths)
        self.steady = steady
        self.measuring = False  # set when the window starts
        self.rng = np.random.default_rng(2)
        self.fresh = collections.deque(trajectories)
        # (trajectory, its next turn, the last prompt, the ticket that answered it): the
        # context is extended here, on the driver's thread, not in the done callback (which
        # runs on the scheduler's thread and would count as its CPU)
        self.idle: collections.deque[tuple[Trajectory, int, np.ndarray, Ticket | None]] = \
            collections.deque()
        self.lock = threading.Lock()
        self.submitted = self.completed = self.behind = self.first_turns = 0
        self.tokens_submitted = 0
        self.submit_cpu = 0.0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="driver", daemon=True)
        self.profile: Any = None  # a cProfile.Profile for submit() (--profile)

    def _next(self) -> tuple[Trajectory, int, np.ndarray] | None:
        with self.lock:
            item = self.idle.popleft() if self.idle else None
        if item is not None:
            traj, i, prompt, ticket = item
            assert ticket is not None and ticket.result is not None
            out = np.asarray(ticket.result.tokens, dtype=self.dtype)
            return traj, i, np.concatenate([prompt, out])
        if not self.fresh:
            return None
        traj = self.fresh.popleft()
        return (traj, *_arrival(traj, self.rng, self.steady and not self.measuring,
                                self.dtype))

    def _submit(self) -> bool:
        item = self._next()
        if item is None:
            return False
        traj, i, context = item
        turn = traj.turns[i]
        prompt = _handed_over(np.concatenate(
            [context, append_token_ids(traj, i, 256).astype(self.dtype)]))
        c0 = time.thread_time()
        req = TurnRequest(traj.agent_id, i, prompt, turn.gen)
        ticket = (self.profile.runcall(self.system.submit, req) if self.profile is not None
                  else self.system.submit(req))
        self.submit_cpu += time.thread_time() - c0  # the scheduler's lookup, on this thread
        self.submitted += 1
        self.first_turns += i == 0
        self.tokens_submitted += len(prompt)
        ticket.add_done_callback(lambda: self._done(ticket, traj, i, prompt))
        return True

    def _done(self, ticket: Ticket, traj: Trajectory, i: int, prompt: np.ndarray) -> None:
        with self.lock:
            self.completed += 1
            if ticket.result is None or i + 1 >= traj.num_turns:
                return
            self.idle.append((traj, i + 1, prompt, ticket))

    def _run(self) -> None:
        t0 = time.monotonic()
        sent = 0
        while not self.stop.is_set():
            due = int((time.monotonic() - t0) * self.rate)
            if due - sent > self.rate:  # more than a second behind: skip, count it
                self.behind += due - sent - int(self.rate)
                sent = due - int(self.rate)
            while sent < due and not self.stop.is_set():
                if not self._submit():
                    self.behind += 1
                sent += 1
            self.stop.wait(0.002)


def _flat(system: RuntimeSystem) -> SchedulerService:
    """The system's one scheduler (these parts run it flat, the default)."""
    sched = system.scheduler
    if not isinstance(sched, SchedulerService):
        raise SystemExit("bench/control_plane.py measures a flat scheduler "
                         "(scheduler.hierarchical is on)")
    return sched


def _count_kinds(sched: Any, profile: Any = None) -> dict[str, list[float]]:
    """Count the scheduler's messages by kind with the thread CPU each took (a wrapper on
    its handler: measurement only, same thread, same order). A fetch that finds nothing to
    do for its group is counted apart (``fetch_idle``): that is the periodic cost, the
    rest of a working fetch scales with the turns. ``sched``: the scheduler service, or a
    stand-in with the same attributes (:func:`_wrapper_costs`)."""
    handle = sched.on_message
    kinds: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])

    def moved() -> tuple[int, int, int, int]:
        return (sched.log.last_seq or 0, len(sched.queue), len(sched.pe_queue),
                sum(len(q) for q in sched.private.values()))

    def counted(raw: Any) -> None:
        kind = str(raw.header.get("t"))
        before = None
        if kind == "fetch":
            group = raw.header.get("group")
            busy = (bool(sched.pe_queue) if raw.header.get("role") == "prefill"
                    else bool(sched.queue) or bool(sched.private.get(group)))
            kind = "fetch" if busy else "fetch_idle"
            before = moved() if busy else None
        t = time.thread_time()
        if profile is not None:
            profile.runcall(handle, raw)
        else:
            handle(raw)
        spent = time.thread_time() - t
        if before is not None and moved() == before:
            kind = "fetch_futile"  # work queued, none of it could move (engines full)
        row = kinds[kind]
        row[0] += 1
        row[1] += spent

    sched.on_message = counted
    return kinds


def _count_loop(sched: Any) -> dict[str, list[float]]:
    """Count the scheduler loop's CPU outside the handlers (measurement only, same thread):
    ``recv`` (a message taken off the socket: the wait for it, frames, msgpack),
    ``recv_idle`` (a receive that found none: the non-blocking one that ends a batch, see
    ``scheduler.batch_window``, or one that timed out) and
    ``sweep`` (the heartbeat check and cost sample every 50 ms)."""
    rows: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    recv = sched.ep.recv

    def timed_recv(timeout: float | None = None) -> Any:
        t = time.thread_time()
        raw = recv(timeout)
        row = rows["recv" if raw is not None else "recv_idle"]
        row[0] += 1
        row[1] += time.thread_time() - t
        return raw

    def timed(name: str, fn: Any) -> Any:
        def call() -> Any:
            t = time.thread_time()
            out = fn()
            row = rows[name]
            row[0] += 1
            row[1] += time.thread_time() - t
            return out
        return call

    sched.ep.recv = timed_recv
    sched.on_sweep = timed("sweep", sched.on_sweep)
    return rows


def _per_call(fn: Any, n: int) -> float:
    t = time.thread_time()
    for _ in range(n):
        fn()
    return (time.thread_time() - t) / n


def _unwrap(sched: Any) -> list[int]:
    """Take :func:`_count_kinds`' and :func:`_count_loop`'s wrappers off ``sched`` (its
    loop's seams get the scheduler's own methods back) and count its messages only;
    returns the count's box.

    Why: each wrapped message reads the thread's CPU clock four times (a system call each)
    and passes two closures. On this VM that costs far more in the run than its
    calibration on a hot stand-in (:func:`_wrapper_costs`), so a window without them
    measures what the scheduler spends, and the difference per message is taken off."""
    sched.on_sweep = sched._sweep  # the loop's own, unwrapped
    sched.ep.__dict__.pop("recv", None)
    handle = sched._handle
    box = [0]

    def counted(raw: Any) -> None:
        box[0] += 1
        handle(raw)

    sched.on_message = counted
    return box


def _wrapper_costs(n_private: int, n: int = 20_000, reps: int = 7) -> dict[str, float]:
    """Thread CPU seconds the bench's own wrappers (:func:`_count_kinds`,
    :func:`_count_loop`) add to one call, beyond the call: the same wrappers around a no-op
    on a stand-in scheduler with as many private queues, minus the bare no-op (best of
    ``reps``). Run on this thread, after the window.

    Why: the cpu part charges what the scheduler thread spent beyond its handlers, receives
    and sweeps to the loop, per message; the wrappers' frames, dict updates, clock reads
    and (per working fetch) two sums over the private queues landed there too and were
    counted as the scheduler's. Only their whole cost beyond the bare call is subtracted:
    the part of a clock read that falls inside a timed interval stays counted.
    """
    def noop(*_: Any, **__: Any) -> None:
        return None

    stand_in = types.SimpleNamespace(
        on_message=noop, log=types.SimpleNamespace(last_seq=0),
        queue=collections.deque([0]), pe_queue=collections.deque(),
        private={g: collections.deque() for g in range(n_private)},
        ep=types.SimpleNamespace(recv=noop), on_sweep=noop)
    _count_kinds(stand_in)
    _count_loop(stand_in)
    plain, fetch = Message({"t": "done"}), Message({"t": "fetch", "group": 0, "role": "decode"})
    cases = {"recv": stand_in.ep.recv, "sweep": stand_in.on_sweep,
             "handler": lambda: stand_in.on_message(plain),
             "busy_fetch": lambda: stand_in.on_message(fetch)}  # work queued: moved() twice
    best = {k: float("inf") for k in cases}
    for _ in range(reps):
        base = _per_call(lambda: noop(plain), n)
        for k, fn in cases.items():
            best[k] = min(best[k], _per_call(fn, n) - base)
    return {k: max(0.0, v) for k, v in best.items()}


def run_cpu(args: argparse.Namespace) -> dict[str, Any]:
    """Part ``cpu``: the scheduler thread's cores with emulated engines over real sockets."""
    spec = parse_pd(args.pd)
    p, d = spec.prefill_nodes, spec.decode_nodes
    # --paper-batches: a longer period at a lower rate, the same turns per fetch as the
    # paper's rate at --fetch (at this machine's rate a fetch at --fetch carries about one
    # turn and pays its fixed costs alone; the paper's carry 2.5-5)
    batched = args.paper_batches and args.rate < PAPER_RATE
    fetch_s = args.fetch * PAPER_RATE / args.rate if batched else args.fetch
    # the store on tmpfs when there is one: marker files cost ~60 us there, ms on a busy disk
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(prefix="dualpath-cp-", dir=shm) as tmp:
        opts = RuntimeOptions(
            prefill_nodes=p, decode_nodes=d, gpus_per_node=8, engines="emulated",
            emulated_hosts=args.hosts, emulated_speed=args.speed, store_dir=Path(tmp),
            block_tokens=64, heartbeat_s=args.heartbeat, fetch_s=fetch_s,
            heartbeat_timeout=args.heartbeat_timeout, decision_ring=1000,
            prefix_cache_tokens=args.prefix_cache_tokens, batch_window_s=args.batch_window)
        t0 = time.monotonic()
        system = RuntimeSystem(opts)
        try:
            system.start(timeout=300)
            start_s = time.monotonic() - t0
            pinned = _pin(system, args.pin) if args.pin else None
            # a scheduler that has run a while has a connection to every engine; without
            # this the window pays for ZeroMQ connects to the engines it first dispatches to
            sched = _flat(system)
            sched.metrics(fresh=True, timeout=120)
            n_agents = args.agents or max(200, int(args.rate * 4))
            trace = synthetic_trace(64_000, n_agents, seed=1)
            driver = Driver(system, list(trace.trajectories), args.rate, args.prompt_dtype,
                            steady=args.cpu_start == "steady")
            tid = sched._thread.native_id  # the thread we measure
            assert tid is not None
            profile = None
            if args.profile:
                import cProfile

                # CPU, not waits; one profiler per thread (the clock is the thread's)
                profile = cProfile.Profile(time.thread_time)
                driver.profile = cProfile.Profile(time.thread_time)
            kinds = _count_kinds(sched, profile)
            loop = _count_loop(sched)
            proc = psutil.Process()
            driver.thread.start()
            time.sleep(args.warmup)  # the bench's measurement window, not a race
            native = _native_threads(proc)  # those started in the warm-up included
            driver.measuring = True
            kinds.clear()
            loop.clear()
            c0, p0, w0 = _thread_cpu(tid), proc.cpu_times(), time.monotonic()
            io0 = _threads_cpu(native)
            d0, s0, k0 = driver.completed, driver.submitted, driver.tokens_submitted
            u0 = driver.submit_cpu
            q0 = sched.log.last_seq
            f0, r0 = driver.first_turns, sched.requeued
            h0 = (sched._prefix.reused, sched._prefix.hashed)
            time.sleep(args.seconds)
            c1, p1, w1 = _thread_cpu(tid), proc.cpu_times(), time.monotonic()
            io1 = _threads_cpu(native)
            by_kind = {k: (n, cpu) for k, (n, cpu) in kinds.items()}
            by_loop = {k: (n, cpu) for k, (n, cpu) in loop.items()}
            d1, s1, k1 = driver.completed, driver.submitted, driver.tokens_submitted
            u1 = driver.submit_cpu
            q1 = sched.log.last_seq
            f1, r1 = driver.first_turns, sched.requeued
            h1 = (sched._prefix.reused, sched._prefix.hashed)
            # a second window with the timing wrappers taken off (the loop looks its
            # receive and handler up per message): only the messages are counted
            plain = _unwrap(sched)
            c2, w2, io2 = _thread_cpu(tid), time.monotonic(), _threads_cpu(native)
            d2, u2 = driver.completed, driver.submit_cpu
            time.sleep(args.seconds)
            c3, w3, io3 = _thread_cpu(tid), time.monotonic(), _threads_cpu(native)
            d3, u3, n_plain = driver.completed, driver.submit_cpu, plain[0]
            driver.stop.set()
            driver.thread.join(5)
            if profile is not None:  # diagnosis only: profiling inflates the CPU figures
                profile.dump_stats(args.profile)
                driver.profile.dump_stats(args.profile + ".submit")
            hosts = [psutil.Process(pid) for pid in system.cluster.host_pids()]  # type: ignore[union-attr]
            host_cpu = sum(h.cpu_times().user + h.cpu_times().system for h in hosts)
            dead = sum(1 for e in sched.engines.values() if not e.alive)
            view = system.view()
            n_private = len(sched.private)
        finally:
            system.close()
    wrap = _wrapper_costs(n_private)  # the cluster gone: the calibration runs undisturbed
    wall = w1 - w0
    thread_cpu = c1 - c0
    cpu = thread_cpu + (u1 - u0)  # the scheduler thread plus submit()'s prefix lookups
    done = d1 - d0
    rate = done / wall
    cpu_per_done = cpu / done if done else float("nan")
    proc_cpu = (p1.user + p1.system) - (p0.user + p0.system)
    reached = rate >= 0.95 * PAPER_RATE
    # the extrapolation, term by term: engine traffic at its own rates (it does not depend
    # on the turn rate), turn traffic at the paper's turn rate
    cpu_of = {k: cpu / n for k, (n, cpu) in by_kind.items() if n}
    n_engines = len(view.engines)
    groups = p + d
    # periodic: every engine's heartbeat and every group's fetch at the idle fetch's cost
    idle_fetch = cpu_of.get("fetch_idle", cpu_of.get("fetch", 0.0))
    periodic = (cpu_of.get("hb", 0.0) * n_engines / args.heartbeat
                + idle_fetch * groups / args.fetch)
    # a fetch that found work queued but could move none of it (its engines full): at most
    # one per group per period whatever the turn rate; its CPU beyond an idle fetch's is
    # added as measured, not scaled with the turns
    n_futile, c_futile = by_kind.get("fetch_futile", (0, 0.0))
    # (per period: the paper's periods are fetch_s / --fetch times as many as this run's)
    futile = max(0.0, c_futile - n_futile * idle_fetch) / wall * fetch_s / args.fetch
    periodic += futile
    # the loop around the handlers: every message is received (wait, frames, msgpack) and
    # passes the loop (the lock, a clock read); the sweeps run every 50 ms whatever the
    # rate. What the thread spent beyond handlers, receives and sweeps is loop overhead,
    # charged per message received (an upper bound: part of it is idle waiting), and so
    # are the receives that timed out (none at this rate: a blocking receive waits)
    n_recv, c_recv = by_loop.get("recv", (0, 0.0))
    n_idle, c_idle = by_loop.get("recv_idle", (0, 0.0))
    n_sweep, c_sweep = by_loop.get("sweep", (0, 0.0))
    handled = sum(c for _, c in by_kind.values())
    # the bench's own wrappers, per call as calibrated, are not the scheduler's
    n_busy = sum(by_kind.get(k, (0, 0.0))[0] for k in ("fetch", "fetch_futile"))
    n_wrapped = sum(n for n, _ in by_kind.values())
    wrappers = (wrap["recv"] * (n_recv + n_idle) + wrap["sweep"] * n_sweep
                + wrap["handler"] * (n_wrapped - n_busy) + wrap["busy_fetch"] * n_busy)
    rest = max(0.0, thread_cpu - handled - c_recv - c_idle - c_sweep - wrappers)
    per_msg = (c_recv + c_idle + rest) / n_recv if n_recv else 0.0
    sweeps = c_sweep / wall
    n_msgs = sum(n for n, _ in by_kind.values())
    n_periodic = sum(by_kind.get(k, (0, 0.0))[0]
                     for k in ("hb", "fetch_idle", "fetch", "fetch_futile"))
    turn_msgs = (n_msgs - n_periodic) / done if done else 0.0  # first, done, rq...
    # at the paper's rate: every engine's heartbeat, every group's fetch (a group fetches
    # once per period, working or idle) and each turn's own messages
    msgs_at_paper = (n_engines / args.heartbeat + groups / args.fetch
                     + turn_msgs * PAPER_RATE)
    loop_cores = sweeps + per_msg * msgs_at_paper
    # the process's native threads (ZeroMQ's I/O thread: receiving, sending, waking the
    # loop), per message received, x the messages at the paper's rate
    io_cpu = io1 - io0
    io_cores = io_cpu / n_msgs * msgs_at_paper if n_msgs else 0.0
    # per turn: one submit() (its prefix lookup, on the caller's thread), one ``first`` and
    # one ``done`` each at its own mean; per decision (a dispatched attempt: a turn has one
    # unless re-queued) the working fetches' CPU beyond an idle one's and the read-queue
    # reports and any other kind. Each normalised by its own count, so turns dispatched or
    # finished outside the window do not skew it (a loaded host finishes few in it).
    decisions = (q1 or 0) - (q0 or 0)
    n_fetch, c_fetch = by_kind.get("fetch", (0, 0.0))
    per_turn: dict[str, float] = {"submit": (u1 - u0) / max(1, s1 - s0)}
    for k in ("first", "done"):
        if k in cpu_of:
            per_turn[k] = cpu_of[k]
    if decisions:
        per_turn["fetch (beyond idle), per decision"] = max(
            0.0, c_fetch - n_fetch * idle_fetch) / decisions
        for k, (_, c) in by_kind.items():
            if k not in ("hb", "fetch_idle", "fetch", "fetch_futile", "hello", "first",
                         "done"):
                per_turn[f"{k}, per decision"] = c / decisions
    per_turn_us = {k: round(1e6 * v, 1) for k, v in per_turn.items()}
    per_turn_total = sum(per_turn.values()) if decisions and done else float("nan")
    wrapped = periodic + per_turn_total * PAPER_RATE + loop_cores + io_cores
    # the wrappers' cost beyond their calibration, per message: the wrapped window's
    # thread CPU a message (calibration taken off) less the unwrapped window's. It comes
    # second, so the agents' contexts are no shorter there; at its rate turns' messages
    # (dearer than heartbeats) are no rarer: both make the difference, and the correction,
    # no larger than it is (a few more messages sharing a wake-up there works the other
    # way, ~0.1 us a message at most). submit()'s own clock reads (two a turn) stay counted
    wall_plain = w3 - w2
    cpu_plain = c3 - c2
    per_msg_wrapped = (thread_cpu - wrappers) / n_msgs if n_msgs else 0.0
    per_msg_plain = cpu_plain / n_plain if n_plain else per_msg_wrapped
    excess = max(0.0, per_msg_wrapped - per_msg_plain)
    extrapolated = wrapped - excess * msgs_at_paper
    rate_plain = (d3 - d2) / wall_plain
    reached = reached and rate_plain >= 0.95 * PAPER_RATE
    cores = ((cpu_plain + u3 - u2 + io3 - io2) / wall_plain if reached else extrapolated)
    lower_bound = not reached and not done  # no turn completed: the turn term is unknown
    if lower_bound:
        cores = periodic
    return {
        "value": round(cores, 3), "goal": GOAL_CORES, "met": cores < GOAL_CORES,
        "extrapolated": not reached, "lower_bound": lower_bound,
        "how": ("measured at the paper's rate" if reached else
                "heartbeat and idle-fetch CPU per message x their rates at this scale + CPU "
                "per turn (submit, first and done at their means; working fetches beyond an "
                "idle one's, which carry the groups' read-queue reports, and any report "
                f"sent directly, per decision) x {PAPER_RATE:g} turns/s + the "
                "loop's receive and overhead per message x the messages at that rate + the "
                "sweeps as measured + the native (ZeroMQ) threads' CPU per message x the "
                "messages at that rate - the timing wrappers' cost per message beyond "
                "their calibration (a second window without them) x the messages at that "
                f"rate (this machine reached {rate:.1f} turns/s)"),
        "engines": len(view.engines), "pd": args.pd, "hosts": args.hosts,
        "speed": args.speed, "heartbeat_s": args.heartbeat, "fetch_s": args.fetch,
        "fetch_s_run": round(fetch_s, 3), "paper_batches": batched,
        "batch_window_s": args.batch_window,
        "decisions_per_working_fetch": round(decisions / max(1, n_fetch), 2),
        # the engines' own timers, as run against as configured: below ~0.9 the emulator
        # hosts fell behind (too few CPUs left to them, e.g. with --pin), and their fetches
        # then carry more turns than the paper's (the fetch term per decision reads low)
        "periodic_rates_reached": {
            "fetch": round(sum(by_kind.get(k, (0, 0.0))[0] for k in (
                "fetch", "fetch_idle", "fetch_futile")) / wall / (groups / fetch_s), 3),
            "hb": round(by_kind.get("hb", (0, 0.0))[0] / wall / (n_engines / args.heartbeat),
                        3)},
        "target_rate": args.rate, "measured_rate": round(rate, 1),
        "submitted_rate": round((s1 - s0) / wall, 1),
        "decisions_per_s": round(decisions / wall, 1),
        "mean_prompt_tokens": round((k1 - k0) / max(1, s1 - s0)), "start": args.cpu_start,
        "pin": pinned,
        "sched_thread_cores": round(thread_cpu / wall, 3),
        "cpu_us_per_message": {k: round(1e6 * v, 1) for k, v in cpu_of.items()},
        "cpu_us_per_turn": per_turn_us,
        "extrapolated_cores_at_paper_rate": round(extrapolated, 3),
        "agents": n_agents,
        "first_turn_share": round((f1 - f0) / max(1, s1 - s0), 3),
        "prefix_blocks_reused_share": round((h1[0] - h0[0]) / max(1, (h1[0] - h0[0])
                                                                 + (h1[1] - h0[1])), 3),
        "requeued_in_window": r1 - r0,
        "messages_per_s": {k: round(n / wall, 1) for k, (n, _) in by_kind.items()},
        "periodic_cores_at_paper_scale": round(periodic, 3),
        "loop_cores_at_paper_rate": round(loop_cores, 3),
        "native_threads": len(native),
        "native_threads_us_per_message": round(1e6 * io_cpu / max(1, n_msgs), 1),
        "native_threads_cores_at_paper_rate": round(io_cores, 3),
        "with_wrappers_cores_at_paper_rate": round(wrapped, 3),
        "wrapper_excess_us_per_message": round(1e6 * excess, 1),
        "wrapper_excess_cores_at_paper_rate": round(excess * msgs_at_paper, 3),
        "unwrapped_window": {
            "turns_per_s": round(rate_plain, 1), "messages_per_s": round(n_plain / wall_plain),
            "sched_thread_cores": round(cpu_plain / wall_plain, 3),
            "submit_cores": round((u3 - u2) / wall_plain, 3),
            "native_threads_cores": round((io3 - io2) / wall_plain, 3),
            "thread_us_per_message": round(1e6 * per_msg_plain, 1)},
        "wrapped_thread_us_per_message": round(1e6 * per_msg_wrapped, 1),
        "loop_us_per_message": {"recv": round(1e6 * c_recv / max(1, n_recv), 1),
                                "other": round(1e6 * rest / max(1, n_recv), 1)},
        "bench_wrapper_us_per_call": {k: round(1e6 * v, 2) for k, v in wrap.items()},
        "bench_wrapper_cores_subtracted": round(wrappers / wall, 4),
        "sweep_cores": round(sweeps, 4),
        "idle_poll_cores": round(c_idle / wall, 4),
        "messages_per_s_at_paper_rate": round(msgs_at_paper),
        "futile_fetch_cores": round(futile, 3),
        "cpu_ms_per_turn_at_paper_rate": round(1000 * per_turn_total, 3),
        "submit_cores": round((u1 - u0) / wall, 3),
        "sched_cores_at_measured_rate": round(cpu / wall, 3),
        "sched_cpu_ms_per_turn": round(1000 * cpu_per_done, 3),
        "launcher_process_cores": round(proc_cpu / wall, 3),
        "emulator_cpu_s_total": round(host_cpu, 1), "behind": driver.behind,
        "dead_engines": dead, "start_s": round(start_s, 1), "window_s": round(wall, 1),
    }


def _pin(system: RuntimeSystem, how: str) -> dict[str, Any]:
    """Keep the emulated cluster off the scheduler's CPU (``--pin``), for a diagnosis.

    On a machine of a few CPUs the emulator hosts (about a core here) share every CPU with
    the scheduler, so its CPU time includes what sharing costs it (caches refilled after
    their slices, migrations, cross-CPU wake-ups): a deployment runs its engines on other
    nodes. ``launcher``: this process's threads (scheduler, driver, ZeroMQ) on the first
    CPU, the hosts' on the others; ``scheduler``: the scheduler thread alone on the first
    CPU, every other thread on the others. Returns the CPUs given to each."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("--pin needs at least 2 CPUs")
    first, rest = {cpus[0]}, set(cpus[1:])
    sched_tid = _flat(system)._thread.native_id
    for pid in system.cluster.host_pids():  # type: ignore[union-attr]
        for t in psutil.Process(pid).threads():
            _set_cpus(t.id, rest)
    # threads started later (the driver) take the main thread's CPUs
    for t in psutil.Process().threads():
        _set_cpus(t.id, first if how == "launcher" or t.id == sched_tid else rest)
    return {"how": how, "first_cpu": cpus[0], "other_cpus": sorted(rest)}


def _native_threads(proc: psutil.Process) -> set[int]:
    """The threads no Python code of ours runs on, all charged to the scheduler: ZeroMQ's
    (the sockets' TCP work and signalling), any library pool, and pyzmq's garbage-collector
    thread (a Python thread, but it only releases the zero-copy frames the scheduler's sends
    hand to ZeroMQ: a prompt of more than 64 KB, a first turn's)."""
    ours = {th.native_id for th in threading.enumerate()
            if type(th).__name__ != "GarbageCollectorThread"}
    return {t.id for t in proc.threads()} - ours


def _set_cpus(tid: int, cpus: set[int]) -> None:
    """Pin thread ``tid`` to ``cpus`` (one that ended meanwhile is skipped)."""
    try:
        os.sched_setaffinity(tid, cpus)
    except ProcessLookupError:
        pass


def _threads_cpu(ids: set[int]) -> float:
    """User + system CPU seconds of this process's threads ``ids`` (those still running)."""
    return sum(t.user_time + t.system_time for t in psutil.Process().threads() if t.id in ids)


def _drain_sinks(conn: Any, n: int) -> None:
    """The inproc part's engine mailboxes: ``n`` endpoints, their addresses sent on
    ``conn``, drained until ``conn`` says stop (a process of their own)."""
    from dualpath_cli.transfer import ZmqFabric

    sinks = [ZmqFabric().endpoint("sink") for _ in range(n)]
    conn.send([s.address for s in sinks])
    while not conn.poll(0):
        for s in sinks:
            while s.recv(timeout=0.01) is not None:
                pass
    for s in sinks:
        s.close()


def _handed_over(prompt: np.ndarray) -> np.ndarray:
    """``prompt`` as a front end hands it to ``submit()``: a new array, read-only (the live
    service's ``token_ids``: uint32, which the scheduler keeps without a copy; with
    ``--prompt-dtype int64`` it converts it, as it did before the front end made uint32)."""
    prompt.flags.writeable = False
    return prompt


def _arrival(traj: Trajectory, rng: np.random.Generator, mid: bool,
             dtype: np.dtype[Any]) -> tuple[int, np.ndarray]:
    """A new agent's first turn here and its context: its trajectory's first, or (``mid``:
    the steady state's population, there before the window) a turn drawn uniformly; an
    agent arriving in the window starts at its first turn."""
    i = int(rng.integers(traj.num_turns)) if mid else 0
    return i, _context_before(traj, i, dtype)


def _context_before(traj: Trajectory, i: int, dtype: np.dtype[Any]) -> np.ndarray:
    """Turn ``i``'s context as the inproc part's turns grow it: every earlier turn's
    appended tokens and its output (``gen`` tokens from 1000, what its ``done`` carries)."""
    parts = [np.zeros(0, dtype=dtype)]
    for j in range(i):
        parts.append(append_token_ids(traj, j, 256).astype(dtype))
        parts.append(np.arange(1000, 1000 + traj.turns[j].gen, dtype=dtype))
    return np.concatenate(parts)


def run_inproc(args: argparse.Namespace) -> dict[str, Any]:
    """Part ``inproc``: the scheduler's handlers at the paper's arrival pattern, in process.

    The machine cannot drive 2,400 turns/s over sockets, so at its rate each working fetch
    carries about one turn and pays its fixed costs alone. Here the bench thread plays the
    engines and calls the scheduler's handler itself (the scheduler's own thread is not
    started), so the pattern of the paper's rate is reproduced without its wall-clock
    rate: per ``--fetch`` period, ``--rate`` x period turns are submitted, interleaved with
    one fetch from every group (each DE group's and PE group's leader, in a fixed shuffled
    order), each dispatched turn's ``rq`` reports (one per engine it charged with a read,
    as the read ends, carried on its group's next fetch as the leader carries them) and
    ``first`` one period later and its ``done`` ``--inproc-latency``
    periods later (its blocks then stored, as an
    emulated DE does, which its ``done`` says), and every engine's heartbeat once per
    ``--inproc-heartbeat``; agents from the Table 2 64K trace (one turn in flight each).
    The engines' messages are sent to the scheduler's real socket and received from it
    (each slot's in order, after the slot: the first receive may wait for the I/O thread);
    the scheduler's sends go to sink endpoints drained in another process. Measured: thread
    CPU of each receive and handler over ``--inproc-rounds`` periods after
    ``--inproc-warmup`` (every agent has had its first turns by then), per turn, plus the
    CPU of the scheduler's ZeroMQ context threads over the same window.
    """
    from dualpath_cli.core.layout import BlockShape, Namespace, chain_keys
    from dualpath_cli.core.policies import SchedParams
    from dualpath_cli.runtime.wire import (
        Done,
        Fetch,
        First,
        Heartbeat,
        Hello,
        encode,
    )
    from dualpath_cli.storage import PosixStore
    from dualpath_cli.telemetry.registry import MetricsRegistry
    from dualpath_cli.transfer import ZmqFabric
    from dualpath_cli.transfer.zmq_fabric import ZmqEndpoint

    spec = parse_pd(args.pd)
    p, d, gpus = spec.prefill_nodes, spec.decode_nodes, 8
    opts = RuntimeOptions(prefill_nodes=p, decode_nodes=d, gpus_per_node=gpus,
                          block_tokens=64, decision_ring=1000)
    latency = max(2, args.inproc_latency)
    fabric = ZmqFabric()
    fabric._ctx = zmq.Context()  # the scheduler's own: its I/O thread is measured
    # the engines' mailboxes drain in another process, as engines do: threads of this
    # one would take the GIL and the cache from the measured thread (sends cost 2x)
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    sink_proc = ctx.Process(target=_drain_sinks, args=(child, 4), daemon=True)
    sink_proc.start()
    if not parent.poll(60):
        raise RuntimeError("the sink process did not start within 60 s")
    sink_addresses: list[str] = parent.recv()
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    tmp = tempfile.TemporaryDirectory(prefix="dualpath-cp-", dir=shm)
    try:
        # the cpu part's scheduler: same thresholds, HBM and block size (64 tokens)
        ns = Namespace("emulated-ds660b", "layer_major", BlockShape(61, 64, 1152))
        store = PosixStore(tmp.name, registry=MetricsRegistry())
        threads_before = {t.id for t in psutil.Process().threads()}
        sched = SchedulerService(fabric, store, ns, opts.policy, SchedParams(
            alpha=opts.alpha, beta=opts.beta, z_factor=opts.z_factor, block_tokens=64),
            opts.hbm_blocks * 64, heartbeat_timeout=1e9, decision_ring=1000,
            prefix_cache_tokens=args.prefix_cache_tokens)
        roles: dict[int, tuple[str, int]] = {}
        eid = 0
        for role, nodes in (("prefill", range(p)), ("decode", range(p, p + d))):
            for node in nodes:
                for _ in range(gpus):
                    sched.register(eid, role, node, node)
                    roles[eid] = (role, node)
                    eid += 1

        def message(m: Any) -> Message:
            header, frames = encode(m)
            return Message(header, frames)

        with sched._lock:
            for e, (role, node) in roles.items():
                sched._handle(message(Hello(
                    e, sink_addresses[e % len(sink_addresses)], role, node, node,
                    os.getpid())))
        leader = {(role, node): e for e, (role, node) in sorted(roles.items(), reverse=True)}
        per_period = args.rate * args.fetch
        trace = synthetic_trace(64_000, int(per_period * (latency + 2) * 1.1), seed=1)
        fresh = collections.deque(trace.trajectories)
        start_rng = np.random.default_rng(2)
        dtype = np.dtype(args.prompt_dtype)
        idle: collections.deque[tuple[Trajectory, int, np.ndarray]] = collections.deque()
        cpu: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
        counts = {"turns": 0, "first_turns": 0, "tokens": 0}
        measuring = False
        events: dict[int, list[tuple[str, Any]]] = collections.defaultdict(list)
        turns: dict[int, tuple[Trajectory, int, np.ndarray]] = {}
        stored: dict[int, tuple[int, Any]] = {}  # agent -> (blocks stored, last key)
        dispatched: set[int] = set()
        rq_n: collections.Counter[int] = collections.Counter()

        profile = None
        if args.profile:  # diagnosis only: the measured calls under cProfile (thread CPU)
            import cProfile

            profile = cProfile.Profile(time.thread_time)

        def timed(kind: str, fn: Any, *a: Any) -> None:
            t = time.thread_time()
            if measuring and profile is not None:
                profile.runcall(fn, *a)
            else:
                fn(*a)
            if measuring:
                row = cpu[kind]
                row[0] += 1
                row[1] += time.thread_time() - t

        def store_blocks(keys: list[Any]) -> None:  # marker files, as an emulated DE writes
            for k in keys:
                path = store.path(k)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.touch()

        def submit() -> None:
            if idle:
                traj, i, ctx = idle.popleft()
            elif fresh:
                traj = fresh.popleft()
                i, ctx = _arrival(traj, start_rng, args.inproc_start == "steady"
                                  and not measuring, dtype)
            else:
                return
            prompt = _handed_over(np.concatenate(
                [ctx, append_token_ids(traj, i, 256).astype(dtype)]))
            rid = sched.next_request_id
            timed("submit", sched.submit, TurnRequest(traj.agent_id, i, prompt,
                                                      traj.turns[i].gen))
            turns[rid] = (traj, i, prompt)
            if measuring:
                counts["turns"] += 1
                counts["first_turns"] += i == 0
                counts["tokens"] += len(prompt)

        # ZeroMQ's threads of the scheduler's context (its sockets' TCP work: the I/O thread;
        # the reaper), started with its first socket: the scheduler's CPU too
        io_threads = {t.id for t in psutil.Process().threads()} - threads_before
        # the engines' side, sending to the scheduler, on a context (I/O thread) of its own
        engines_ep = ZmqEndpoint(zmq.Context())

        def receive_and_handle() -> None:
            raw = sched.ep.recv(timeout=30)  # a wait is not CPU: only the receive counts
            if raw is None:
                raise RuntimeError("a message to the scheduler did not arrive in 30 s")
            sched._handle(raw)

        pending: list[tuple[str, Any]] = []
        grown: dict[int, np.ndarray] = {}  # rid -> its prompt and output: the next context

        def deliver(kind: str, m: Any) -> None:
            """An engine sends ``m`` (not timed); :func:`flush` receives and handles it."""
            if kind == "done":  # the DE stored the turn's blocks before it said done
                traj, i, prompt = turns[m.rid]
                full = grown[m.rid] = np.concatenate(
                    [prompt, np.asarray(m.tokens, dtype=dtype)])
                n, last = stored.get(traj.agent_id, (0, None))
                new = chain_keys(full[:-1], ns, last, n)
                store_blocks(new)
                if new:
                    stored[traj.agent_id] = (n + len(new), new[-1])
                # as an emulated DE says: the turn's full blocks are stored from the first
                m = dataclasses.replace(m, stored=stored[traj.agent_id][0])
            header, frames = encode(m)
            engines_ep.send(sched.ep.address, header, frames)
            pending.append((kind, m))

        def flush() -> None:
            """The scheduler's thread takes what the engines sent since the last flush, in
            order, from its real socket: the receive, msgpack and frames are counted with
            each handler, as on that thread (messages that queued up meanwhile are there at
            once, as at the paper's rate)."""
            for kind, m in pending:
                with sched._lock:
                    timed(kind, receive_and_handle)
                if kind == "done":  # the agent's next turn
                    traj, i, _ = turns.pop(m.rid)
                    full = grown.pop(m.rid)
                    if i + 1 < traj.num_turns:
                        idle.append((traj, i + 1, full))
            pending.clear()

        def after_fetch(period: int) -> None:
            for f in list(sched.flights.values()):
                if f.pe >= 0 and f.rid not in dispatched:
                    dispatched.add(f.rid)
                    # an engine charged with a read reports its queue when the read ends
                    for e in dict.fromkeys(eid for eid, _ in f.charges):
                        events[period + 1].append(
                            ("rq", (e, sched.engines[e].next_seq - 1)))
                    events[period + 1].append(("first", First(f.pe, f.rid, f.att, 7, 0.0)))
                    out = tuple(range(1000, 1000 + f.req.gen))
                    events[period + latency].append(
                        ("done", Done(f.de, f.rid, f.att, out, 0, 0.0)))

        fetchers = ([("decode", n) for n in range(p, p + d)]
                    + [("prefill", n) for n in range(p)])
        order = [fetchers[i] for i in np.random.default_rng(0).permutation(len(fetchers))]
        hb_owed = 0.0
        # (role, group) -> engine -> its newest queue report, for the leader's next fetch
        kept: dict[tuple[str, int], dict[int, tuple[int, ...]]] = collections.defaultdict(dict)
        hb_cycle = itertools.cycle(sorted(roles))
        hb_hits = ((0, 64, 0),) * ns.shape.n_layers  # a PE's per-layer hits, as a real one sends
        io_cpu = 0.0
        hashed0 = 0
        for period in range(args.inproc_warmup + args.inproc_rounds):
            measuring = period >= args.inproc_warmup
            if period == args.inproc_warmup:
                io_cpu = -_threads_cpu(io_threads)
                hashed0 = sched._prefix.hashed
            due = events.pop(period, [])
            owed, k = 0.0, 0
            for slot, (role, node) in enumerate(order):
                owed += per_period / len(order)
                while owed >= 1:
                    submit()
                    owed -= 1
                while k < len(due) and k < (slot + 1) * len(due) / len(order):
                    kind, m = due[k]
                    k += 1
                    if kind == "rq":  # kept by the group's leader for its next fetch
                        e, seen = m
                        rq_n[e] += 1
                        engine = sched.engines[e]
                        kept[(engine.role, engine.group)][e] = (e, rq_n[e], seen, 0)
                        continue
                    deliver(kind, m)
                hb_owed += len(roles) * args.fetch / args.inproc_heartbeat / len(order)
                while hb_owed >= 1:  # every engine's heartbeat, spread over the period
                    e = next(hb_cycle)
                    rq_n[e] += 1
                    engine = sched.engines[e]
                    deliver("heartbeat", Heartbeat(
                        e, rq_n[e], engine.seen, 0, uptime_s=period * args.fetch,
                        jobs=1, hbm_capacity_blocks=opts.hbm_blocks,
                        layer_hits=hb_hits if engine.role == "prefill" else ()))
                    hb_owed -= 1
                reports = tuple(kept.pop((role, node), {}).values())
                deliver("fetch_" + role, Fetch(leader[(role, node)], node, role, reports))
                flush()
                after_fetch(period)
        io_cpu += _threads_cpu(io_threads)
        if profile is not None:
            profile.dump_stats(args.profile)
        in_flight = len(sched.flights)
        present = (sched._present.trusted, sched._present.checked)
        hashed = sched._prefix.hashed - hashed0
        sched.ep.close()
        engines_ep.close()
    finally:
        parent.send("stop")
        sink_proc.join(10)
        if sink_proc.is_alive():
            sink_proc.kill()
        tmp.cleanup()
    n = counts["turns"]
    per_turn = {k: c / max(1, n) for k, (_, c) in cpu.items()}
    total = sum(per_turn.values())
    return {
        "rate_pattern": args.rate, "periods": args.inproc_rounds, "turns": n,
        "cpu_us_per_turn": {k: round(1e6 * v, 1) for k, v in sorted(per_turn.items())},
        "cpu_us_per_message": {k: round(1e6 * c / max(1, m), 1)
                               for k, (m, c) in sorted(cpu.items())},
        "messages_per_turn": {k: round(m / max(1, n), 2) for k, (m, _) in sorted(cpu.items())},
        "handler_us_per_turn": round(1e6 * total, 1),
        "handler_cores_at_paper_rate": round(total * PAPER_RATE, 3),
        "zmq_io_us_per_turn": round(1e6 * io_cpu / max(1, n), 1),
        "zmq_io_threads": len(io_threads),
        "total_cores_at_paper_rate": round((total + io_cpu / max(1, n)) * PAPER_RATE, 3),
        "first_turn_share": round(counts["first_turns"] / max(1, n), 3),
        "mean_prompt_tokens": round(counts["tokens"] / max(1, n)),
        "in_flight_at_end": in_flight, "blocks_trusted_checked": list(present),
        "start": args.inproc_start, "prefix_blocks_hashed_per_turn": round(hashed / max(1, n), 1),
        "how": ("thread CPU of submit() and of every message's receive from the "
                "scheduler's socket and handling, per turn, at the paper's arrival pattern "
                "(all groups fetching once per period, every engine's heartbeat once per "
                "--inproc-heartbeat), the engines' mailboxes drained in another process"),
    }


def run_join(args: argparse.Namespace) -> dict[str, Any]:
    """Part ``join``: ``--join`` to serving, and a node's death to its turns re-queued.

    In this process: a scheduler alone (``launch --role scheduler``'s system, 1 s heartbeat
    timeout) behind its HTTP API, and node agents (what ``launch --role ... --join`` runs)
    joining it with the token; each node's engines are real engine processes. Join: from
    the join request to every engine of the node ready in the scheduler; the node agent
    starts its engine processes and waits for their imports first (``NodeAgent.prepare``,
    reported apart as ``engine_start_s``, and with the join as ``start_and_join_s``).
    Death: the decode node serving turns is SIGKILLed (its engine processes), and the time
    until the scheduler declares its engines dead and re-queues their turns is read from
    its ``dead_events``.
    """
    from dualpath_cli.api.app import create_app
    from dualpath_cli.api.auth import TokenAuth
    from dualpath_cli.api.server import ServerThread
    from dualpath_cli.runtime.workloads import agentic_workload
    from dualpath_cli.services.live import LiveCluster
    from dualpath_cli.services.node import NodeAgent
    from dualpath_cli.services.runner import run_agents

    joins: list[float] = []
    prepares: list[float] = []
    with tempfile.TemporaryDirectory(prefix="dualpath-cp-") as tmp:
        opts = RuntimeOptions(processes=True, store_dir=Path(tmp) / "store",
                              local_engines=False, heartbeat_timeout=1.0, fetch_s=0.005)
        live = LiveCluster(opts)
        agents: dict[str, NodeAgent] = {}
        try:
            live.start()
            auth = TokenAuth.generate(Path(tmp) / "token")
            with ServerThread(create_app(live, auth)) as server:
                for name, role in (("p0", "prefill"), ("d0", "decode"), ("d1", "decode")):
                    agent = NodeAgent(server.url, auth.token, name, role, 1)
                    agents[name] = agent
                    prepares.append(agent.prepare())  # processes up, imports done
                    joins.append(agent.join(120.0))
                sched = _flat(live.system)
                result: list[Any] = []
                runner = threading.Thread(target=lambda: result.append(run_agents(
                    live.system, agentic_workload(8, turns=6), timeout=120)))
                runner.start()
                victim = agents["d1"]
                assert victim.plan is not None and victim.cluster is not None
                eids = set(victim.plan.engine_ids)
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:  # a turn in flight on d1
                    with sched._lock:
                        if any(f.de in eids for f in sched.flights.values()):
                            break
                    time.sleep(0.001)
                before = sched.requeued
                t_kill = time.monotonic()
                for eid in eids:
                    victim.cluster.kill(eid)
                while time.monotonic() < t_kill + 10:
                    with sched._lock:
                        dead = [t for e, t in sched.dead_events if e in eids]
                        if dead and sched.requeued > before:
                            break
                    time.sleep(0.001)
                runner.join(180)
                with sched._lock:
                    dead = [t for e, t in sched.dead_events if e in eids]
                    requeued = sched.requeued - before
        finally:
            for agent in agents.values():
                agent.close(leave=False)
            live.close()
    death = round(min(dead) - t_kill, 3) if dead else None
    run = result[0] if result else None
    return {
        "join_to_serving_s": round(max(joins), 3), "joins_s": [round(j, 3) for j in joins],
        "engine_start_s": [round(x, 3) for x in prepares],
        "start_and_join_s": [round(x + j, 3) for x, j in zip(prepares, joins, strict=True)],
        "death_to_requeue_s": death, "requeued_turns": requeued,
        "heartbeat_timeout_s": 1.0,
        "turns_completed": len(run.turns) if run else 0, "turn_errors": len(run.errors)
        if run else None, "goal_s": 2.0,
        "met": death is not None and death < 2.0 and max(joins) < 2.0,
    }


def run_hier(args: argparse.Namespace) -> dict[str, Any]:
    """Part ``hier``: hierarchical vs flat scheduling in the simulator (offline runs).

    Each shape runs the same agents (Table 2 64K trace) flat and with
    :func:`~dualpath_cli.core.hierarchy.default_subs` sub-schedulers. Decision latency: the
    wall time of each scheduling call (a PE group's fetch, a DE drain, a DE group's fetch,
    and the root's routing of a turn) that the simulator makes; JCT: simulated.
    """
    from dualpath_cli.core.hierarchy import default_subs
    from dualpath_cli.sim.api import make_setup
    from dualpath_cli.sim.hierarchy import HierarchicalSimulation, TimedSimulation
    from dualpath_cli.sim.trace import synthetic_plans

    out: dict[str, Any] = {}
    for pd, agents in ((args.pd, args.hier_agents), (args.big_pd, args.big_agents)):
        spec = parse_pd(pd)
        setup = make_setup("ds660b", pd)
        plans = synthetic_plans(64_000, agents, 1)
        subs = default_subs(spec.prefill_nodes, spec.decode_nodes)
        row: dict[str, Any] = {"agents": agents, "subs": subs}
        for name, sim in (("flat", TimedSimulation(setup, plans)),
                          ("hier", HierarchicalSimulation(setup, plans, subs))):
            t0 = time.monotonic()
            res = sim.run_offline()
            ns = np.asarray(sim.decision_ns, dtype=np.float64)
            row[name] = {"decision_p50_us": round(float(np.percentile(ns, 50)) / 1e3, 2),
                         "decision_p99_us": round(float(np.percentile(ns, 99)) / 1e3, 2),
                         "decisions": len(ns),
                         "sched_us_per_turn": round(float(ns.sum()) / 1e3 / sim.turns_done, 2),
                         "jct_s": round(res.jct, 1), "wall_s": round(time.monotonic() - t0, 1)}
        row["jct_ratio"] = round(row["hier"]["jct_s"] / row["flat"]["jct_s"], 4)
        row["p99_ratio"] = round(row["hier"]["decision_p99_us"]
                                 / row["flat"]["decision_p99_us"], 3)
        out[pd] = row
    return out


def main(argv: list[str] | None = None) -> int:
    pace_gc_for_scheduler()  # this process hosts the schedulers it measures
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--parts", default="cpu,join,hier")
    ap.add_argument("--pd", default="48P96D")
    ap.add_argument("--rate", type=float, default=PAPER_RATE)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--warmup", type=float, default=10.0)
    ap.add_argument("--speed", type=float, default=10.0)
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--heartbeat", type=float, default=1.0)
    ap.add_argument("--heartbeat-timeout", type=float, default=30.0,
                    help="silence before an engine is declared dead (a host process that "
                    "exits is seen at once through its sentinel)")
    ap.add_argument("--batch-window", type=float, default=DEFAULT_BATCH_WINDOW_S,
                    help="the scheduler loop's wait between batches of messages, seconds "
                    "(scheduler.batch_window; 0: each message handled as it arrives)")
    ap.add_argument("--fetch", type=float, default=0.1,
                    help="seconds between a group's fetches at the paper's scale")
    ap.add_argument("--paper-batches", action="store_true",
                    help="cpu part below the paper's rate: groups fetch every --fetch x "
                    "2400 / --rate s, so each fetch carries the turns it would at 2,400 "
                    "turns/s (the extrapolation counts the paper's fetches, every --fetch s)")
    ap.add_argument("--prompt-dtype", choices=("uint32", "int64"), default="uint32",
                    help="the prompts handed to submit(): uint32 read-only, as the live "
                    "service hands them over (kept without a copy), or int64, which the "
                    "scheduler converts (an older front end's prompts)")
    ap.add_argument("--prefix-cache-tokens", type=int, default=64 << 20,
                    help="the scheduler's scheduler.prefix_cache_tokens: at the paper's "
                    "scale ~1,000 agents are in flight with ~33K-token contexts, over the "
                    "default's 32M (LRU drops, whole prompts hashed again)")
    ap.add_argument("--profile", default="",
                    help="write a cProfile of the scheduler's handlers and submit() to this "
                    "file (diagnosis: the CPU figures then include the profiler's cost)")
    ap.add_argument("--agents", type=int, default=0,
                    help="agents of the cpu part, one turn in flight each (0: 4 x --rate, at "
                    "least 200); the rate reached is at most agents / turn latency")
    ap.add_argument("--inproc-rounds", type=int, default=20,
                    help="periods (--fetch each) measured by the inproc part")
    ap.add_argument("--inproc-warmup", type=int, default=30,
                    help="periods before the inproc part measures (agents past their "
                    "first turns)")
    ap.add_argument("--inproc-heartbeat", type=float, default=1.0,
                    help="seconds between an engine's heartbeats in the inproc part")
    ap.add_argument("--pin", choices=("launcher", "scheduler"), default=None,
                    help="cpu part, a diagnosis (Linux): launcher: this process's threads on "
                    "the first CPU, the emulator hosts on the others; scheduler: the "
                    "scheduler thread alone on the first CPU (default: unpinned)")
    ap.add_argument("--cpu-start", choices=("first", "steady"), default="first",
                    help="where the cpu part's agents start: as --inproc-start (steady: "
                    "those drawn during the warm-up at a turn drawn uniformly)")
    ap.add_argument("--inproc-start", choices=("first", "steady"), default="first",
                    help="where the inproc part's agents start their trajectories: at their "
                    "first turn (the window holds early turns: short prompts), or, for "
                    "those drawn before the window, at a turn drawn uniformly (the paper's "
                    "steady state: agents at every stage, mean prompt ~33K tokens on the 64K "
                    "trace; an agent arriving in the window starts at its first turn)")
    ap.add_argument("--inproc-latency", type=int, default=3,
                    help="periods from a turn's dispatch to its done in the inproc part")
    ap.add_argument("--hier-agents", type=int, default=1024,
                    help="agents of the hierarchical-vs-flat run at --pd")
    ap.add_argument("--big-pd", default="480P960D")
    ap.add_argument("--big-agents", type=int, default=2048)
    args = ap.parse_args(argv)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    out: dict[str, Any] = {"host": platform.node(), "cpus": os.cpu_count()}
    if "cpu" in parts:
        out["sched_cpu_cores_48p96d"] = run_cpu(args)
    if "inproc" in parts:
        out["sched_cpu_inproc_48p96d"] = run_inproc(args)
    if "join" in parts:
        out["join_s"] = run_join(args)
    if "hier" in parts:
        out["hier_vs_flat"] = run_hier(args)
    if args.json:
        print(json.dumps(out))
        return 0
    for key, value in out.items():
        if isinstance(value, dict):
            print(f"{key}:")
            for k, v in value.items():
                print(f"  {k:28s} {v}")
        else:
            print(f"{key:30s} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
