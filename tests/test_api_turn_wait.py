"""How the OpenAI routes wait on a turn: the ticket's done callback, and the loop's timer.

A stand-in cluster hands out tickets the test finishes by hand, so each path (finished in
time, finished after the timeout, failed, streamed) is driven deterministically.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from dualpath_cli.api.openai_routes import router
from dualpath_cli.errors import NoAvailableEngine
from dualpath_cli.runtime.options import RuntimeOptions
from dualpath_cli.runtime.turns import Ticket, TokenStream, TurnCancelled, TurnResult


@dataclass
class HandCluster:
    """Just what the routes use of a LiveCluster; tickets are finished by the test."""

    opts: RuntimeOptions = field(default_factory=RuntimeOptions)
    tickets: list[Ticket] = field(default_factory=list)
    released: list[Ticket] = field(default_factory=list)
    submitted: threading.Event = field(default_factory=threading.Event)
    cancelled: list[Ticket] = field(default_factory=list)

    def submit(self, tokens: list[int], gen: int, session: str | None = None,
               key: str | None = None, stream: bool = False) -> Ticket:
        def cancel() -> None:
            self.cancelled.append(ticket)
            ticket.fail(TurnCancelled("cancelled"))
        ticket = Ticket(TokenStream(gen), cancel) if stream else Ticket()
        self.tickets.append(ticket)
        self.submitted.set()
        return ticket

    def done(self, ticket: Ticket) -> None:
        self.released.append(ticket)


def _app(cluster: HandCluster, timeout: float) -> TestClient:
    app = FastAPI()
    app.include_router(router(cluster, turn_timeout=timeout))  # type: ignore[arg-type]
    return TestClient(app)


def _body(**kw: Any) -> dict[str, Any]:
    return {"model": RuntimeOptions().model, "prompt": [1, 2, 3], "max_tokens": 2} | kw


def _finish(ticket: Ticket, tokens: list[int]) -> None:
    ticket.result = TurnResult(tokens, 0.0, 0.1, 0.2, 0, 1, 0, 1, 3, 0, 0.0)
    ticket.finish()


def _finish_when_submitted(cluster: HandCluster, tokens: list[int]) -> threading.Thread:
    def run() -> None:
        assert cluster.submitted.wait(30)
        _finish(cluster.tickets[-1], tokens)
    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_a_turn_finished_by_its_callback_answers_with_its_tokens() -> None:
    cluster = HandCluster()
    with _app(cluster, timeout=60) as client:
        finisher = _finish_when_submitted(cluster, [7, 8])
        r = client.post("/v1/completions", json=_body(return_token_ids=True))
        finisher.join()
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 2
    assert cluster.released == cluster.tickets  # the callback released the ticket


def test_a_turn_past_its_timeout_is_a_504_and_its_late_end_is_harmless() -> None:
    cluster = HandCluster()
    with _app(cluster, timeout=0.05) as client:
        r = client.post("/v1/completions", json=_body())
        assert r.status_code == 504, r.text
        assert "did not finish within" in r.json()["error"]["message"]
        _finish(cluster.tickets[-1], [1, 2])  # the turn ends after the answer went out
        assert client.get("/v1/models").status_code == 200  # the loop is still serving
    assert cluster.released == cluster.tickets


def test_a_failed_turn_is_answered_with_its_error() -> None:
    cluster = HandCluster()

    def fail_when_submitted() -> None:
        assert cluster.submitted.wait(30)
        cluster.tickets[-1].fail(NoAvailableEngine("no prefill engine is alive"))

    with _app(cluster, timeout=60) as client:
        thread = threading.Thread(target=fail_when_submitted)
        thread.start()
        r = client.post("/v1/completions", json=_body())
        thread.join()
    assert r.status_code == 500
    assert "no prefill engine is alive" in r.json()["error"]["message"]
    assert cluster.released == cluster.tickets


def test_a_callback_added_after_the_end_runs_at_once() -> None:
    ticket = Ticket()
    _finish(ticket, [1])
    ran: list[int] = []
    ticket.add_done_callback(lambda: ran.append(1))
    assert ran == [1]
    assert ticket.first_event.is_set()


def test_a_streamed_turn_without_step_reports_answers_at_its_end() -> None:
    """An engine that does not report steps (the emulated one): all the text at the end."""
    cluster = HandCluster()
    with _app(cluster, timeout=60) as client:
        finisher = _finish_when_submitted(cluster, [7, 8])
        with client.stream("POST", "/v1/completions", json=_body(stream=True)) as r:
            text = "".join(r.iter_text())
        finisher.join()
    assert r.status_code == 200
    assert text.rstrip().endswith("data: [DONE]")
    assert '"text":""' in text.replace(" ", "")  # the first chunk, then the tokens


def test_streamed_tokens_arrive_as_chunks_and_split_characters_stay_whole() -> None:
    """Tokens put on the ticket's stream go out as they come; a character whose UTF-8
    bytes arrive in two steps is sent whole with its last byte."""
    cluster = HandCluster()
    euro = list("€".encode())  # three bytes

    def steps() -> None:
        assert cluster.submitted.wait(30)
        stream = cluster.tickets[-1].stream
        assert stream is not None
        stream.put(0, (ord("a"),))
        stream.put(1, (ord("b"), euro[0]))
        stream.put(1, (ord("b"),))  # a repeat (a retried attempt): dropped
        stream.put(3, tuple(euro[1:]))
        _finish(cluster.tickets[-1], [ord("a"), ord("b"), *euro])

    with _app(cluster, timeout=60) as client:
        thread = threading.Thread(target=steps)
        thread.start()
        with client.stream("POST", "/v1/completions",
                           json=_body(stream=True, max_tokens=5)) as r:
            lines = [json.loads(x[6:]) for x in r.iter_lines() if x.startswith("data: {")]
        thread.join()
    texts = [c["choices"][0]["text"] for c in lines if c["choices"]]
    assert "".join(texts) == "ab€"
    assert all("\ufffd" not in t for t in texts)
    assert cluster.released == cluster.tickets and not cluster.cancelled


@pytest.mark.parametrize("key", [None, "retry-me"])
def test_a_stream_that_ends_early_cancels_its_turn_unless_keyed(key: str | None) -> None:
    """The client reads the first chunk and goes away: the turn is cancelled, unless it
    has an idempotency key (its client comes back for it)."""
    cluster = HandCluster()
    headers = {} if key is None else {"Idempotency-Key": key}
    with _app(cluster, timeout=60) as client:
        def first_token() -> None:
            assert cluster.submitted.wait(30)
            stream = cluster.tickets[-1].stream
            assert stream is not None
            stream.put(0, (ord("a"),))
        thread = threading.Thread(target=first_token)
        thread.start()
        with client.stream("POST", "/v1/completions", headers=headers,
                           json=_body(stream=True, max_tokens=100)) as r:
            for line in r.iter_lines():
                if '"text":"a"' in line.replace(" ", ""):
                    break
        thread.join()
        if key is not None:
            assert not cluster.cancelled
            _finish(cluster.tickets[-1], [ord("a")] * 100)
    assert cluster.cancelled == ([] if key else cluster.tickets)
    assert cluster.released == cluster.tickets


@dataclass
class LockingCluster(HandCluster):
    """A cluster whose ``submit`` holds its lock while it waits for the scheduler's, as
    LiveCluster does, and whose ``done`` takes that lock."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    scheduler_lock: threading.Lock = field(default_factory=threading.Lock)
    second_holds_lock: threading.Event = field(default_factory=threading.Event)

    def submit(self, tokens: list[int], gen: int, session: str | None = None,
               key: str | None = None, stream: bool = False) -> Ticket:
        with self.lock:
            if self.tickets:  # the second request: hold the lock, then want the scheduler's
                self.second_holds_lock.set()
            with self.scheduler_lock:
                return super().submit(tokens, gen, session, stream=stream)

    deadlocked: bool = False

    def done(self, ticket: Ticket) -> None:
        # a deadlock would hang the test: give up the lock after a while and say so
        if not self.lock.acquire(timeout=5):
            self.deadlocked = True
            super().done(ticket)
            return
        try:
            super().done(ticket)
        finally:
            self.lock.release()


