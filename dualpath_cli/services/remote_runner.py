"""The agentic runner over HTTP: replay trajectories against a launched cluster's API.

Why apart from :mod:`~dualpath_cli.services.runner`: ``dualpath bench --url`` measures a live
system through the same door its clients use (``POST /v1/completions``), so queueing in the
HTTP server and the stream are part of every number. The workload is the runner's: turn
``i+1`` is sent when turn ``i`` returns, its prompt every earlier appended and generated token
plus this turn's appended tokens. Prompts travel as token ids and the output comes back as
ids (``return_token_ids``), so each agent's prefix chain is exact (text would not round-trip
through the byte tokenizer); each agent is one session (``X-Session-Id``), i.e. one agent of
the cluster. A trajectory with block chains sends the prompts its chains name, as the
in-process runner does, and the prefix hits are the cluster's own counters (``/metrics``).

Timings are the client's: TTFT from sending the request to the first streamed event (the
server sends it when the runtime reports the first token), the end at the event carrying
the output, TPOT the time between them over ``gen - 1`` tokens. The runtime reports the
second token's time only inside the process, so TTST is not available (NaN) here.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from dualpath_cli.errors import DualPathError
from dualpath_cli.services.bench import SLO, BenchReport, PolicyReport
from dualpath_cli.services.runner import RunResult, TurnRecord, percentile, replay
from dualpath_cli.workload.trace_format import DEFAULT_BLOCK_TOKENS
from dualpath_cli.workload.trajectory import Trajectory

__all__ = ["RemoteError", "RemoteTurn", "ServerInfo", "STORE_COUNTERS", "store_counters",
           "server_info", "complete",
           "run_agents_remote", "summarise_remote", "run_bench_remote"]


class RemoteError(DualPathError):
    """The cluster at the URL could not be driven (unreachable, refused, bad answer)."""


@dataclass(frozen=True, slots=True)
class RemoteTurn:
    """What one streamed completion returned, with the client's timeline (monotonic s)."""

    tokens: list[int]
    cached: int
    sent: float
    first_at: float
    done_at: float


@dataclass(frozen=True, slots=True)
class ServerInfo:
    """What the bench reports about the cluster it drove (``None``: not available)."""

    url: str
    model: str
    pd: str | None = None
    policy: str | None = None
    node_read_bytes: dict[int, int] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    store_tokens: dict[str, float] | None = None
    """The scheduler's store-lookup counters (:data:`STORE_COUNTERS`) when ``/metrics``
    answers: during the run once :func:`run_agents_remote` has taken the difference."""


#: The scheduler's prefix-lookup counters a remote bench reads from ``/metrics`` (name ->
#: the exposition's series): what the runtime itself found in its store.
STORE_COUNTERS = {
    "prompt_tokens": 'dualpath_kv_requested_tokens_total{tier="store"}',
    "hit_tokens": 'dualpath_kv_hit_tokens_total{tier="store"}',
    "cross_tokens": "dualpath_kv_cross_conversation_hit_tokens_total",
}


def store_counters(text: str) -> dict[str, float] | None:
    """:data:`STORE_COUNTERS` read from a Prometheus text exposition (``None``: not all
    there; a series with more labels than named, e.g. an ``instance``, still counts)."""
    got: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        series, _, value = line.rpartition(" ")
        for name, want in STORE_COUNTERS.items():
            base, _, labels = want.partition("{")
            head, _, have = series.partition("{")
            if head == base and all(part in have for part in labels.rstrip("}").split(",")
                                    if part):
                try:
                    got[name] = got.get(name, 0.0) + float(value)
                except ValueError:
                    return None
    return got if len(got) == len(STORE_COUNTERS) else None


def _headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def _reason(resp: httpx.Response) -> str:
    try:
        body = resp.json()
        err = body.get("error") if isinstance(body, dict) else None
        msg = err.get("message") if isinstance(err, dict) else body.get("detail")
        return str(msg or resp.text)
    except (ValueError, AttributeError):
        return resp.text.strip() or resp.reason_phrase


