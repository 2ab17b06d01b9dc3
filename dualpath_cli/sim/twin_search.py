"""The twin's search: which settings to replay, and which ranks best on the replayed traffic.

Why: an operator asks "what will alpha=X do to *my* traffic" before touching a running
cluster. One dimension at a time around the settings in force (alpha, beta, the compute
quota, the read-side policy; with ``pd`` the P/D splits of the same node count), then the
best value of each dimension together; ranked by predicted JCT, unless the JCT cannot tell
the settings apart because the recorded arrivals set it (:func:`ranking_measure`): then by
the mean trajectory time (each agent from its own first arrival to its last token). Each
candidate is a replay (sim/twin_replay.py :func:`predict`) and its replicates, whose spread
is the band a change must clear to be suggested (:meth:`Suggestion.band`). Nothing in it
reads the clock but the reported ``wall_s``: the same traffic and world give the same answer.
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
           "READ_SIDES", "MIN_GAIN", "RANKINGS", "REPLICATES", "MAX_SETTINGS", "compare"]


#: Read-side policies the search tries (core's policy names; the runtime takes them live).
READ_SIDES = ("dualpath", "round-robin", "split")
#: The narrowest band (:meth:`Suggestion.band`): smaller differences are below what the
#: simulator resolves; a JCT that moves by less under every candidate does not tell them
#: apart.
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
    :func:`ranking_measure`). ``best`` is the best-ranked change that beats today's by more
    than its uncertainty band (:meth:`band`), else today's. ``asked``: the P/D splits the
    caller listed (each is a row even when it loses); ``refused``: the settings the
    simulator would not replay, each as (varied dimension, setting, reason).
    """

    traffic: Traffic
    world: World
    current: Prediction
    ranked: list[Prediction]
    wall_s: float
    skipped: list[str] = field(default_factory=list)
    ranked_by: str = "jct"
    replicates: int = 1
    asked: tuple[str, ...] = ()
    refused: list[tuple[str, Setting, str]] = field(default_factory=list)

    @property
    def best(self) -> Prediction:
        """The setting suggested (today's when no change clears its band)."""
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

    def band(self, p: Prediction) -> float:
        """Half-width of ``p``'s uncertainty band on :meth:`gain` (0 for today's).

        Each replicate replay (sim/twin_replay.py :func:`replicate`: arrivals and compute
        perturbed by seed ``k``, the same for every setting) gives its own change of ``p``
        against today's replicate ``k``; the band is the farthest one lies from the nominal
        change, and never under :data:`MIN_GAIN` (what the simulator resolves).
        """
        if p is self.current:
            return 0.0
        nominal = self.gain(p)
        i = 0 if self.ranked_by == "jct" else 1
        spread = 0.0
        for mine, today in zip(p.replicates, self.current.replicates, strict=False):
            if math.isfinite(mine[i]) and math.isfinite(today[i]) and today[i] > 0:
                spread = max(spread, abs((mine[i] - today[i]) / today[i] - nominal))
        return max(spread, MIN_GAIN)

    def clears(self, p: Prediction) -> bool:
        """Whether ``p`` beats today's by more than its band (only such a change is
        suggested)."""
        g = self.gain(p)
        return p is not self.current and math.isfinite(g) and g < -self.band(p)

    def rows(self) -> list[Prediction]:
        """Every replayed setting, today's included, by the ranking measure (best first)."""
        return sorted(self.ranked, key=lambda p: _order(p, self.ranked_by))

    def runner_up(self) -> Prediction | None:
        """The best-ranked change, whether or not it clears its band (None: none ran)."""
        return next((p for p in self.rows() if p is not self.current), None)

    def why(self, label: Callable[[Setting], str] | None = None) -> str:
        """Why ``best`` is what it is, in one clause (``label`` words a setting by what it
        changes; default: :meth:`Setting.command`'s ``key=value`` pairs)."""
        name = label or self._label
        measure = "JCT" if self.ranked_by == "jct" else "mean trajectory time"
        best = self.best
        if best is not self.current:
            return (f"{name(best.setting)} {self.gain(best):+.1%} {measure} beats today's by "
                    f"more than its band +-{self.band(best):.1%}")
        other = self.runner_up()
        if other is None:
            return "no other setting could be replayed"
        g = self.gain(other)
        if not math.isfinite(g) or g >= 0:
            return f"no setting is predicted better than today's ({self.ranking})"
        return (f"best change {name(other.setting)} {g:+.1%} {measure} is inside its band "
                f"+-{self.band(other):.1%}")

    def _label(self, s: Setting) -> str:
        cur = self.traffic.current
        parts = [f"{k}={v}" for k, v, now in (
            ("alpha", s.alpha, cur.alpha), ("beta", s.beta, cur.beta),
            ("quota", f"{s.quota_s:g}s", f"{cur.quota_s:g}s"),
            ("read_side", s.read_side, cur.read_side)) if v != now]
        return " ".join(([s.pd] if s.pd != cur.pd else []) + parts) or "today's"

    def best_by_dimension(self) -> dict[str, Prediction]:
        """Per varied dimension (``alpha``, ``beta``, ...), its best replay, today's excluded.

        Why: the overall best may change another knob (a read rule that makes alpha moot);
        an operator asking "what alpha?" wants the best that varies alpha alone.
        """
        out: dict[str, Prediction] = {}
        for p in self.rows():  # best first: the first of each dimension is its best
            if p is not self.current and p.dimension not in out:
                out[p.dimension] = p
        return out

    def command(self, p: Prediction) -> str | None:
        """The line that applies ``p`` (None: today's, nothing to apply)."""
        return p.setting.command(self.traffic.current, self.traffic.nodes_per_group)

    def _entry(self, p: Prediction) -> dict[str, Any]:
        band = self.band(p)
        return {**p.to_dict(), "jct_change": self.change(p),
                "mean_trajectory_change": self.trajectory_change(p),
                "band": band, "clears_band": self.clears(p),
                "asked": p.setting.pd in self.asked and p.setting.pd != self.traffic.pd,
                "command": self.command(p)}

    def to_dict(self, top: int = 3) -> dict[str, Any]:
        """Plain form (``--json``): the same recording and arguments give the same object,
        but for ``wall_s``."""
        refused = [{**s.to_dict(), "varied": dim, "asked": dim == "pd" and s.pd in self.asked,
                    "error": why} for dim, s, why in self.refused]
        return {"traffic": self.traffic.to_dict(), "world": self.world.to_dict(),
                "ranked_by": self.ranked_by, "ranking": self.ranking,
                "current": self.current.to_dict(),
                "best": [self._entry(p) for p in self.ranked[:top]],
                "by_dimension": {d: self._entry(p)
                                 for d, p in self.best_by_dimension().items()},
                "decision": "keep" if self.best is self.current else "change",
                "why": self.why(), "apply": self.command(self.best),
                "replicates": self.replicates,
                "rows": [self._entry(p) for p in self.rows()] + refused,
                "searched": len(self.ranked), "skipped": self.skipped, "wall_s": self.wall_s}