def test_a_turn_finished_under_the_schedulers_lock_does_not_deadlock_a_submit() -> None:
    """The scheduler finishes turn A holding its lock while request B's submit holds the
    cluster's lock and waits for the scheduler's: A's callback must not take the cluster's
    lock on the scheduler thread (a lock-order deadlock that hung 16 concurrent clients)."""
    cluster = LockingCluster()
    answers: dict[str, int] = {}
    with _app(cluster, timeout=60) as client:
        def post(name: str) -> None:
            answers[name] = client.post("/v1/completions", json=_body()).status_code

        first = threading.Thread(target=post, args=("a",), daemon=True)
        first.start()
        assert cluster.submitted.wait(30)
        ticket_a = cluster.tickets[0]

        def scheduler() -> None:
            with cluster.scheduler_lock:
                assert cluster.second_holds_lock.wait(30)
                _finish(ticket_a, [4, 2])  # runs A's done callback under this lock

        sched = threading.Thread(target=scheduler, daemon=True)
        sched.start()
        second = threading.Thread(target=post, args=("b",), daemon=True)
        second.start()
        sched.join(20)
        assert not sched.is_alive(), "deadlock: the scheduler thread is stuck in a callback"
        first.join(20)
        deadline = threading.Event()
        for _ in range(200):  # B's ticket exists once its submit got the scheduler's lock
            if len(cluster.tickets) == 2:
                break
            deadline.wait(0.05)
        _finish(cluster.tickets[1], [1])
        second.join(20)
        assert not first.is_alive() and not second.is_alive()
    assert not cluster.deadlocked, "a done callback took the cluster's lock"
    assert answers == {"a": 200, "b": 200}
