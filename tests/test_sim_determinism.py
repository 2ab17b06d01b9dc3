"""Simulator results pinned bit for bit: speed work must never change what a run computes.

Every expected value below was computed by the simulator *before* its performance rewrite
(running totals, in-place core fast paths, inlined event handlers), so these tests prove the
rewrite kept each run identical: floats compared with ``==``, not approx. ``agent_end`` is a
SHA-256 over the repr of every agent's finish time, so one changed decision anywhere shows.
If a deliberate model change moves these numbers, recompute them and say why in the commit.
The pinned cases cover every read path, whole-prompt and layerwise prefill, the oracle,
multi-group routing, reads waiting for DRAM buffer space, HBM-bound DE groups, a calibrated
run and an online run; the last test checks the DE fetch's running-total shortcut against
the plain walk of the queue head, with the offered head capped short as well.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable
from dataclasses import replace

import pytest

from dualpath_cli.core.calibration import SimCalibration
from dualpath_cli.core.de_schedule import de_place
from dualpath_cli.core.profiles import HARDWARE_PROFILES, MODEL_PROFILES
from dualpath_cli.sim import (
    SimSetup,
    Simulation,
    fetch,
    get_sim_policy,
    make_setup,
    synthetic_plans,
)


def _digest(values: Iterable[object]) -> str:
    h = hashlib.sha256()
    for v in values:
        h.update(repr(v).encode())
    return h.hexdigest()[:16]


# (model, pd, policy, agents, max_len) -> (jct, turns, events, snic_max_avg, pe_util, de_util,
#                                          read_tokens_pe_side, read_tokens_de_side, agent_end)
OFFLINE = {
    ("ds660b", "2P4D", "dualpath", 64, 64_000): (
        774.07205570151, 10274, 79694, 2.751409617842047, 0.08791524993054327,
        0.7963568204222278, 279661396, 68128053, "082f40a96bd84e66"),
    ("ds660b", "2P4D", "split", 64, 64_000): (
        759.5050996311099, 10274, 92022, 1.6605065984051677, 0.08960293563630138,
        0.8094599636791613, 169835685, 177953764, "26bcbaf6f4f98b4e"),
    ("ds660b", "4P8D", "basic", 96, 32_000): (
        297.2960683365325, 5831, 47191, 4.797341700753011, 0.08730073366474213,
        0.5936878111789438, 104024629, 0, "766e9713b6877662"),
    ("ds660b", "4P8D", "round-robin", 96, 32_000): (
        295.00231134027666, 5831, 46382, 3.171466017462961, 0.07661658319636022,
        0.5947173268817797, 52098280, 51926349, "ac9ca923b101476d"),
    ("ds27b", "2P1D", "oracle", 48, 32_000): (
        65.14866399377077, 2896, 15759, math.nan, 0.03362696991458341, 0.9522217402568318,
        0, 0, "7023ceedc1157ad2"),
    ("ds27b", "1P2D", "layerwise", 48, 32_000): (
        77.84098493001888, 2896, 19412, 3.0, 0.08868556095046896, 0.7777801612024478,
        50636164, 0, "a84cc14c2bba4c6e"),
    # Qwen 32B (FP16 KV) leaves DEs ~27K tokens of HBM: DE fetches are HBM-bound, so the
    # private queues are long and the HBM-bounded head R is shorter than the queue.
    ("qwen32b", "2P1D", "dualpath", 96, 16_000): (
        369.62094400531106, 2914, 25354, 1.3642703207417302, 0.054668790810818824,
        0.865340383242994, 20277514, 5697702, "515f2733b6dbca0b"),
    ("qwen32b", "2P2D", "basic", 96, 16_000): (
        235.92504309461592, 2914, 24479, 2.2511132621626757, 0.10602499306291276,
        0.7197118561735857, 25975216, 0, "85dee04551067b01"),
}


# The same runs on x86-64 hosts whose libm (glibc picks exp/log/pow by CPU features) rounds
# some workload draws differently in the last bit: a few prompt lengths move by a token, and
# every later number with them. Found on the 2026-12-03 session machines (no AVX-512) for the
# four cases below, at the very commit that pinned OFFLINE; the other cases agree on both.
# Each run must still equal one of the two pinned tuples exactly.
OFFLINE_OTHER_LIBM = {
    ("ds660b", "4P8D", "basic", 96, 32_000): (
        297.34606833653254, 5831, 47227, 4.59288885482288, 0.08728605493192804,
        0.5921986812295952, 104024654, 0, "a436acacd78b35ff"),
    ("ds660b", "4P8D", "round-robin", 96, 32_000): (
        295.00231134027666, 5831, 46382, 3.1714661889999904, 0.07661655140364317,
        0.5947172934397289, 52098293, 51926361, "ac9ca923b101476d"),
    ("ds27b", "2P1D", "oracle", 48, 32_000): (
        65.14866399377077, 2896, 15759, math.nan, 0.03362696792610651, 0.9522217402568296,
        0, 0, "6012bc0823eb753a"),
    ("ds27b", "1P2D", "layerwise", 48, 32_000): (
        77.84098493001888, 2896, 19412, 3.0, 0.08868562337445654, 0.7777801359915311,
        50636188, 0, "789c2574d9ea951e"),
}


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def _offline(model: str, pd: str, policy: str, agents: int, max_len: int,
             cal: SimCalibration | None = None) -> tuple[object, ...]:
    sim = Simulation(make_setup(model, pd, policy, calibration=cal),
                     synthetic_plans(max_len, agents, 1))
    r = sim.run_offline()
    return (r.jct, r.turns, r.events, r.snic_max_avg, r.pe_util, r.de_util,
            r.read_tokens_pe_side, r.read_tokens_de_side, _digest(sim.agent_end))


def _check(got: tuple[object, ...], want: tuple[object, ...]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        if isinstance(w, float):
            assert isinstance(g, float) and _same(g, w), (got, want)
        else:
            assert g == w, (got, want)


@pytest.mark.parametrize("case", list(OFFLINE), ids=lambda c: "-".join(map(str, c[:3])))
def test_offline_runs_match_the_pinned_results(case: tuple[str, str, str, int, int]) -> None:
    got = _offline(*case)
    other = OFFLINE_OTHER_LIBM.get(case)
    if other is not None and _equal(got, other):
        return
    _check(got, OFFLINE[case])


def _equal(got: tuple[object, ...], want: tuple[object, ...]) -> bool:
    try:
        _check(got, want)
    except AssertionError:
        return False
    return True


SMALL_BUFFER = {
    "dualpath": (774.17205570151, 10274, 79702, 2.8060277224635053, 0.08790389389550125,
                 0.7965671074363119, 280217351, 67572098, "dc42e4a95223e565"),
    "basic": (859.1705705537221, 10274, 79878, 3.387561912235187, 0.098720843415535,
              0.7316388738821701, 347789449, 0, "e0b70e547a084e6d"),
}


@pytest.mark.parametrize("policy", list(SMALL_BUFFER))
def test_reads_waiting_for_dram_buffer_match_the_pinned_results(policy: str) -> None:
    """A 1 GB DRAM buffer: reads queue behind buffer space, so releases restart them."""
    hw = replace(HARDWARE_PROFILES["hopper"], dram_buffer_bytes=10**9)
    sim = Simulation(SimSetup(MODEL_PROFILES["ds660b"], hw, 2, 4, get_sim_policy(policy)),
                     synthetic_plans(64_000, 64, 1))
    r = sim.run_offline()
    _check((r.jct, r.turns, r.events, r.snic_max_avg, r.pe_util, r.de_util,
            r.read_tokens_pe_side, r.read_tokens_de_side, _digest(sim.agent_end)),
           SMALL_BUFFER[policy])


def test_calibrated_run_matches_the_pinned_result() -> None:
    """Whole-block hits, a measured decode step, prefill overhead and a faster fetch tick."""
    cal = SimCalibration(full_blocks_only=True, decode_step_s=0.03, prefill_overhead_s=0.01,
                         fetch_period_s=0.02)
    _check(_offline("ds27b", "1P2D", "dualpath", 32, 16_000, cal),
           (117.61356653097143, 990, 7414, 2.9089236778655567, 0.02502531139767026,
            0.8158629046272412, 8101184, 305088, "c03041cd8b08d08b"))


def test_online_run_matches_the_pinned_result() -> None:
    sim = Simulation(make_setup("ds660b", "2P4D", "dualpath"), synthetic_plans(16_000, 120, 1))
    r = sim.run_online(0.3, 300.0, warmup=100.0)
    assert r.ttft is not None and r.tpot is not None and r.ttst is not None
    got = (r.jct, r.turns, r.events, r.ttft.mean, r.ttft.p99, r.tpot.mean, r.ttst.mean,
           r.extra["unfinished_turns"], r.extra["oldest_waiting_s"], _digest(sim.samples))
    _check(got, (90.09885955948491, 2312, 17433, 0.17966908924735647, 1.4667805115706334,
                 0.030854984343505955, 0.04318736316905556, 27.0, 0.06352685575114947,
                 "b49684deb3366690"))


class _PlainDEFetch(Simulation):
    """The DE fetch as first written: walk the head, core's copying ``de_place``, adopt copies."""

    def _de_fetch(self, grp) -> None:  # type: ignore[no-untyped-def]
        grp.pending = False
        priv = grp.private
        if not priv:
            return
        free = sum(s.hbm_free for s in grp.snaps if s.healthy)
        head = []
        used = 0
        for r in priv:
            head.append(r.core)
            used += r.length
            if used > free or len(head) >= fetch._DE_HEAD_MAX:
                break
        res = de_place(head, grp.snaps, self.setup.calibration.z_factor)
        grp.snaps = list(res.engines)
        for e, snap in zip(grp.engines, res.engines, strict=True):
            e.snap = snap
        for _rid, eid in res.assignments:
            req = priv.popleft()
            de = self.engines[eid]
            req.de = de
            de.snap.hbm_free -= req.gen
            grp.private_tokens -= req.length
            grp.tok += req.length
            grp.hbm_free -= req.length + req.gen
            self._start_io(req)
        if res.stop_reason == "queue_empty" and priv:
            self._wake(grp, self.K_DE_FETCH)


@pytest.mark.parametrize("head_max", [3, 1])
def test_de_fetch_by_running_totals_equals_walking_the_head(
        head_max: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """HBM-bound DE groups (Qwen 32B), with the offered head also capped very short."""
    monkeypatch.setattr(fetch, "_DE_HEAD_MAX", head_max)
    plans = synthetic_plans(16_000, 96, 1)
    got = {}
    for cls in (Simulation, _PlainDEFetch):
        sim = cls(make_setup("qwen32b", "2P1D", "dualpath"), plans)
        r = sim.run_offline()
        got[cls] = (r.jct, r.events, r.de_util, _digest(sim.agent_end))
    assert got[Simulation] == got[_PlainDEFetch]