def _order(p: Prediction, ranked_by: str) -> tuple[float, float]:
    return (_score(p, ranked_by), p.ttft_mean_s if math.isfinite(p.ttft_mean_s) else 0.0)


def _predict_job(args: tuple[Traffic, World, Setting, str, int, float]) -> Prediction | str:
    """One setting's replays in a worker process (a refused setting comes back as its
    message)."""
    traffic, world, setting, dim, replicates, scale_s = args
    try:
        return predict(traffic, world, setting, dim, replicates=replicates, scale_s=scale_s)
    except UsageError as err:
        return str(err)


#: Processes a search uses when its caller names none (``None``: this machine's cores). The
#: quick test tier sets 1, so that its tests run in one process (tests/tiers.py).
WORKERS: int | None = None
#: Replays per setting: the nominal one and ``REPLICATES - 1`` replicates whose spread is
#: the band (:meth:`Suggestion.band`).
REPLICATES = 3
#: Most settings a search replays besides today's and the P/D splits the caller lists (the
#: search is bounded by a count, not by time, so that it answers the same twice).
MAX_SETTINGS = 40


def suggest(traffic: Traffic, world: World, *, pd: bool | Sequence[str] = False,
            max_settings: int = MAX_SETTINGS, replicates: int = REPLICATES,
            workers: int | None = None,
            on_result: Callable[[Prediction], None] | None = None) -> Suggestion:
    """Search settings for ``traffic`` (module docstring).

    Today's setting and each dimension's candidates (at most ``max_settings``; the listed
    P/D splits always) are independent replays, each with ``replicates - 1`` replicate
    replays for its band, run on ``workers`` processes (default :data:`WORKERS`, else this
    machine's cores; 1, or a caller with other threads running, runs them here; the answer
    is the same either way); then the combination of each dimension's best. Ranked by the
    measure :func:`ranking_measure` picks; the best that beats today's by more than its
    band is suggested (:meth:`Suggestion.band`).
    """
    t0 = time.perf_counter()
    done: dict[tuple[Any, ...], Prediction] = {}
    skipped: list[str] = []
    refused: list[tuple[str, Setting, str]] = []
    asked = tuple(pd) if not isinstance(pd, bool) else ()
    jobs: list[tuple[str, Setting]] = [("current", traffic.current)]
    extra = 0
    for dim, st in candidates(traffic, world, pd=pd):
        if st.key() in {j[1].key() for j in jobs}:
            continue
        if not (dim == "pd" and st.pd in asked):
            if extra >= max_settings:
                skipped.append(f"{dim}: over the limit of {max_settings} settings: "
                               f"{st.to_dict()}")
                continue
            extra += 1
        jobs.append((dim, st))

    def keep(dim: str, st: Setting, got: Prediction | str) -> None:
        if isinstance(got, str):
            skipped.append(f"{dim}: {got}")
            refused.append((dim, st, got))
            return
        done[st.key()] = got
        if on_result is not None and dim != "current":
            on_result(got)

    scale_s = _arrival_scale(traffic, world)

    def job(dim: str, st: Setting) -> tuple[Traffic, World, Setting, str, int, float]:
        return (traffic, world, st, dim, replicates, scale_s)

    if workers is None:
        workers = WORKERS
    n = workers if workers is not None else min(len(jobs), os.cpu_count() or 1)
    if n > 1 and threading.active_count() > 1:
        n = 1  # forking a process with other threads (a served cluster) can deadlock the child
    if n <= 1:
        for dim, st in jobs:
            keep(dim, st, _predict_job(job(dim, st)))
    else:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(n, mp_context=mp.get_context("fork")) as pool:
            futures = [(dim, st, pool.submit(_predict_job, job(dim, st))) for dim, st in jobs]
            for dim, st, fut in futures:  # in the jobs' order: the same answer as in one
                keep(dim, st, fut.result())
    if traffic.current.key() not in done:
        raise UsageError(f"today's setting cannot be replayed: {skipped[0]}")
    current = done[traffic.current.key()]

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
        if combo.key() not in done:
            keep("combined", combo, _predict_job(job("combined", combo)))
    res = Suggestion(traffic, world, current, list(done.values()), 0.0, skipped, ranked_by,
                     max(1, replicates), asked, refused)
    rows = res.rows()
    best = next((p for p in rows if res.clears(p)), current)
    res.ranked = [best, *(p for p in rows if p is not best)]
    res.wall_s = time.perf_counter() - t0
    return res


