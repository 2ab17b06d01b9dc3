"""The drill's agent load: a few agents' sessions over the API, and the reference it is held to.

Why its own load instead of ``bench --url``: a fault is injected *under* load and watched
until every surface reports it, however long that takes, so the load runs until it is told
to stop (bounded by a ceiling), not for a fixed number of turns. Each agent replays its
trajectory's turns in order (turn i+1 is sent when turn i returns, its prompt every earlier
token plus this turn's appended ones, as an OpenAI client keeps a conversation) and starts
over in a new session when it is done, so the prompts of every cycle are the same and their
tokens can be compared with one reference cycle run on the healthy cluster (the served model
is deterministic: temperature 0). A turn that fails is a lost turn: the agent records it and
starts its next cycle.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

import httpx

from dualpath_cli.services.remote_runner import RemoteError, complete, server_info
from dualpath_cli.workload.tokens import append_token_ids
from dualpath_cli.workload.trajectory import Trajectory

__all__ = ["LoadTally", "AgentLoad", "drill_agents"]

#: A turn not answered within this is lost (the load never waits unbounded).
TURN_TIMEOUT_S = 60.0
#: An agent whose turn failed waits this long before its next cycle.
RETRY_PAUSE_S = 1.0


def drill_agents(agents: int = 4, turns: int = 3) -> list[Trajectory]:
    """The drill's trajectories: short prompts and outputs, so a cycle takes seconds on a
    loaded host, and turns > 0 read their prefix back from the store (the storage faults
    need reads to act on)."""
    from dualpath_cli.runtime.workloads import agentic_workload

    return agentic_workload(agents, turns=turns, first_append=64, append=24, gen=4, seed=3)


@dataclass
class LoadTally:
    """What one stretch of load did: tokens per (agent, turn) of every cycle, and failures."""

    tokens: list[tuple[tuple[int, int], tuple[int, ...]]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def lost(self) -> int:
        """Turns that failed (refused, cut off, timed out)."""
        return len(self.errors)

    def differing(self, reference: dict[tuple[int, int], tuple[int, ...]]) -> int:
        """Turns whose tokens are not the reference's."""
        return sum(1 for key, toks in self.tokens if reference.get(key) != toks)


class AgentLoad:
    """Agents cycling their trajectories against the API at ``url`` until :meth:`stop`.

    Args:
        url: the cluster's API.
        token: its bearer token (``None``: the OpenAI routes are open on loopback).
        trajectories: one agent each.
        vocab_size: the tokenizer's, for the appended token ids.
        ceiling_s: the load stops by itself after this (nothing runs unbounded).
    """

    def __init__(self, url: str, token: str | None, trajectories: Sequence[Trajectory], *,
                 vocab_size: int = 256, ceiling_s: float = 600.0) -> None:
        self.url = url.rstrip("/")
        self.trajectories = list(trajectories)
        self.vocab_size = vocab_size
        self.ceiling_s = ceiling_s
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        n = len(self.trajectories) + 4
        self._client = httpx.Client(headers=headers, timeout=TURN_TIMEOUT_S,
                                    limits=httpx.Limits(max_connections=n,
                                                        max_keepalive_connections=n))
        self._model = ""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._tally = LoadTally()
        self._cycles = 0

    def close(self) -> None:
        """Stop the agents and close the connections."""
        self.stop()
        self._client.close()

    def __enter__(self) -> AgentLoad:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def model(self) -> str:
        """The served model's name (asked once)."""
        if not self._model:
            self._model = server_info(self._client, self.url).model
        return self._model

    def cycle(self, traj: Trajectory, tally: LoadTally) -> None:
        """One pass over ``traj``'s turns in a new session; stops at the first failure."""
        session = f"drill-{uuid.uuid4().hex[:8]}-{traj.agent_id}"
        ctx: list[int] = []
        for i, turn in enumerate(traj.turns):
            prompt = ctx + append_token_ids(traj, i, self.vocab_size).tolist()
            try:
                got = complete(self._client, self.url, self.model(), prompt, turn.gen,
                               session, TURN_TIMEOUT_S).tokens
            except RemoteError as err:
                with self._lock:
                    tally.errors.append(f"agent {traj.agent_id} turn {i}: {err}")
                return
            with self._lock:
                tally.tokens.append(((traj.agent_id, i), tuple(got)))
            ctx = prompt + list(got)

    def reference(self) -> dict[tuple[int, int], tuple[int, ...]]:
        """One cycle of every agent, in parallel, on the (healthy) cluster: the tokens every
        later cycle must repeat.

        Raises:
            RemoteError: a reference turn failed (the cluster is not healthy to begin with).
        """
        tally = LoadTally()
        threads = [threading.Thread(target=self.cycle, args=(t, tally), daemon=True)
                   for t in self.trajectories]
        for th in threads:
            th.start()
        for th in threads:
            th.join(TURN_TIMEOUT_S * (len(self.trajectories[0].turns) + 1))
        if tally.errors:
            raise RemoteError(f"the reference run failed: {tally.errors[0]}")
        return dict(tally.tokens)

    def start(self) -> None:
        """Start every agent cycling (a fresh tally)."""
        self.stop()
        self._stop.clear()
        self._tally = LoadTally()
        self._cycles = 0
        deadline = time.monotonic() + self.ceiling_s

        def run(traj: Trajectory) -> None:
            while not self._stop.is_set() and time.monotonic() < deadline:
                lost = self._tally.lost()
                self.cycle(traj, self._tally)
                with self._lock:
                    self._cycles += 1
                if self._tally.lost() > lost:  # refused: do not hammer a broken cluster
                    self._stop.wait(RETRY_PAUSE_S)

        self._threads = [threading.Thread(target=run, args=(t,), daemon=True,
                                          name=f"drill-agent-{t.agent_id}")
                         for t in self.trajectories]
        for th in self._threads:
            th.start()

    @property
    def cycles(self) -> int:
        """Agent cycles finished since :meth:`start`."""
        with self._lock:
            return self._cycles

    @property
    def turns(self) -> int:
        """Turns answered since :meth:`start`."""
        with self._lock:
            return len(self._tally.tokens)

    def stop(self) -> LoadTally:
        """Let every agent finish the cycle it is in, then return the tally (bounded: a turn
        waits at most its timeout)."""
        self._stop.set()
        for th in self._threads:
            th.join(TURN_TIMEOUT_S * len(self.trajectories[0].turns) + 5)
        self._threads = []
        with self._lock:
            return LoadTally(list(self._tally.tokens), list(self._tally.errors))
