"""The twin's search: which settings to replay, and which ranks best on the replayed traffic.

Why: an operator asks "what will alpha=X do to *my* traffic" before touching a running
cluster. One dimension at a time around the settings in force (alpha, beta, the compute
quota, the read-side policy; with ``pd`` the P/D splits of the same node count), then the
best value of each dimension together; ranked by predicted JCT, unless the JCT cannot tell
the settings apart because the recorded arrivals set it (:func:`ranking_measure`): then by
the mean trajectory time (each agent from its own first arrival to its last token). Each
candidate is a replay (sim/twin_replay.py :func:`predict`).
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from dualpath_cli.errors import UsageError
from dualpath_cli.sim.twin_replay import Prediction, Setting, Traffic, World, predict

if TYPE_CHECKING:
    from dualpath_cli.core.profiles import HardwareProfile

__all__ = ["Suggestion", "suggest", "candidates", "ranking_measure", "proposed_setting",
           "READ_SIDES", "MIN_GAIN", "RANKINGS"]


#: Read-side policies the search tries (core's policy names; the runtime takes them live).
READ_SIDES = ("dualpath", "round-robin", "split")
#: A setting must beat today's predicted JCT (or mean trajectory time, when that ranks) by
#: this fraction to be suggested (smaller differences are below what the simulator
#: resolves); a JCT that moves by less under every candidate does not tell them apart.
MIN_GAIN = 0.01
#: The measures :func:`suggest` ranks by (:func:`ranking_measure`) and how the table and the
#: JSON say which ranked.
RANKINGS = {"jct": "ranked by JCT",
            "mean_trajectory": "ranked by mean trajectory time: arrivals set the JCT"}


def _scaled(value: int, factors: Sequence[float], low: int) -> list[int]:
    out = []
    for f in factors:
        v = max(low, round(value * f))
        if v not in out and v != value:
            out.append(v)
    return out


def _pd_splits(pd: str, hw: HardwareProfile | None = None) -> list[str]:
    """Other P/D splits of the same node count (at least one of each role), within the
    bottleneck-free P/D range of ``hw`` (core/capacity.py, equation 9) when it has one; a
    node type with no bottleneck-free ratio (or unknown NIC rates) keeps every split."""
    from dualpath_cli.config.model import parse_pd
    from dualpath_cli.core.capacity import pd_ratio_range, storage_ratio

    spec = parse_pd(pd)
    total = spec.prefill_nodes + spec.decode_nodes
    splits = [(p, total - p) for p in range(1, total) if p != spec.prefill_nodes]
    if hw is not None and min(hw.snic_bandwidth, hw.cnic_bandwidth, hw.dram_bandwidth) > 0:
        bounds = pd_ratio_range(hw.gpus_per_node, storage_ratio(
            hw.snics_per_node, hw.snic_bandwidth, hw.cnic_bandwidth), hw.cnic_bandwidth,
            hw.dram_bandwidth)
        inside = [(p, d) for p, d in splits if bounds.contains(p / d)]
        if bounds.feasible and inside:
            splits = inside
    return [f"{p}P{d}D" for p, d in splits]


def candidates(traffic: Traffic, world: World, *, pd: bool | Sequence[str] = False
               ) -> list[tuple[str, Setting]]:
    """Settings tried one dimension at a time around the current one, with the varied name.

    ``pd``: True tries the other splits of the same node count (:func:`_pd_splits`); a list
    of P/D strings tries exactly those (today's left out).

    Alpha also tries the paper's window rule for this world (tokens the storage NIC reads
    in 3 s), which a cluster launched with a poor alpha may be far from.
    """
    from dualpath_cli.core.thresholds import tokens_readable

    cur = traffic.current
    bt = world.calibration.block_tokens
    kvpt = world.model.kv_bytes_per_token
    snic = world.hardware.snic_bandwidth * world.hardware.snics_per_node
    paper_alpha = tokens_readable(snic, kvpt, world.calibration.alpha_window_s) if kvpt else 0
    out: list[tuple[str, Setting]] = []
    alphas = _scaled(cur.alpha, (0.0, 0.25, 4.0), 0)
    if paper_alpha and paper_alpha not in alphas and paper_alpha != cur.alpha:
        alphas.append(paper_alpha)
    out += [("alpha", replace(cur, alpha=a)) for a in alphas]
    out += [("beta", replace(cur, beta=b)) for b in _scaled(cur.beta, (0.25, 0.5, 2.0, 4.0), bt)]
    out += [("quota", replace(cur, quota_s=cur.quota_s * f)) for f in (0.5, 2.0)]
    out += [("read_side", replace(cur, read_side=r)) for r in READ_SIDES if r != cur.read_side]
    if pd:
        splits = (_pd_splits(cur.pd, world.hardware if world.kind == "profile" else None)
                  if pd is True else [x for x in pd if x != cur.pd])
        out += [("pd", replace(cur, pd=x)) for x in splits]
    return out


def _score(p: Prediction, ranked_by: str) -> float:
    """``p``'s value of the ranking measure (lower is better; not finite: last)."""
    v = p.jct_s if ranked_by == "jct" else p.mean_trajectory_s
    return v if math.isfinite(v) else math.inf