def _arrival_scale(traffic: Traffic, world: World) -> float:
    """The replicates' arrival scale: today's mean trajectory time (else its JCT)."""
    try:
        nominal = predict(traffic, world, traffic.current)
    except UsageError as err:
        raise UsageError(f"today's setting cannot be replayed: current: {err}") from None
    return (nominal.mean_trajectory_s if math.isfinite(nominal.mean_trajectory_s)
            else nominal.jct_s)


def compare(traffic: Traffic, world: World, proposed: Setting, *,
            replicates: int = REPLICATES) -> Suggestion:
    """Today's setting against ``proposed`` (live ``tune set --dry-run``), each with its
    replicates, ranked by JCT: ``band(ranked row)`` is the proposed change's band and
    ``best`` is the proposal only when it beats today's by more than it.

    Raises:
        UsageError: either setting cannot be replayed.
    """
    t0 = time.perf_counter()
    scale_s = _arrival_scale(traffic, world)
    today = predict(traffic, world, traffic.current, replicates=replicates, scale_s=scale_s)
    after = predict(traffic, world, proposed, "proposed", replicates=replicates,
                    scale_s=scale_s)
    res = Suggestion(traffic, world, today, [today, after], 0.0, replicates=max(1, replicates))
    res.ranked = [after, today] if res.clears(after) else [today, after]
    res.wall_s = time.perf_counter() - t0
    return res


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
