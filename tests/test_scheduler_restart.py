"""The restartable scheduler (issue 16, item 3; issue 17's fault-matrix row ``scheduler_kill``).

Unit level: the checkpoint round-trips a scheduler's queues, assignments, thresholds and
counters; a truncated, altered or foreign file is refused in one line and kept aside; a
live cluster restored from a checkpoint answers a finished key from the kept answer (no
second run) and runs an admitted, unfinished turn to the reference model's tokens.

End to end: ``launch --role scheduler`` with two nodes joined on loopback (``--join``),
agents' sessions over HTTP with ``Idempotency-Key``; the scheduler is killed with ``-9``
mid-run and started again with the same state directory. Every turn is answered once, with
the tokens of a clean run. :func:`run_scheduler_kill` is also the ``scheduler_kill`` row of
``bench/reliability.py --faults``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil
import pytest
from conftest import wait_until
from test_fault_matrix import AGENTS, SLOW, VOCAB, FaultRow, _model, reference
from test_multinode import Procs, _json_line, launch_env

from dualpath_cli.api.listen import free_port, listen
from dualpath_cli.cluster.system import RuntimeSystem
from dualpath_cli.runtime import checkpoint as ckpt
from dualpath_cli.runtime.options import RuntimeOptions
from dualpath_cli.runtime.turns import TurnRequest
from dualpath_cli.services.live import LiveCluster
from dualpath_cli.services.restart import KeyConflict
from dualpath_cli.workload.tokens import append_token_ids

#: A loaded 2-core CI box spawns and imports slowly.
START_S = 180.0
#: A turn not answered within this (retries included) is lost.
TURN_DEADLINE_S = 120.0
#: The stated bound on recovery: kill -9 -> the restarted scheduler answers a turn again
#: (the restart is immediate here; a supervisor such as systemd or Kubernetes adds its delay).
RECOVERY_LIMIT_S = 30.0


def _opts(**kw: Any) -> RuntimeOptions:
    return RuntimeOptions(flops_rate=5e9, fetch_s=0.005, heartbeat_timeout=10.0, **kw)


def _turn(rid_seed: int, n: int = 40) -> np.ndarray:
    return np.random.default_rng(rid_seed).integers(0, VOCAB, n).astype(np.int64)


# -- the checkpoint file and the scheduler's section ---------------------------------------
def test_checkpoint_round_trip() -> None:
    first = RuntimeSystem(_opts())
    second = RuntimeSystem(_opts())
    try:
        sched = first.scheduler
        for i in range(4):
            sched.submit(TurnRequest(agent=i, turn=0, tokens=_turn(i), gen=3))
        with sched._lock:  # one turn dispatched on PE 0 and DE 1, one routed to group 2
            f0 = sched.queue.popleft()
            f0.pe, f0.de = 0, 1
            f1 = sched.queue.popleft()
            sched.private[2].append(f1)
            sched.params = dataclasses.replace(sched.params, alpha=1234)
            sched.sources["alpha"] = "api"
            sched.quota_s = 0.125
            sched.controllers.on["beta"] = True
        sched.log.record_control(at=time.time(), name="beta", inputs={})
        state = ckpt.capture(sched)
        raw = ckpt.encode_checkpoint({"scheduler": state})
        back = ckpt.decode_checkpoint(raw)["scheduler"]
        assert back == json.loads(json.dumps(state))

        done = ckpt.restore(second.scheduler, back, engines=False)
        new = second.scheduler
        assert done.flights == 4 and done.requeued == 2  # dispatched and routed: re-queued
        # one FIFO in admission order, wherever each turn waited
        assert [f.rid for f in new.queue] == [f0.rid, f1.rid, 2, 3]
        assert all(f.att == 1 for f in new.queue)  # a new attempt: old answers are stale
        for f in new.queue:
            assert np.array_equal(f.req.tokens, _turn(f.req.agent))
            assert f.req.gen == 3 and f.pe == -1 and f.de == -1
        assert new.params.alpha == 1234 and new.sources["alpha"] == "api"
        assert new.quota_s == 0.125 and new.controllers.on["beta"]
        assert new.log.last_seq == 1
        new.log.record_control(at=time.time(), name="beta", inputs={})
        assert new.log.last_seq == 2  # the decision sequence goes on, never back
        ticket = new.submit(TurnRequest(9, 0, _turn(9), 2))
        # rids go on in a new epoch: turns the killed scheduler admitted after its last
        # checkpoint (4, 5, ...) may still run on the engines and must not share an id
        assert max(new.flights) == ckpt.RID_EPOCH
        assert ticket is new.flights[ckpt.RID_EPOCH].ticket
    finally:
        for system in (first, second):
            system.scheduler.ep.close()


@pytest.mark.parametrize("damage", ["flip", "truncate", "garbage", "version", "empty"])
def test_bad_checkpoint_refused_in_one_line_and_kept(tmp_path: Path, damage: str) -> None:
    path = tmp_path / "checkpoint-1.json"
    ckpt.write(path, {"scheduler": {"next_rid": 7}, "live": {}})
    assert ckpt.read(path) == {"scheduler": {"next_rid": 7}, "live": {}}
    raw = path.read_bytes()
    if damage == "flip":
        bad = raw[:-3] + bytes([raw[-3] ^ 0x01]) + raw[-2:]
    elif damage == "truncate":
        bad = raw[: len(raw) - 5]
    elif damage == "garbage":
        bad = b"\x00\xff not a checkpoint\n{}"
    elif damage == "version":
        head, _, body = raw.partition(b"\n")
        bad = head.replace(b'"version": 1', b'"version": 99') + b"\n" + body
    else:
        bad = b""
    path.write_bytes(bad)
    with pytest.raises(ckpt.CheckpointError) as info:
        ckpt.read(path)
    msg = str(info.value)
    assert "\n" not in msg and "moved aside to checkpoint-1.json.corrupt-" in msg
    want = {"flip": "SHA-256 does not match", "truncate": "truncated",
            "garbage": "not a scheduler checkpoint", "version": "version 99",
            "empty": "not a scheduler checkpoint"}[damage]
    assert want in msg
    assert not path.exists()  # the next launch starts afresh...
    aside = list(tmp_path.glob("checkpoint-1.json.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_bytes() == bad  # ...and nothing was lost


def test_checkpoint_that_does_not_fit_is_refused_and_kept(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint-2.json"
    ckpt.write(path, {"scheduler": {"next_rid": 7}, "live": {}})  # fields missing
    live = LiveCluster(_opts(), checkpoint=path)
    with pytest.raises(ckpt.CheckpointError, match="does not fit this scheduler"):
        live.spawn()
    assert not path.exists() and len(list(tmp_path.glob("checkpoint-2.json.corrupt-*"))) == 1


def test_live_cluster_restored_answers_once(tmp_path: Path) -> None:
    """A key answered before the "kill" is answered from the checkpoint without a run; a
    turn admitted but not run yet runs after the restore; a reused key is refused."""
    path = tmp_path / "checkpoint-3.json"
    model = _model()
    p0 = append_token_ids(AGENTS[0], 0, VOCAB).tolist()
    p1 = append_token_ids(AGENTS[1], 0, VOCAB).tolist()
    first = LiveCluster(_opts(), checkpoint=path)
    first.start()
    try:
        t0 = first.submit(p0, 4, session="a", key="k0")
        out0 = t0.wait(60).tokens
        assert first.submit(p0, 4, session="a", key="k0").result is not None  # same ticket
        assert first.durable is not None
        first.durable.writer.stop(final=False)  # this test writes the checkpoint itself
        sched = first.system.scheduler
        with sched._lock:  # the scheduler thread is held: k1 is admitted, not dispatched
            rid1 = first.submit(p1, 4, session="b", key="k1").rid
            assert rid1 is not None
            body = f"chatcmpl-{rid1}-abc123"  # its OpenAI id and the client's own id
            first.name_turn(rid1, (body, "client-k1"))
            first.durable.writer.write_now()  # what a kill -9 at this moment leaves behind
        left = {p: p.read_bytes() for p in tmp_path.glob("checkpoint-3.json*")}
        assert len(left) == 2  # the checkpoint and its prompt spool
    finally:
        first.close()
    assert not list(tmp_path.glob("checkpoint-3.json*"))  # a clean close leaves nothing
    for p, data in left.items():
        p.write_bytes(data)
    saved = path

    second = LiveCluster(_opts(), checkpoint=saved)
    second.start()
    try:
        restored = second.durable.restored if second.durable else None
        assert restored is not None
        assert restored["flights"] == 1 and restored["keys"] == 2
        assert restored["aliases"] == 1  # the names of the turn it carries
        sched = second.system.scheduler
        rids = sched._next_rid
        again = second.submit(p0, 4, session="a", key="k0")
        assert again.event.is_set() and again.result is not None
        assert again.result.tokens == out0 == model.generate(p0, 4)
        assert sched._next_rid == rids  # answered from the checkpoint: not run again
        assert again.rid == t0.rid is not None  # and named by the id it ran under
        t1 = second.submit(p1, 4, session="b", key="k1")
        assert t1.rid == rid1 is not None
        out1 = t1.wait(60).tokens
        assert out1 == model.generate(p1, 4) and sched._next_rid == rids
        # explain finds the turn admitted before the restart by the names it had then
        for name in ("client-k1", body):
            story = second.request(name)
            assert story["rid"] == rid1 and story["aliases"] == [body, "client-k1"]
        with pytest.raises(KeyConflict, match="different turn"):
            second.submit(p1, 4, session="b", key="k0")
    finally:
        second.close()
    assert not list(tmp_path.glob("checkpoint-3.json*"))


def test_prompt_spool(tmp_path: Path) -> None:
    """Prompts are written once each; a checkpoint names their places; a damaged prompt is
    refused; live prompts move to a new generation and the old one goes once named."""
    path = tmp_path / "checkpoint-4.json"
    spool = ckpt.PromptSpool(path, compact_bytes=1000)
    prompts = {rid: _turn(rid, 50 + rid) for rid in range(6)}
    name = spool.settle(set(prompts))  # as capture does: settle, then the places
    state: dict[str, Any] = {"spool": name, "flights": [
        {"rid": rid, "prompt": spool.put(rid, t)} for rid, t in prompts.items()]}
    size = spool.size
    assert spool.put(0, prompts[0]) == state["flights"][0]["prompt"] and spool.size == size
    assert state["spool"] == "checkpoint-4.json.prompts-0" and spool.gen == 0
    back = ckpt.read_spool(tmp_path, state)
    assert all(np.array_equal(back[rid], t) for rid, t in prompts.items())
    # turns 0-4 finish: the spool holds far more than its live prompts -> generation 1
    name = spool.settle({5})
    state = {"spool": name, "flights": [{"rid": 5, "prompt": spool.put(5, prompts[5])}]}
    assert state["spool"] == "checkpoint-4.json.prompts-1"
    assert np.array_equal(ckpt.read_spool(tmp_path, state)[5], prompts[5])
    spool.retire()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-4.json.prompts-1"]
    raw = bytearray((tmp_path / state["spool"]).read_bytes())
    raw[3] ^= 0xFF
    (tmp_path / state["spool"]).write_bytes(bytes(raw))
    with pytest.raises(ckpt.CheckpointError, match="turn 5 .* CRC-32 does not match"):
        ckpt.read_spool(tmp_path, state)
    spool.close(remove=True)
    assert not list(tmp_path.iterdir())


def test_node_agent_notices_a_scheduler_that_forgot_it() -> None:
    """Two checks in a row that find the node unknown (404) or all its engines dead make the
    agent join again; one such check (a restored engine not heard from yet) does not."""
    from dualpath_cli.services.node import NodeAgent

    answers: list[httpx.Response] = []

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/api/v1/join/n0"
        return answers.pop(0)

    def ok(*states: str) -> httpx.Response:
        return httpx.Response(200, json={"engines": {str(i): s for i, s in enumerate(states)}})

    agent = NodeAgent("http://sched:1", "tok", "n0", "decode", 2)
    agent._http = httpx.Client(base_url="http://sched:1", transport=httpx.MockTransport(handler))
    try:
        seen = []
        for resp in [ok("dead", "dead"), ok("ready", "ready"), ok("dead", "ready"),
                     ok("dead", "dead"), ok("dead", "dead"), httpx.Response(404), ok("ready"),
                     httpx.Response(404), httpx.Response(404)]:
            answers.append(resp)
            seen.append(agent._forgotten_by_scheduler())
        assert seen == [False, False, False, False, True, False, False, False, True]
    finally:
        agent._http.close()


def test_idempotency_key_over_http() -> None:
    """``Idempotency-Key`` on /v1/completions: the same turn again (streamed or not) is the
    same answer with no new scheduling decision; the key with another prompt is 422; a key
    that is not 1-200 printable ASCII characters is 400."""
    from fastapi.testclient import TestClient

    from dualpath_cli.api.app import create_app
    from dualpath_cli.api.auth import TokenAuth
    from dualpath_cli.telemetry.gpu import UnavailableGpu

    live = LiveCluster(_opts())
    live.start()
    try:
        app = create_app(live, TokenAuth("tok"), gpu=UnavailableGpu("tests"))
        prompt = append_token_ids(AGENTS[2], 0, VOCAB).tolist()
        body = {"model": "tiny", "prompt": prompt, "max_tokens": 4, "temperature": 0,
                "return_token_ids": True}
        with TestClient(app, headers={"Authorization": "Bearer tok"}) as http:
            def post(b: dict[str, Any], key: str) -> Any:
                return http.post("/v1/completions", json=b, headers={"Idempotency-Key": key})

            first = post(body, "turn-1")
            assert first.status_code == 200, first.text
            ids = first.json()["choices"][0]["token_ids"]
            assert ids == _model().generate(prompt, 4)
            seq = live.system.scheduler.log.last_seq
            again = post(body, "turn-1")
            streamed = post(dict(body, stream=True), "turn-1")
            assert again.json()["choices"][0]["token_ids"] == ids
            # the same turn streamed (a client may switch on its retry): the same answer
            assert streamed.status_code == 200
            chunks = [json.loads(line[6:]) for line in streamed.text.splitlines()
                      if line.startswith("data: {")]
            assert [c["choices"][0]["token_ids"] for c in chunks
                    if c["choices"] and c["choices"][0].get("token_ids")] == [ids]
            assert live.system.scheduler.log.last_seq == seq  # nothing ran again
            other = post(dict(body, prompt=prompt[:-1]), "turn-1")
            assert other.status_code == 422
            assert other.json()["error"]["code"] == "idempotency_key_reused"
            for bad in ("x" * 201, "tab\there"):
                assert post(body, bad).status_code == 400, bad
    finally:
        live.close()


# -- end to end: processes on loopback -------------------------------------------------------
class Clients:
    """Agents' sessions over HTTP, each turn with an ``Idempotency-Key``; a turn whose
    request fails (connection cut, 503 while the scheduler restarts) is sent again with
    the same key until it is answered or ``TURN_DEADLINE_S`` passes."""

    def __init__(self, url: str, token: str, run: str) -> None:
        self.url = url
        self.run = run
        self.http = httpx.Client(headers={"Authorization": f"Bearer {token}"},
                                 timeout=httpx.Timeout(30.0, connect=2.0))
        self.tokens: dict[tuple[int, int], tuple[int, ...]] = {}
        self.answered_at: dict[tuple[int, int], float] = {}
        self.answers: dict[tuple[int, int], int] = {}
        self.retries = 0
        self.errors: dict[tuple[int, int], str] = {}
        self.bodies: dict[tuple[int, int], tuple[dict[str, Any], dict[str, str]]] = {}
        self._lock = threading.Lock()
        self.done = threading.Condition(self._lock)

    def send(self, body: dict[str, Any], headers: dict[str, str]) -> list[int]:
        deadline = time.monotonic() + TURN_DEADLINE_S
        last = ""
        while time.monotonic() < deadline:
            try:
                resp = self.http.post(f"{self.url}/v1/completions", json=body,
                                      headers=headers)
                if resp.status_code == 200:
                    return [int(t) for t in resp.json()["choices"][0]["token_ids"]]
                last = f"HTTP {resp.status_code}: {resp.text[:200]}"
                if resp.status_code < 500:
                    break  # refused for good
            except httpx.HTTPError as err:
                last = f"{type(err).__name__}: {err}"
            with self._lock:
                self.retries += 1
            self.done.acquire()
            self.done.wait(0.1)  # the client's back-off before it sends the key again
            self.done.release()
        raise RuntimeError(last or "no answer")

    def _agent(self, i_traj: int) -> None:
        traj = AGENTS[i_traj]
        ctx: list[int] = []
        for i, turn in enumerate(traj.turns):
            prompt = ctx + append_token_ids(traj, i, VOCAB).tolist()
            body = {"model": "tiny", "prompt": prompt, "max_tokens": turn.gen,
                    "temperature": 0, "return_token_ids": True}
            headers = {"X-Session-Id": f"{self.run}-agent-{traj.agent_id}",
                       "Idempotency-Key": f"{self.run}-{traj.agent_id}-{i}"}
            key = (traj.agent_id, i)
            try:
                out = self.send(body, headers)
            except RuntimeError as err:
                with self._lock:
                    self.errors[key] = str(err)
                    self.done.notify_all()
                return
            with self._lock:
                self.tokens[key] = tuple(out)
                self.answers[key] = self.answers.get(key, 0) + 1
                self.answered_at[key] = time.monotonic()
                self.bodies[key] = (body, headers)
                self.done.notify_all()
            ctx = prompt + out

    def start(self) -> list[threading.Thread]:
        threads = [threading.Thread(target=self._agent, args=(n,), daemon=True)
                   for n in range(len(AGENTS))]
        for th in threads:
            th.start()
        return threads

    def wait_answered(self, n: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._lock:
            while len(self.tokens) + len(self.errors) < n:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.done.wait(left)
        return True


def _decision_seq(http: httpx.Client, url: str) -> int:
    got = http.get(f"{url}/api/v1/decisions", params={"since": -1}).json()["decisions"]
    return max((int(d["seq"]) for d in got), default=0)


def run_scheduler_kill(tmp: Path, kill_after: int = 3, take_ctl_port: bool = False
                       ) -> FaultRow:
    """kill -9 the scheduler of a joined 1P1D cluster mid-run, restart it; the row.

    ``take_ctl_port``: something else holds the control port when the scheduler restarts,
    so the nodes cannot reconnect and must join again.
    """
    t_start = time.monotonic()
    env = launch_env(tmp)
    run = tmp / "run"
    store = tmp / "store"
    port = free_port()
    sched_args = ("--role", "scheduler", "--port", str(port), "--store", str(store),
                  "--json")
    procs = Procs(env)
    clients: Clients | None = None
    squatter: Any = None
    try:
        sched = procs.start(*sched_args)
        state = _json_line(sched, START_S)
        url, token_file = state["url"], state["token_file"]
        token = Path(token_file).read_text().strip()
        nodes = {name: procs.join(role, name, port, token_file)
                 for name, role in (("p0", "prefill"), ("d0", "decode"))}
        joined = {name: _json_line(p, START_S) for name, p in nodes.items()}
        clients = Clients(url, token, "restart")
        threads = clients.start()
        wanted = sum(len(t.turns) for t in AGENTS)
        assert clients.wait_answered(kill_after, TURN_DEADLINE_S), "no turn answered"
        t_kill = time.monotonic()
        os.killpg(sched.pid, signal.SIGKILL)  # the scheduler alone: nodes keep running
        sched.wait(30)
        answered_at_kill = len(clients.tokens)
        if take_ctl_port:
            saved = ckpt.read(run / "dualpath" / f"checkpoint-{port}.json")
            assert saved is not None
            host, _, ctl_port = str(saved["scheduler"]["address"]).rpartition(":")
            squatter = listen(host.removeprefix("tcp://"), int(ctl_port))
        sched2 = procs.start(*sched_args)
        state2 = _json_line(sched2, START_S)
        t_ready = time.monotonic()
        restored = state2.get("restored") or {}
        assert Path(state2["token_file"]).read_text().strip() == token  # same token kept
        after = [t for k, t in clients.answered_at.items()] if clients.wait_answered(
            wanted, TURN_DEADLINE_S * 2) else []
        recovered = [t for t in after if t > t_ready]
        for th in threads:
            th.join(TURN_DEADLINE_S)
        # a resubmitted answered key comes back from the kept answer: no second run
        http = clients.http
        seq = _decision_seq(http, url)
        replayed = 0
        for key, (body, headers) in list(clients.bodies.items())[:4]:
            resp = http.post(f"{url}/v1/completions", json=body, headers=headers)
            if resp.status_code == 200 and tuple(
                    resp.json()["choices"][0]["token_ids"]) == clients.tokens[key]:
                replayed += 1
        rerun = _decision_seq(http, url) - seq
        status = http.get(f"{url}/api/v1/status").json()
        indexes = {n: http.get(f"{url}/api/v1/join/{n}").json().get("node") for n in nodes}
        prompt = append_token_ids(AGENTS[0], 0, VOCAB).tolist()[::-1]
        try:
            after_out = clients.send({"model": "tiny", "prompt": prompt, "max_tokens": 4,
                                      "temperature": 0, "return_token_ids": True},
                                     {"X-Session-Id": "after-the-fault"})
            serving = after_out == _model().generate(prompt, 4)
        except RuntimeError:
            serving = False
        ref = reference()
        lost = wanted - len(clients.tokens)
        wrong = sum(1 for k, v in clients.tokens.items() if ref[k] != v)
        twice = sum(1 for n in clients.answers.values() if n > 1)
        temp = [p for p in store.rglob("*.tmp")] if store.exists() else []
        detected = (min(recovered) - t_kill) if recovered else None
        alive_nodes = all(p.poll() is None for p in nodes.values())
        return FaultRow(
            "kill -9 the scheduler, restart it", detected, RECOVERY_LIMIT_S, lost,
            lost == 0 and wrong == 0, wrong, len(temp), serving and alive_nodes,
            len(clients.tokens), int(status.get("queue", {}).get("requeued_total") or
                                     restored.get("requeued", 0)),
            {"restart_ready_s": round(t_ready - t_kill, 3), "restored": restored,
             "answered_before_kill": answered_at_kill, "client_retries": clients.retries,
             "answered_twice": twice, "replayed_keys": replayed,
             "decisions_on_replay": rerun,
             "nodes_rejoined": sum(1 for n, j in joined.items() if indexes[n] != j["index"]),
             "join_s": {n: j["join_s"] for n, j in joined.items()},
             "errors": dict(list({f"{a}/{i}": e for (a, i), e in
                                  clients.errors.items()}.items())[:3])},
            time.monotonic() - t_start)
    finally:
        if clients is not None:
            clients.http.close()
        procs.close()
        if squatter is not None:
            squatter.close()


def scheduler_kill_row() -> FaultRow:
    """The ``scheduler_kill`` row in a temporary directory (removed after)."""
    with tempfile.TemporaryDirectory(prefix="dualpath-restart-") as tmp:
        return run_scheduler_kill(Path(tmp))


#: bench/reliability.py --faults: fault name -> its row (beside test_fault_matrix.FAULTS)
SCHEDULER_FAULTS = {"scheduler_kill": scheduler_kill_row}


@pytest.fixture
def scratch() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="dualpath-restart-") as tmp:
        yield Path(tmp)


@pytest.mark.e2e
def test_scheduler_kill_restart_loses_nothing(scratch: Path) -> None:
    row = run_scheduler_kill(scratch)
    assert row.lost_turns == 0 and not row.detail["errors"], row
    assert row.tokens_identical and row.served_corrupt == 0, row
    assert row.detail["answered_twice"] == 0, row
    assert row.detail["replayed_keys"] == 4 and row.detail["decisions_on_replay"] == 0, row
    assert row.detected_s is not None and row.detected_s <= row.limit_s, row
    assert row.serving_after and row.temp_files == 0, row
    assert row.detail["restored"]["engines"] == 2, row  # the nodes reconnected, not re-joined
    assert row.detail["restored"]["control_port_kept"], row
    assert row.detail["nodes_rejoined"] == 0, row


@pytest.mark.e2e
@SLOW
def test_nodes_join_again_when_the_control_port_is_taken(scratch: Path) -> None:
    """The restarted scheduler cannot bind its old control port: the nodes' engines are
    silent to it, each node's agent notices and joins again, and still no turn is lost."""
    row = run_scheduler_kill(scratch, take_ctl_port=True)
    assert not row.detail["restored"]["control_port_kept"], row
    assert row.detail["nodes_rejoined"] == 2, row
    assert row.lost_turns == 0 and row.tokens_identical, row
    assert row.detail["answered_twice"] == 0 and row.serving_after, row