def ranking_measure(traffic: Traffic, current: Prediction,
                    predictions: Sequence[Prediction]) -> str:
    """The measure that ranks ``predictions`` against today's (a key of :data:`RANKINGS`).

    ``"jct"``, unless the JCT cannot tell the settings apart because the recorded arrivals
    set it: the replay starts agents at their recorded first arrivals, and no candidate's
    predicted JCT differs from today's by more than :data:`MIN_GAIN` (the last agent arrives
    late in the window and the job ends a trajectory after it, whatever the setting). Then
    ``"mean_trajectory"``: each agent's time from its own first arrival to its last token,
    which the settings still move. A candidate whose JCT moves beyond the noise, better or
    worse, says the JCT discriminates (a recording whose work outlasts its arrivals); an
    offline replay (all agents at t = 0) is one job, ranked by its JCT.
    """
    if (not traffic.starts or max(traffic.starts) <= 0
            or not math.isfinite(current.mean_trajectory_s)
            or not math.isfinite(current.jct_s) or current.jct_s <= 0):
        return "jct"
    for p in predictions:
        if p is not current and math.isfinite(p.jct_s) and (
                abs(p.jct_s - current.jct_s) > MIN_GAIN * current.jct_s):
            return "jct"
    return "mean_trajectory"


@dataclass
class Suggestion:
    """The ranked predictions (best first), today's, and what was searched.

    ``ranked_by``: the measure that ranked them (a key of :data:`RANKINGS`,
    :func:`ranking_measure`); the best beats today's on it by :data:`MIN_GAIN`, else it is
    today's.
    """

    traffic: Traffic
    world: World
    current: Prediction
    ranked: list[Prediction]
    wall_s: float
    skipped: list[str] = field(default_factory=list)
    ranked_by: str = "jct"

    @property
    def best(self) -> Prediction:
        """The best setting found (may be the current one)."""
        return self.ranked[0]

    @property
    def ranking(self) -> str:
        """Which measure ranked, in words (``ranked by JCT``, ...)."""
        return RANKINGS[self.ranked_by]

    def change(self, p: Prediction) -> float:
        """Predicted relative JCT change of ``p`` against today's."""
        return (p.jct_s - self.current.jct_s) / self.current.jct_s

    def trajectory_change(self, p: Prediction) -> float:
        """Predicted relative change of ``p``'s mean trajectory time against today's (NaN
        when today's is not known)."""
        now = self.current.mean_trajectory_s
        return (p.mean_trajectory_s - now) / now if now > 0 else math.nan

    def gain(self, p: Prediction) -> float:
        """Predicted relative change of the ranking measure (``ranked_by``) of ``p``."""
        return self.change(p) if self.ranked_by == "jct" else self.trajectory_change(p)

    def best_by_dimension(self) -> dict[str, Prediction]:
        """Per varied dimension (``alpha``, ``beta``, ...), its best replay, today's excluded.

        Why: the overall best may change another knob (a read rule that makes alpha moot);
        an operator asking "what alpha?" wants the best that varies alpha alone.
        """
        out: dict[str, Prediction] = {}
        for p in self.ranked:  # best first: the first of each dimension is its best
            if p is not self.current and p.dimension not in out:
                out[p.dimension] = p
        return out

    def _entry(self, p: Prediction) -> dict[str, Any]:
        return {**p.to_dict(), "jct_change": self.change(p),
                "mean_trajectory_change": self.trajectory_change(p),
                "command": p.setting.command(self.traffic.current)}

    def to_dict(self, top: int = 3) -> dict[str, Any]:
        """Plain form (``--json``)."""
        return {"traffic": self.traffic.to_dict(), "world": self.world.to_dict(),
                "ranked_by": self.ranked_by, "ranking": self.ranking,
                "current": self.current.to_dict(),
                "best": [self._entry(p) for p in self.ranked[:top]],
                "by_dimension": {d: self._entry(p)
                                 for d, p in self.best_by_dimension().items()},
                "searched": len(self.ranked), "skipped": self.skipped, "wall_s": self.wall_s}


