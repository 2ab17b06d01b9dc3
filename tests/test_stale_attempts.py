"""Engines keep the newest attempt of a request whatever order its messages arrive in.

Why: a DE's Layers reach the PE (and a PE's the DE) on another socket than the scheduler's
messages. When one engine dies mid-stream and the scheduler re-queues the turn, the dead
engine's last Layers can land after the cancel, or after the new attempt's dispatch (the CI
run of 35b7af8 lost a turn of the fault matrix's ``kill_de`` row on a PE this way: the stale
Layer replaced the new attempt's job, and the turn never finished).
"""

from __future__ import annotations

import collections
from types import SimpleNamespace
from typing import Any

import numpy as np

from dualpath_cli.runtime.attempts import ENDED_KEPT, EndedAttempts
from dualpath_cli.runtime.context import Counters
from dualpath_cli.runtime.decode import DecodeWorker
from dualpath_cli.runtime.prefill import PrefillWorker
from dualpath_cli.runtime.wire import Cancel, Decode, Layer, Prefill, PrefillDone

LAYERS = 2
BT = 4
PE_ADDRESS = "tcp://127.0.0.1:2"


class _Nic:
    def __init__(self) -> None:
        self.bytes = 0

    def inc(self, n: float) -> None:
        self.bytes += int(n)


def _ctx() -> Any:
    nic = _Nic()
    ctx = SimpleNamespace(spec=SimpleNamespace(model="tiny", flops_rate=1e9, quota_s=0.3),
                          n_layers=LAYERS, counters=Counters(), seen=0, bt=BT, bpl=16,
                          namespace=None, m_nic=collections.defaultdict(lambda: nic),
                          report_queue=lambda: None, ep=SimpleNamespace(address=PE_ADDRESS),
                          sent=[])
    ctx.send_kv = lambda to, msg, shaped: ctx.sent.append((to, msg))

    def dispatched(seq: int, submit: Any = None) -> None:  # EngineContext.dispatched
        if submit is not None:
            submit()
        ctx.seen = max(ctx.seen, seq)

    ctx.dispatched = dispatched
    return ctx


def _worker() -> tuple[PrefillWorker, Any]:
    """A PE worker on a context that offers what the message handlers touch (no reads:
    every dispatch below is DE read path, ``pe_tokens`` 0). Its compute thread is ended
    first: a job these tests complete is queued for compute and stays there."""
    ctx = _ctx()
    pe = PrefillWorker(ctx)  # type: ignore[arg-type]
    pe._compute.put(None)
    return pe, ctx


def _prefill(rid: int, att: int) -> Prefill:
    """Attempt ``att``: an 8-token prompt whose first 4 tokens are a DE-read hit."""
    return Prefill(rid, att, seq=att, tokens=np.arange(8, dtype=np.int32), cached=BT,
                   keys=[], pe_tokens=0, de="tcp://127.0.0.1:1", layerwise=True,
                   shaped=False)


def _layer(rid: int, att: int, layer: int) -> Layer:
    return Layer(rid, att, layer, 0, (np.ones((BT, 16), np.uint8),))


def test_a_dead_des_late_layer_does_not_replace_the_next_attempt() -> None:
    pe, ctx = _worker()
    pe.handle(_prefill(7, 0))
    pe.handle(Cancel(7))  # the scheduler re-queues: the DE died
    pe.handle(_prefill(7, 1))
    pe.handle(_layer(7, 0, 1))  # the dead DE's last Layer, late
    job = pe.jobs[7]
    assert (job.att, job.known) == (1, True)
    assert 1 not in job.hit and not job.ready[1].is_set()
    assert ctx.counters.total("kv_rx_from_de_bytes") == 0


def test_a_late_layer_after_a_cancel_makes_no_job() -> None:
    pe, _ = _worker()
    pe.handle(_prefill(3, 2))
    pe.handle(Cancel(3))
    pe.handle(_layer(3, 2, 0))
    assert 3 not in pe.jobs
    pe.handle(_layer(3, 3, 0))  # the next attempt's DE may overtake its Prefill
    pe.handle(_prefill(3, 3))
    job = pe.jobs[3]
    assert (job.att, job.known, 0 in job.hit) == (3, True, True)


def test_an_older_attempts_layer_is_dropped_while_the_newer_runs() -> None:
    pe, _ = _worker()
    pe.handle(_layer(5, 1, 0))  # attempt 1's DE overtook its Prefill
    pe.handle(_layer(5, 0, 1))  # attempt 0's, never cancelled here (its PE was another)
    pe.handle(_prefill(5, 1))
    job = pe.jobs[5]
    assert (job.att, sorted(job.hit)) == (1, [0])


def test_cancelled_attempts_are_remembered_up_to_a_bound() -> None:
    pe, _ = _worker()
    for rid in range(ENDED_KEPT + 10):
        pe.handle(_prefill(rid, 0))
        pe.handle(Cancel(rid))
    assert len(pe._ended) == ENDED_KEPT and 0 not in pe._ended
    pe.handle(_layer(ENDED_KEPT + 9, 0, 0))
    assert ENDED_KEPT + 9 not in pe.jobs


def _de() -> DecodeWorker:
    """A DE worker whose decode thread is ended first (a job these tests complete is queued
    for decoding and stays there)."""
    de = DecodeWorker(_ctx())
    de._ready.put(None)
    return de


