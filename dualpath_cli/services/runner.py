"""The agentic runner: N agents replay trajectories against a running system.

Turn ``i+1`` is sent when turn ``i`` returns; its prompt is every earlier appended and
generated token plus this turn's appended tokens (ids from ``workload.tokens``, generated
ids are the model's own greedy output). Hits come from the agent's own earlier KV (and a
shared prefix another agent stored), found in the store through the prefix keys.

A trajectory with block chains (a request log's hash ids, ``Trajectory.blocks``) sends each
turn the prompt its chain names instead (``workload.tokens.chain_token_ids``): equal ids are
equal tokens, so the runtime's content-addressed store hits what the log's store held,
within the conversation and across conversations (``workload.prefix_store`` counts the
same hits).

Offline mode starts every agent at its ``start_s`` (a request log's first arrival; t = 0
when it has none) and reports the JCT; online mode starts agents at Poisson arrivals of
``aps`` agents per second and reports TTFT, TTST and TPOT.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from dualpath_cli.cluster.local import EngineFailed, dead_role
from dualpath_cli.cluster.system import RuntimeSystem
from dualpath_cli.core.layout import token_ids
from dualpath_cli.runtime.turns import TurnRequest, TurnResult
from dualpath_cli.workload.tokens import append_token_ids, chain_token_ids
from dualpath_cli.workload.trace_format import DEFAULT_BLOCK_TOKENS
from dualpath_cli.workload.trajectory import Trajectory

__all__ = ["TurnRecord", "RunResult", "ServeTurn", "replay", "run_agents", "percentile",
           "RoleLost"]

#: Seconds between checks, while a turn is awaited, that every role still has an engine.
_CHECK_S = 0.5


@dataclass(frozen=True, slots=True)
class TurnRecord:
    """One served turn."""

    agent: int
    turn: int
    prompt: int
    cached: int
    tokens: tuple[int, ...]
    ttft: float
    ttst: float
    tpot: float
    latency: float
    attempts: int
    pe_tokens: int
    rx_from_pe: int


@dataclass
class RunResult:
    """Everything one run measured."""

    jct: float
    turns: list[TurnRecord] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def tokens_by_turn(self) -> dict[tuple[int, int], tuple[int, ...]]:
        """Generated tokens of every (agent, turn)."""
        return {(t.agent, t.turn): t.tokens for t in self.turns}


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) or NaN when empty."""
    return float(np.percentile(values, q)) if values else float("nan")


def _record(traj: Trajectory, i: int, prompt: int, r: TurnResult) -> TurnRecord:
    gen = len(r.tokens)
    ttst = (r.second_at - r.submitted) if r.second_at else float("nan")
    tpot = (r.done_at - r.first_at) / (gen - 1) if gen > 1 else 0.0
    return TurnRecord(traj.agent_id, i, prompt, r.cached, tuple(r.tokens),
                      r.first_at - r.submitted, ttst, tpot, r.done_at - r.submitted,
                      r.attempts, r.pe_tokens, r.rx_from_pe)


#: Serves one agent turn: ``(trajectory, turn index, prompt token ids, tokens to generate)``
#: to the turn's record; raises on a failed turn (the runner's ``failures`` say which kinds).
ServeTurn = Callable[[Trajectory, int, list[int], int], TurnRecord]