def _predict_job(args: tuple[Traffic, World, Setting, str]) -> Prediction | str:
    """One replay in a worker process (a refused setting comes back as its message)."""
    try:
        return predict(*args)
    except UsageError as err:
        return str(err)


#: Processes a search uses when its caller names none (``None``: this machine's cores). The
#: quick test tier sets 1, so that its tests run in one process (tests/tiers.py).
WORKERS: int | None = None


def suggest(traffic: Traffic, world: World, *, pd: bool | Sequence[str] = False,
            budget_s: float = 50.0,
            workers: int | None = None,
            on_result: Callable[[Prediction], None] | None = None) -> Suggestion:
    """Search settings for ``traffic`` (module docstring) within about ``budget_s``.

    Today's setting and each dimension's candidates are independent replays, run on
    ``workers`` processes (default :data:`WORKERS`, else this machine's cores; 1, or a caller
    with other threads running, runs them here); then the
    combination of each dimension's best. Once ``budget_s`` is spent, replays not yet
    started are skipped and listed. Ranked by the measure :func:`ranking_measure` picks
    from the one-dimension replays (the JCT, or the mean trajectory time when arrivals set
    the JCT); the best must beat today's on it by :data:`MIN_GAIN`.
    """
    t0 = time.perf_counter()
    done: dict[tuple[Any, ...], Prediction] = {}
    skipped: list[str] = []
    jobs = [("current", traffic.current)]
    for dim, st in candidates(traffic, world, pd=pd):
        if st.key() not in {j[1].key() for j in jobs}:
            jobs.append((dim, st))

    def keep(dim: str, st: Setting, got: Prediction | str) -> None:
        if isinstance(got, str):
            skipped.append(f"{dim}: {got}")
            return
        done[st.key()] = got
        if on_result is not None and dim != "current":
            on_result(got)

    if workers is None:
        workers = WORKERS
    n = workers if workers is not None else min(len(jobs), os.cpu_count() or 1)
    if n > 1 and threading.active_count() > 1:
        n = 1  # forking a process with other threads (a served cluster) can deadlock the child
    if n <= 1:
        for dim, st in jobs:
            if dim != "current" and time.perf_counter() - t0 > budget_s:
                skipped.append(f"{dim}: over the budget: {st.to_dict()}")
                continue
            keep(dim, st, _predict_job((traffic, world, st, dim)))
    else:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(n, mp_context=mp.get_context("fork")) as pool:
            futures = [(dim, st, pool.submit(_predict_job, (traffic, world, st, dim)))
                       for dim, st in jobs]
            for dim, st, fut in futures:
                if dim != "current" and time.perf_counter() - t0 > budget_s and fut.cancel():
                    skipped.append(f"{dim}: over the budget: {st.to_dict()}")
                    continue
                keep(dim, st, fut.result())
    if traffic.current.key() not in done:
        raise UsageError(f"today's setting cannot be replayed: {skipped[0]}")
    current = done[traffic.current.key()]

    def run(dim: str, st: Setting) -> None:
        if st.key() in done:
            return
        if time.perf_counter() - t0 > budget_s:
            skipped.append(f"{dim}: over the budget: {st.to_dict()}")
            return
        keep(dim, st, _predict_job((traffic, world, st, dim)))

    ranked_by = ranking_measure(traffic, current, list(done.values()))

    def score(p: Prediction) -> float:
        return _score(p, ranked_by)

    best_by_dim: dict[str, Prediction] = {}
    for p in done.values():
        if p.dimension != "current" and score(p) < score(current) and (
                p.dimension not in best_by_dim or score(p) < score(best_by_dim[p.dimension])):
            best_by_dim[p.dimension] = p
    if len(best_by_dim) > 1:
        combo = traffic.current
        for dim, p in best_by_dim.items():
            attr = "quota_s" if dim == "quota" else dim
            combo = replace(combo, **{attr: getattr(p.setting, attr)})
        run("combined", combo)
    ranked = sorted(done.values(), key=lambda p: (score(p), p.ttft_mean_s
                                                  if math.isfinite(p.ttft_mean_s) else 0.0))
    if ranked[0] is not current and score(ranked[0]) > score(current) * (1 - MIN_GAIN):
        ranked.remove(current)  # within the noise of the model: keep what is in force
        ranked.insert(0, current)
    return Suggestion(traffic, world, current, ranked, time.perf_counter() - t0, skipped,
                      ranked_by)