def _decode(rid: int, att: int) -> Decode:
    """Attempt ``att``: an 8-token prompt, no hit (every row comes from the PE)."""
    return Decode(rid, att, seq=att, tokens=np.arange(8, dtype=np.int32), gen=2, cached=0,
                  keys=[], pe_tokens=0, pe="tcp://127.0.0.1:1", shaped=False)


def _pe_layer(rid: int, att: int, layer: int) -> Layer:
    return Layer(rid, att, layer, 0, (np.zeros((0, 16), np.uint8), np.ones((8, 16), np.uint8)))


def test_a_dead_pes_late_layers_after_a_cancel_are_not_kept() -> None:
    de = _de()
    de.handle(_decode(4, 0))
    de.handle(Cancel(4))  # the PE died: the turn goes elsewhere
    de.handle(_pe_layer(4, 0, 0))
    de.handle(PrefillDone(4, 0, 17))
    assert 4 not in de._early and 4 not in de.jobs


def test_an_older_attempts_layer_does_not_wait_beside_the_newer_job() -> None:
    de = _de()
    de.handle(_decode(6, 1))
    de.handle(_pe_layer(6, 0, 1))  # attempt 0's PE was another engine, its Layer is late
    assert 6 not in de._early and de.jobs[6].filled == [0, 0]


def test_a_newer_attempts_layers_that_overtake_its_decode_are_kept_for_it() -> None:
    de = _de()
    de.handle(_decode(8, 0))
    de.handle(Cancel(8))
    for layer in range(LAYERS):
        de.handle(_pe_layer(8, 1, layer))
    de.handle(PrefillDone(8, 1, 17))
    assert len(de._early[8]) == LAYERS + 1
    de.handle(_decode(8, 1))
    job = de.jobs[8]
    assert (job.att, job.filled, job.first, job.started) == (1, [8, 8], 17, True)


def test_a_pe_forwards_the_decode_ahead_of_the_turns_kv() -> None:
    """One message per dispatch: the Prefill carries the DE's part, which the PE sends on
    to the DE (first on that link) and reads only its own share of the keys."""
    pe, ctx = _worker()
    keys = [f"{k:032x}" for k in range(3)]
    pe.handle(Prefill(9, 1, seq=4, tokens=np.arange(4, dtype=np.int32), cached=3 * BT,
                      keys=keys, pe_tokens=0, de="tcp://127.0.0.1:1", layerwise=True,
                      shaped=False, start=3 * BT, gen=5, de_seq=11))
    [(to, msg)] = ctx.sent
    assert to == "tcp://127.0.0.1:1" and isinstance(msg, Decode)
    assert (msg.rid, msg.att, msg.seq, msg.gen, msg.cached, msg.pe_tokens, msg.pe,
            msg.start) == (9, 1, 11, 5, 3 * BT, 0, PE_ADDRESS, 3 * BT)
    assert list(msg.keys) == keys and list(msg.tokens) == [0, 1, 2, 3]
    assert pe.jobs[9].keys == []  # pe_tokens 0: the DE reads every hit block
    pe.handle(_prefill(10, 0))  # de_seq -1: the scheduler sent the Decode itself
    assert len(ctx.sent) == 1


def test_a_decode_that_comes_after_its_cancel_makes_no_job() -> None:
    """A forwarded Decode travels another path than the scheduler's Cancel of it."""
    de = _de()
    de.handle(Cancel(4, 0))
    de.handle(_decode(4, 0))
    assert 4 not in de.jobs
    de.handle(_decode(4, 1))  # the next attempt runs
    assert de.jobs[4].att == 1


def test_a_cancel_of_an_older_attempt_keeps_the_newer_job() -> None:
    de = _de()
    de.handle(_decode(5, 0))
    de.handle(_decode(5, 1))  # attempt 1 overtook attempt 0's Cancel
    de.handle(Cancel(5, 0))
    assert de.jobs[5].att == 1
    de.handle(_decode(5, 0))  # attempt 0's Decode, very late: dropped
    assert de.jobs[5].att == 1
    de.handle(Cancel(5))  # no attempt given: whatever is held
    assert 5 not in de.jobs


def test_a_pe_keeps_a_newer_job_when_an_older_attempt_is_cancelled() -> None:
    pe, _ = _worker()
    pe.handle(_prefill(6, 2))
    pe.handle(Cancel(6, 1))
    assert pe.jobs[6].att == 2
    pe.handle(Cancel(6, 2))
    assert 6 not in pe.jobs
    pe.handle(_prefill(6, 2))  # a late copy of a cancelled attempt: no job
    assert 6 not in pe.jobs


def test_the_cancel_rule_every_engine_shares() -> None:
    """``EndedAttempts.cancel``: the held job goes unless a newer attempt is held, and the
    cancelled attempt is remembered whether or not a job was held."""
    ended = EndedAttempts()
    assert ended.cancel(1, 2, holding=2) and ended.stale(1, 2)
    assert not ended.cancel(2, 0, holding=1)  # a newer job held: kept
    assert ended.stale(2, 0) and not ended.stale(2, 1)
    assert not ended.cancel(3, 4) and ended.stale(3, 4) and not ended.stale(3, 5)
    assert ended.cancel(4, -1, holding=0) and ended.stale(4, 0)  # whatever is held
    assert not ended.cancel(5, -1) and 5 not in ended  # nothing named, nothing held