@pytest.mark.e2e
def test_embedded_launch_restarts_from_its_checkpoint(scratch: Path) -> None:
    """``dualpath launch`` (scheduler and engines in one launcher) killed with -9: its
    engines die with it; launched again, it restores the checkpoint, runs the turns it owed
    on new engines, and answers a finished key from the kept answer."""
    env = launch_env(scratch)
    run = scratch / "run"
    port = free_port()
    args = ("--port", str(port), "--store", str(scratch / "store"), "--json")
    procs = Procs(env)
    model = _model()
    prompts = [append_token_ids(AGENTS[i], 0, VOCAB).tolist() for i in range(3)]
    try:
        first = procs.start(*args)
        state = _json_line(first, START_S)
        url = state["url"]
        token = Path(state["token_file"]).read_text().strip()
        clients = Clients(url, token, "embedded")
        bodies = [({"model": "tiny", "prompt": p, "max_tokens": 4, "temperature": 0,
                    "return_token_ids": True}, {"Idempotency-Key": f"e-{i}"})
                  for i, p in enumerate(prompts)]
        out0 = clients.send(*bodies[0])
        assert out0 == model.generate(prompts[0], 4)
        checkpoint = run / "dualpath" / f"checkpoint-{port}.json"
        wait_until(lambda: (ckpt.read(checkpoint) or {}).get("live", {}).get(
            "keys", [{}])[0].get("result") is not None, 30,  # (written within 0.25 s)
            "a checkpoint with the answer", interval=0.05)
        engines = psutil.Process(first.pid).children(recursive=True)
        later: list[list[int]] = []
        sender = threading.Thread(target=lambda: later.append(clients.send(*bodies[1])),
                                  daemon=True)
        sender.start()  # in flight (or about to be) when the launcher dies
        os.kill(first.pid, signal.SIGKILL)  # the launcher only
        first.wait(30)
        _, alive = psutil.wait_procs(engines, timeout=30)
        assert not alive, alive  # the engines died with their launcher (their watchdog)
        second = procs.start(*args)
        state2 = _json_line(second, START_S)
        assert state2["restored"] is not None and state2["restored"]["engines"] == 0
        sender.join(TURN_DEADLINE_S)
        assert later == [model.generate(prompts[1], 4)]
        seq = _decision_seq(clients.http, url)
        assert clients.send(*bodies[0]) == out0  # the kept answer...
        assert _decision_seq(clients.http, url) == seq  # ...not a second run
        assert clients.send(*bodies[2]) == model.generate(prompts[2], 4)  # still serving
        clients.http.close()
    finally:
        procs.close()
    assert not list((run / "dualpath").glob("checkpoint-*"))  # a clean stop removes it


def test_checkpoint_write_failure_is_said_once_and_counted(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A checkpoint that cannot be written (its directory gone) is counted in ``stats`` and
    warned about (once, not on every try); once the directory is back it writes again."""
    sig = [0]
    writer = ckpt.Checkpointer(tmp_path / "gone" / "checkpoint-5.json", lambda: {"live": {}},
                               lambda: sig[0])
    with caplog.at_level("WARNING", logger="dualpath_cli.runtime.checkpoint"):
        assert not writer.write_now() and not writer.write_now()
    assert writer.stats()["errors"] == 2 and "FileNotFoundError" in writer.stats()[
        "last_error"]
    assert len([r for r in caplog.records if "not written" in r.getMessage()]) == 1
    (tmp_path / "gone").mkdir()
    assert writer.write_now() and writer.stats()["writes"] == 1
    assert ckpt.read(tmp_path / "gone" / "checkpoint-5.json") == {"live": {}}