def proposed_setting(traffic: Traffic, world: World, body: dict[str, Any]) -> Setting:
    """``traffic``'s current setting with a PATCH body's values (CLI units) applied, in
    scheduler units as the running cluster would resolve them (api/control.py's rules:
    alpha in tokens, bytes or seconds of reading; beta in tokens; the quota as time).

    Raises:
        UsageError: a value the running scheduler would refuse, with the reason.
    """
    from dualpath_cli.config.quantities import parse_alpha, parse_beta, parse_quota
    from dualpath_cli.core.thresholds import bytes_to_tokens, tokens_readable

    cur = traffic.current
    out = cur
    kvpt = world.model.kv_bytes_per_token
    if "alpha" in body:
        t = parse_alpha(body["alpha"])
        if t.form == "tokens":
            alpha = int(t.amount)
        elif t.form == "bytes":
            alpha = bytes_to_tokens(t.amount, kvpt)
        else:
            snic = traffic.snic_bytes_per_s
            if not snic:
                raise UsageError(f"alpha {body['alpha']!r}: seconds of reading need the "
                                 "storage-NIC bandwidth, and this cluster's is unshaped")
            alpha = tokens_readable(snic, kvpt, t.amount)
        out = replace(out, alpha=alpha)
    if "beta" in body:
        t = parse_beta(body["beta"])
        if t.form != "tokens":
            raise UsageError(f"beta {body['beta']!r}: the running scheduler takes beta in "
                             "tokens (1M, 800000)")
        out = replace(out, beta=int(t.amount))
    if "quota" in body:
        t = parse_quota(body["quota"])
        if t.form == "flops":
            raise UsageError(f"quota {body['quota']!r}: give the quota as time (300ms)")
        out = replace(out, quota_s=float(t.amount))
    if "read_side" in body:
        out = replace(out, read_side=str(body["read_side"]))
    return out