def server_info(client: httpx.Client, url: str) -> ServerInfo:
    """The served model, and the P/D, policy and per-node storage reads when the read API
    answers (it needs the token on a cluster launched with ``--allow-remote``).

    Raises:
        RemoteError: no OpenAI-compatible server at ``url``.
    """
    try:
        resp = client.get(f"{url}/v1/models")
    except httpx.HTTPError as err:
        raise RemoteError(f"cannot reach {url}: {err}") from None
    if resp.status_code != 200:
        raise RemoteError(f"{url}/v1/models answered {resp.status_code}: {_reason(resp)}")
    try:
        model = str(resp.json()["data"][0]["id"])
    except (ValueError, KeyError, IndexError, TypeError):
        raise RemoteError(f"{url}/v1/models did not list a model") from None
    pd = policy = None
    reads: dict[int, int] | None = None
    try:
        st = client.get(f"{url}/api/v1/status")
        if st.status_code == 200:
            pd, policy = st.json().get("pd"), st.json().get("policy")
        nodes = client.get(f"{url}/api/v1/nodes")
        if nodes.status_code == 200:
            reads = {int(n["node"]): int(n.get("storage_read_bytes") or 0)
                     for n in nodes.json()}
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        pass  # the read API is optional for the bench
    counters = None
    try:
        prom = client.get(f"{url}/metrics")
        if prom.status_code == 200:
            counters = store_counters(prom.text)
    except httpx.HTTPError:
        pass  # so is the exposition
    return ServerInfo(url, model, pd, policy, reads, store_tokens=counters)


def complete(client: httpx.Client, url: str, model: str, prompt: list[int], gen: int,
             session: str, timeout: float) -> RemoteTurn:
    """One streamed completion of ``prompt`` (token ids) in ``session``.

    Raises:
        RemoteError: the server refused the turn or the stream broke off.
    """
    body = {"model": model, "prompt": prompt, "max_tokens": gen, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True},
            "return_token_ids": True}
    sent = time.monotonic()
    first_at = done_at = 0.0
    tokens: list[int] | None = None
    cached: int | None = None
    try:
        with client.stream("POST", f"{url}/v1/completions", json=body, timeout=timeout,
                           headers={"X-Session-Id": session}) as resp:
            if resp.status_code != 200:
                resp.read()
                raise RemoteError(f"HTTP {resp.status_code}: {_reason(resp)}")
            for line in resp.iter_lines():
                if not line.startswith("data: "):
                    continue
                now = time.monotonic()
                data = line[6:]
                if data == "[DONE]":
                    break
                event = json.loads(data)
                if "error" in event:
                    raise RemoteError(str(event["error"].get("message", event["error"])))
                if not first_at:
                    first_at = now
                for choice in event.get("choices") or ():  # each chunk: the ids it adds
                    if choice.get("token_ids") is not None:
                        tokens = [*(tokens or ()), *(int(t) for t in choice["token_ids"])]
                        done_at = now
                usage = event.get("usage")
                if usage:
                    cached = int((usage.get("prompt_tokens_details") or {}).get(
                        "cached_tokens") or 0)
    except httpx.HTTPError as err:
        raise RemoteError(f"{type(err).__name__}: {err}") from None
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise RemoteError(f"malformed stream event: {err}") from None
    if tokens is None or cached is None:
        raise RemoteError("the stream ended without the output and usage")
    return RemoteTurn(tokens, cached, sent, first_at, done_at)


def _record(traj: Trajectory, i: int, prompt: int, r: RemoteTurn) -> TurnRecord:
    gen = len(r.tokens)
    tpot = (r.done_at - r.first_at) / (gen - 1) if gen > 1 else 0.0
    return TurnRecord(traj.agent_id, i, prompt, r.cached, tuple(r.tokens),
                      r.first_at - r.sent, math.nan, tpot, r.done_at - r.sent, 1, 0, 0)