def replay(trajectories: Sequence[Trajectory], serve: ServeTurn, *,
           failures: tuple[type[Exception], ...], aps: float | None = None, seed: int = 0,
           vocab_size: int = 256, on_turn: Callable[[TurnRecord], None] | None = None,
           block_tokens: int = DEFAULT_BLOCK_TOKENS) -> RunResult:
    """Replay ``trajectories`` concurrently through ``serve`` (offline when ``aps`` is None).

    One thread per agent: it waits for its arrival (offline: its ``start_s``), then runs
    its turns in order, each prompt extending the last with the turn's answer, or, for a
    trajectory with block chains, the prompt its chain names (``block_tokens``: tokens one
    id covers, the trace header's). An agent whose turn raises one of ``failures`` stops
    there and the failure is in ``errors``. The in-process runner and the HTTP runner
    (services/remote_runner.py) differ only in ``serve``.
    """
    starts = [t.start_s or 0.0 for t in trajectories]
    if aps is not None:
        gaps = np.random.default_rng(seed).exponential(1.0 / aps, len(trajectories))
        starts = np.cumsum(gaps).tolist()
    result = RunResult(0.0)
    lock = threading.Lock()
    t0 = time.monotonic()

    def agent(k: int, traj: Trajectory) -> None:
        delay = t0 + starts[k] - time.monotonic()
        if delay > 0:
            threading.Event().wait(delay)  # the arrival time itself, not a test sleep
        context: list[int] = []
        for i, turn in enumerate(traj.turns):
            if traj.blocks:
                prompt = chain_token_ids(traj, i, block_tokens, vocab_size).tolist()
            else:
                prompt = context + append_token_ids(traj, i, vocab_size).tolist()
            try:
                rec = serve(traj, i, prompt, turn.gen)
            except failures as err:
                with lock:
                    result.errors.append(f"agent {traj.agent_id} turn {i}: {err}")
                return
            with lock:
                result.turns.append(rec)
            if on_turn:
                on_turn(rec)
            context = prompt + list(rec.tokens)

    threads = [threading.Thread(target=agent, args=(k, t), daemon=True)
               for k, t in enumerate(trajectories)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    result.jct = time.monotonic() - t0
    return result


def run_agents(system: RuntimeSystem, trajectories: Sequence[Trajectory], *,
               aps: float | None = None, seed: int = 0, vocab_size: int = 256,
               on_turn: Callable[[TurnRecord], None] | None = None,
               timeout: float = 600.0,
               block_tokens: int = DEFAULT_BLOCK_TOKENS) -> RunResult:
    """Replay ``trajectories`` on a started in-process ``system`` (see :func:`replay`).

    Args:
        system: a started runtime system.
        trajectories: one per agent.
        aps: online mode arrival rate (agents per second); None = all start at t = 0.
        seed: seeds the Poisson arrivals.
        vocab_size: token-id range of appended tokens.
        on_turn: called after every turn (progress bars).
        timeout: per-turn wait limit in seconds.
        block_tokens: tokens one id of a trajectory's block chains covers.
    """
    roles = {role: system.engine_ids(role) for role in ("prefill", "decode")}
    lost: list[str] = []  # why the run stopped early: a role with no engine left

    def serve(traj: Trajectory, i: int, prompt: list[int], gen: int) -> TurnRecord:
        if lost:
            raise RoleLost(lost[0])
        ticket = system.submit(TurnRequest(traj.agent_id, i, token_ids(prompt), gen))
        deadline = time.monotonic() + timeout
        while True:  # the turn, or a dead role within _CHECK_S, not the whole timeout
            try:
                r = ticket.wait(min(_CHECK_S, max(0.0, deadline - time.monotonic())))
                break
            except TimeoutError:
                reason = lost[0] if lost else dead_role(system.down(), roles)
                if reason is not None:
                    lost.append(reason)
                    raise RoleLost(reason) from None
                if time.monotonic() >= deadline:
                    raise
        return _record(traj, i, len(prompt), r)

    result = replay(trajectories, serve, failures=(TimeoutError, RoleLost), aps=aps,
                    seed=seed, vocab_size=vocab_size, on_turn=on_turn,
                    block_tokens=block_tokens)
    if lost:  # one line for the run, not one per agent
        stopped = [e for e in result.errors if lost[0] in e]
        result.errors = [e for e in result.errors if lost[0] not in e] + [
            f"{lost[0]} ({len(stopped)} agents stopped)"]
    return result


class RoleLost(EngineFailed):
    """Every engine of a role has died during a run: no turn can finish."""
