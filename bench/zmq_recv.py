"""CPU per received message of a ZeroMQ mailbox, by how the receive waits.

Usage::

    python bench/zmq_recv.py [--json] [--rates 5000,15000] [--messages 20000] [--repeats 3]

A sender process pushes small msgpack headers (a ``done``'s size) at ``--rates`` messages/s
with exponential gaps (open loop, as engines report); the receiving thread's CPU
(``time.thread_time``: user + system, waits included) over the messages is divided by their
number. Ways to wait:

* ``try_then_poll``: a non-blocking receive, and on ``zmq.Again`` a poll, then a receive
  (what :class:`~dualpath_cli.transfer.zmq_fabric.ZmqEndpoint` once did);
* ``poll_then_recv``: a poll, then a receive, every time;
* ``blocking_recv``: one blocking receive with the socket's ``RCVTIMEO`` (50 ms);
* ``endpoint``: :meth:`ZmqEndpoint.recv` as shipped (one blocking receive with the socket's
  ``RCVTIMEO``), frames, msgpack and its ``Message`` included.

The first three receive the frames and unpack the header the same way.

``--json`` prints one object: ``recv_us_per_message`` (way -> rate -> the median of the
repeats) and ``rates_reached``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import msgpack
import zmq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dualpath_cli.transfer.zmq_fabric import ZmqEndpoint

WAYS = ("try_then_poll", "poll_then_recv", "blocking_recv", "endpoint")
_HEADER = {"t": "done", "eid": 5, "rid": 123456, "att": 0, "at": 1234.5678}


def _send(address: str, n: int, rate: float) -> None:
    """Push ``n`` headers to ``address`` at ``rate``/s (exponential gaps), then an end."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUSH)
    sock.connect(address)
    packed = msgpack.packb(_HEADER)
    rng = random.Random(1)
    due = time.perf_counter()
    for _ in range(n):
        due += rng.expovariate(rate)
        gap = due - time.perf_counter()
        if gap > 0:
            time.sleep(gap)  # pacing the load generator, not waiting for a result
        sock.send(packed)
    sock.send(msgpack.packb({"t": "end"}))
    sock.close(linger=-1)
    ctx.term()


def _receive_one(way: str, ep: ZmqEndpoint, poller: zmq.Poller) -> dict[str, Any] | None:
    sock = ep.socket
    if way == "endpoint":
        raw = ep.recv(timeout=0.05)
        return None if raw is None else raw.header
    if way == "try_then_poll":
        try:
            first = sock.recv(zmq.NOBLOCK)
        except zmq.Again:
            if not poller.poll(50):
                return None
            first = sock.recv()
    elif way == "poll_then_recv":
        if not poller.poll(50):
            return None
        first = sock.recv()
    else:
        try:
            first = sock.recv()  # (RCVTIMEO set by measure())
        except zmq.Again:
            return None
    while sock.get(zmq.RCVMORE):
        sock.recv(copy=False)
    head: dict[str, Any] = msgpack.unpackb(first, raw=False)
    return head


def measure(way: str, rate: float, n: int) -> tuple[float, float]:
    """(receiving CPU us per message, messages/s reached) for one way at one rate."""
    ctx: zmq.Context[Any] = zmq.Context()
    ep = ZmqEndpoint(ctx)
    poller = zmq.Poller()
    poller.register(ep.socket, zmq.POLLIN)
    if way == "blocking_recv":
        ep.socket.setsockopt(zmq.RCVTIMEO, 50)
    sender = multiprocessing.get_context("spawn").Process(
        target=_send, args=(ep.address, n, rate), daemon=True)
    sender.start()
    got, cpu0, wall0 = 0, 0.0, 0.0
    try:
        while True:
            head = _receive_one(way, ep, poller)
            if head is None:
                if not sender.is_alive() and got == 0:
                    raise SystemExit("zmq_recv: the sender exited before sending")
                continue
            if got == 0:  # from the first message: the sender's start-up is not counted
                cpu0, wall0 = time.thread_time(), time.perf_counter()
            if head.get("t") == "end":
                break
            got += 1
        cpu, wall = time.thread_time() - cpu0, time.perf_counter() - wall0
    finally:
        sender.join(timeout=30)
        ep.close()
        ctx.term()
    return 1e6 * cpu / max(1, got - 1), got / wall


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--rates", default="5000,15000")
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    try:
        rates = [float(r) for r in args.rates.split(",")]
    except ValueError:
        ap.error(f"--rates: comma-separated numbers, got {args.rates!r}")
    if any(r <= 0 for r in rates) or args.messages < 2 or args.repeats < 1:
        ap.error("--rates must be > 0, --messages >= 2, --repeats >= 1")
    runs: dict[str, dict[float, list[float]]] = {w: {r: [] for r in rates} for w in WAYS}
    reached: dict[float, list[float]] = {r: [] for r in rates}
    for _ in range(args.repeats):  # interleaved, so a drift of the host hits every way
        for rate in rates:
            for way in WAYS:
                us, got = measure(way, rate, args.messages)
                runs[way][rate].append(us)
                reached[rate].append(got)
    table = {w: {f"{r:g}": round(statistics.median(v), 2) for r, v in by.items()}
             for w, by in runs.items()}
    if args.json:
        print(json.dumps({"recv_us_per_message": table,
                          "rates_reached": {f"{r:g}": round(min(v)) for r, v in reached.items()},
                          "messages": args.messages, "repeats": args.repeats}))
        return 0
    print(f"{'way':<16}" + "".join(f"{f'{r:g}/s':>12}" for r in rates) + "   (us CPU/msg)")
    for way in WAYS:
        print(f"{way:<16}" + "".join(f"{table[way][f'{r:g}']:>12.2f}" for r in rates))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