def run_agents_remote(url: str, trajectories: Sequence[Trajectory], *,
                      token: str | None = None, aps: float | None = None, seed: int = 0,
                      vocab_size: int = 256,
                      on_turn: Callable[[TurnRecord], None] | None = None,
                      timeout: float = 600.0, block_tokens: int = DEFAULT_BLOCK_TOKENS,
                      ) -> tuple[RunResult, ServerInfo]:
    """Replay ``trajectories`` against the cluster at ``url`` (offline when ``aps`` is None;
    ``block_tokens``: tokens one id of their block chains covers, see services/runner.py).

    Each agent is one session named after this run and the agent, so two runs against one
    cluster never share sessions. The store is keyed by prefix content, though: a second run
    of the same workload finds the first run's blocks, turn 1 included (the in-process bench
    starts every policy on a fresh store). An agent whose turn fails stops there; the
    failure is in ``errors``.

    Returns:
        The run (same shape as the in-process runner's) and what the server said about
        itself, with the per-node storage reads *during* the run when the read API answers.

    Raises:
        RemoteError: no server at ``url``.
    """
    url = url.rstrip("/")
    run_id = uuid.uuid4().hex[:8]
    limits = httpx.Limits(max_connections=len(trajectories) + 4,
                          max_keepalive_connections=len(trajectories) + 4)
    with httpx.Client(headers=_headers(token), limits=limits, timeout=timeout) as client:
        before = server_info(client, url)

        def serve(traj: Trajectory, i: int, prompt: list[int], gen: int) -> TurnRecord:
            session = f"bench-{run_id}-{traj.agent_id}"
            r = complete(client, url, before.model, prompt, gen, session, timeout)
            return _record(traj, i, len(prompt), r)

        result = replay(trajectories, serve, failures=(RemoteError,), aps=aps, seed=seed,
                        vocab_size=vocab_size, on_turn=on_turn, block_tokens=block_tokens)
        after = server_info(client, url)
    reads = None
    if before.node_read_bytes is not None and after.node_read_bytes is not None:
        reads = {n: b - before.node_read_bytes.get(n, 0)
                 for n, b in after.node_read_bytes.items()}
    counted = None
    if before.store_tokens is not None and after.store_tokens is not None:
        counted = {k: v - before.store_tokens.get(k, 0.0)
                   for k, v in after.store_tokens.items()}
    return result, ServerInfo(url, after.model, after.pd, after.policy, reads,
                              store_tokens=counted)


def summarise_remote(run: RunResult, info: ServerInfo, slo: SLO) -> PolicyReport:
    """The in-process bench's policy row, with what HTTP cannot see left NaN/empty."""
    from dualpath_cli.core.balance import max_over_avg

    turns = run.turns

    def pct(attr: str, q: float) -> float:
        vals = [getattr(t, attr) for t in turns if getattr(t, attr) == getattr(t, attr)]
        return percentile(vals, q)

    ttft99, tpot99 = pct("ttft", 99), pct("tpot", 99)
    reads = info.node_read_bytes or {}
    cached = sum(t.cached for t in turns)  # each turn's cached tokens, as the server says
    # the scheduler's own lookup counters when /metrics answered, else per turn (a first
    # turn's hits are another conversation's blocks; deeper shared ones go uncounted)
    counted = info.store_tokens or {
        "prompt_tokens": float(sum(t.prompt for t in turns)), "hit_tokens": float(cached),
        "cross_tokens": float(sum(t.cached for t in turns if t.turn == 0))}
    return PolicyReport(
        info.policy or "remote", run.jct, len(turns), pct("ttft", 50), ttft99, math.nan,
        math.nan, pct("tpot", 50), tpot99,
        ttft99 <= slo.ttft_limit and tpot99 <= slo.tpot_limit, dict(reads),
        max_over_avg(list(reads.values())) if reads else math.nan, math.nan, math.nan,
        cached, math.nan, 0, list(run.errors),
        shared_cached_tokens=int(counted["cross_tokens"]),
        prompt_tokens=int(counted["prompt_tokens"]), hit_tokens=int(counted["hit_tokens"]))


def run_bench_remote(url: str, trajectories: Sequence[Trajectory], *,
                     token: str | None = None, aps: float | None = None,
                     slo: SLO | None = None, on_turn: Callable[[TurnRecord], None] | None = None,
                     timeout: float = 600.0,
                     block_tokens: int = DEFAULT_BLOCK_TOKENS) -> BenchReport:
    """``dualpath bench --url``: the workload against a launched cluster, as a BenchReport.

    The report has one row (the cluster's own policy); setup names the URL, and the fields
    only an in-process run can measure (GPU busy, bubbles, PE batching, TTST) are NaN.
    """
    slo = slo if slo is not None else SLO()
    run, info = run_agents_remote(url, trajectories, token=token, aps=aps, on_turn=on_turn,
                                  timeout=timeout, block_tokens=block_tokens)
    row = summarise_remote(run, info, slo)
    setup = {"url": info.url, "pd": info.pd or "n/a", "model": info.model,
             "policy": info.policy, "agents": len(trajectories),
             "turns": sum(t.num_turns for t in trajectories),
             "prompt_tokens": sum(t.prompt for t in run.turns),
             "mode": "offline" if aps is None else f"online {aps} APS",
             "slo": {"scale": slo.scale, "ttft_s": slo.ttft_limit, "tpot_s": slo.tpot_limit}}
    return BenchReport(setup, [row])
