"""Simulator: event order, link conservation, policy ordering, determinism, online rules."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from dualpath_cli.core.calibration import SimCalibration, calibrate_from_measurements
from dualpath_cli.core.profiles import HARDWARE_PROFILES, MODEL_PROFILES
from dualpath_cli.errors import ConfigError, UsageError
from dualpath_cli.sim import (
    SimSetup,
    Simulation,
    find_capacity,
    get_sim_policy,
    make_setup,
    simulate_online,
    synthetic_plans,
)
from dualpath_cli.sim.events import EventLoop
from dualpath_cli.sim.links import FifoLink, Flow, SharedLink
from dualpath_cli.sim.metrics import SimResult, latency_stats
from dualpath_cli.sim.online import StopRule


def test_events_run_in_time_order_and_fifo_on_ties() -> None:
    loop = EventLoop()
    seen: list[str] = []
    k = loop.register(seen.append)
    loop.at(2.0, k, "c")
    loop.at(1.0, k, "a")
    loop.at(1.0, k, "b")
    loop.at(0.5, k, "first")
    assert loop.run() == 2.0
    assert seen == ["first", "a", "b", "c"]


def test_event_in_the_past_runs_now_and_until_stops() -> None:
    loop = EventLoop()
    seen: list[float] = []
    k = loop.register(lambda _: seen.append(loop.now))
    loop.at(5.0, k)
    loop.run(until=1.0)
    assert loop.now == 1.0 and seen == []
    loop.at(0.0, k)  # in the past: clamped to now
    loop.run()
    assert seen == [1.0, 5.0]


def test_shared_link_splits_bandwidth_fairly_and_conserves_bytes() -> None:
    link = SharedLink(100.0)
    a, b = Flow(100.0, 0.0, "a", 0), Flow(300.0, 0.0, "b", 1)
    link.add(0.0, a)
    link.add(0.0, b)
    t1 = link.next_finish()
    assert t1 == pytest.approx(2.0)  # each gets 50 B/s
    assert [f.token for f in link.pop_done(t1)] == ["a"]
    t2 = link.next_finish()
    assert t2 == pytest.approx(4.0)  # b alone: 200 B left at 100 B/s
    assert [f.token for f in link.pop_done(t2)] == ["b"]
    assert link.delivered == pytest.approx(400.0)
    assert link.busy_time == pytest.approx(4.0)


def test_late_joiner_slows_the_first_flow() -> None:
    link = SharedLink(10.0)
    link.add(0.0, Flow(100.0, 0.0, "a", 0))
    link.add(5.0, Flow(100.0, 5.0, "b", 1))  # a has 50 left, now at 5 B/s
    assert link.next_finish() == pytest.approx(15.0)
    link.pop_done(15.0)
    assert link.next_finish() == pytest.approx(20.0)
    link.pop_done(20.0)
    assert link.delivered == pytest.approx(200.0) and not link.flows


def test_fifo_link_serialises() -> None:
    link = FifoLink(10.0)
    assert link.send(0.0, 50.0) == pytest.approx(5.0)
    assert link.send(1.0, 10.0) == pytest.approx(6.0)
    assert link.send(10.0, 10.0) == pytest.approx(11.0)


def _io_bound(policy: str) -> SimSetup:
    hw = replace(HARDWARE_PROFILES["hopper"], snic_bandwidth=4e9)  # storage-starved
    return SimSetup(MODEL_PROFILES["ds660b"], hw, 2, 4, get_sim_policy(policy))


@pytest.fixture(scope="module")
def small_plans():  # type: ignore[no-untyped-def]
    return synthetic_plans(16_000, 96, 3)


def test_oracle_beats_dualpath_beats_basic_when_io_bound(small_plans) -> None:  # type: ignore[no-untyped-def]
    jct = {p: Simulation(_io_bound(p), small_plans).run_offline().jct
           for p in ("basic", "dualpath", "oracle")}
    assert jct["oracle"] <= jct["dualpath"] < jct["basic"]
    assert jct["basic"] / jct["dualpath"] > 1.3


def test_every_turn_is_simulated_and_reads_follow_the_policy(small_plans) -> None:  # type: ignore[no-untyped-def]
    turns = sum(p.num_turns for p in small_plans)
    basic = Simulation(_io_bound("basic"), small_plans).run_offline()
    dual = Simulation(_io_bound("dualpath"), small_plans).run_offline()
    oracle = Simulation(_io_bound("oracle"), small_plans).run_offline()
    assert basic.turns == dual.turns == oracle.turns == turns
    assert basic.read_tokens_de_side == 0 and basic.read_tokens_pe_side > 0
    assert dual.read_tokens_de_side > 0
    assert dual.read_tokens_pe_side + dual.read_tokens_de_side == basic.read_tokens_pe_side
    assert oracle.read_tokens_pe_side == oracle.read_tokens_de_side == 0


def test_runs_are_deterministic(small_plans) -> None:  # type: ignore[no-untyped-def]
    a = Simulation(_io_bound("dualpath"), small_plans).run_offline().to_dict()
    b = Simulation(_io_bound("dualpath"), small_plans).run_offline().to_dict()
    for d in (a, b):
        for k in ("wall_s", "turns_per_s"):
            d.pop(k)
    assert a == b


def test_trace_seed_changes_the_workload() -> None:
    a = synthetic_plans(16_000, 8, 1)
    b = synthetic_plans(16_000, 8, 2)
    assert [p.turns for p in a] != [p.turns for p in b]


def test_online_run_reports_latencies() -> None:
    setup = make_setup("ds660b", "2P4D", "dualpath")
    plans = synthetic_plans(16_000, 80, 1)
    res = Simulation(setup, plans).run_online(0.2, 300.0, warmup=50.0)
    assert res.ttft is not None and res.ttft.count > 0
    assert res.tpot is not None and 0 < res.tpot.mean < 0.2
    assert res.ttst is not None and res.ttst.mean > 0


def test_model_that_does_not_fit_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="no HBM for KV"):
        Simulation(make_setup("ds660b", "1P1D", "dualpath"), synthetic_plans(16_000, 2, 1))


def test_context_larger_than_decode_hbm_is_refused_before_the_run() -> None:
    # Qwen2.5-32B (BF16 weights, 256 KiB of KV per token) on an 80 GB GPU keeps ~26.7K
    # tokens per decode engine; a 64K trace's longest agent cannot fit, and the run must
    # say so when it is built, not when that agent gets there.
    setup = make_setup("qwen32b", "1P2D", "dualpath")
    with pytest.raises(ConfigError, match=r"reaches \d+ tokens of context, more than one "
                       r"decode engine's HBM holds for qwen32b on hopper \(26702 tokens"):
        Simulation(setup, synthetic_plans(64_000, 8, 1))
    assert Simulation(setup, synthetic_plans(16_000, 8, 1)).run_offline().turns > 0


def test_offline_mean_trajectory_time_is_the_mean_of_agent_finishes() -> None:
    sim = Simulation(make_setup("ds27b", "1P1D", "dualpath"), synthetic_plans(16_000, 24, 1))
    res = sim.run_offline()
    ends = sim.agent_end
    assert res.extra["mean_trajectory_s"] == pytest.approx(sum(ends) / len(ends))
    assert min(ends) < res.extra["mean_trajectory_s"] < res.jct == max(ends)


def test_dram_traffic_is_counted_per_node() -> None:
    plans = synthetic_plans(16_000, 24, 1)
    basic = Simulation(make_setup("ds27b", "1P1D", "basic"), plans)
    res = basic.run_offline()
    pe_node, de_node = basic.nodes
    # a PE node's KV goes storage -> buffer -> HBM: every byte read is written, then read out
    assert pe_node.read_bytes > 0
    assert pe_node.dram_bytes == pytest.approx(2 * pe_node.read_bytes)
    # the DE node reads nothing but takes every prompt's whole KV into its buffer and out to
    # HBM, and persists every turn's new tokens (in from the GPU, out to storage)
    tokens = 0
    for plan in plans:
        context = 0
        for turn in plan.turns:
            append, gen = max(1, turn.append), max(1, turn.gen)
            tokens += 2 * (context + append) + 2 * (append + gen)
            context += append + gen
    assert de_node.read_bytes == 0
    assert de_node.dram_bytes == pytest.approx(tokens * basic.cost.kv_bytes_per_token)
    busiest = max(pe_node.dram_bytes, de_node.dram_bytes)
    assert res.dram_util == pytest.approx(busiest / (basic.cost.dram_bandwidth * res.sim_time))
    assert res.dram_util <= res.dram_peak < 1.0
    oracle = Simulation(make_setup("ds27b", "1P1D", "oracle"), plans)
    assert oracle.run_offline().dram_util == 0.0


def test_a_deployment_too_large_to_build_is_refused_before_it_is_built() -> None:
    """The node limit is checked where the P/D is parsed: nothing is sized from it first."""
    with pytest.raises(UsageError, match="5000P5001D: 10,001 exceeds the limit of 10,000 nodes"):
        make_setup("ds27b", "5000P5001D", "dualpath")


def test_bad_names_are_usage_errors() -> None:
    with pytest.raises(UsageError, match="did you mean 'dualpath'"):
        make_setup(policy="dualpth")
    with pytest.raises(UsageError, match="P/D"):
        make_setup(pd="2X4D")


def test_calibration_from_measurements_replaces_rates() -> None:
    hw, cal = calibrate_from_measurements(HARDWARE_PROFILES["cpu"], achieved_flops=2e9,
                                          decode_step_s=0.01, snic_rate=1e8)
    assert hw.gpu_flops == 2e9 and hw.snic_bandwidth == 1e8 and cal.decode_step_s == 0.01
    with pytest.raises(ConfigError, match="snic_rate"):
        calibrate_from_measurements(HARDWARE_PROFILES["cpu"], snic_rate=0)
    with pytest.raises(ConfigError, match="quota_s"):
        SimCalibration(quota_s=0).validate()


def _rule(samples: list[tuple[float, float]]) -> StopRule:
    rule = StopRule()
    for when, ttft in samples:
        rule.add(when, ttft)
    return rule


def test_stop_rule_steady_state_and_ttft_bound() -> None:
    flat = _rule([(float(t), 1.0) for t in range(0, 2400, 5)])
    assert flat.verdict(2400.0) == "steady"
    assert flat.verdict(1800.0) is None  # nothing 30 minutes before the window yet
    assert flat.verdict(100.0) is None   # not one whole window yet
    rising = _rule([(float(t), 1.0 + t / 1000) for t in range(0, 2400, 5)])
    assert rising.verdict(2400.0) is None  # 3.3 s now against 1.5 s then: not steady
    assert rising.mean(2250.0, 2400.0) == pytest.approx(1.0 + 2322.5 / 1000)
    over = _rule([(float(t), 1.0 if t < 400 else 6.0) for t in range(0, 700, 5)])
    assert over.verdict(400.0) is None and over.verdict(560.0) == "ttft"


def test_online_run_stops_when_ttft_breaks_the_slo() -> None:
    # Qwen 32B on 1P2D at 5 agents/s is far over capacity: TTFT climbs past 4 s at once
    setup = make_setup("qwen32b", "1P2D", "basic")
    res = simulate_online(setup, 5.0, horizon=1800.0, max_len=16_000)
    assert res.stop_reason == "ttft" and res.slo_ok is False
    assert 150.0 <= res.sim_time < 1800.0
    light = simulate_online(setup, 0.05, horizon=300.0, max_len=16_000)
    assert light.stop_reason == "horizon" and light.sim_time == 300.0 and light.slo_ok
    full = simulate_online(setup, 5.0, horizon=300.0, max_len=16_000, early_stop=False)
    assert full.stop_reason == "horizon" and full.sim_time == 300.0 and not full.slo_ok


def _fake(aps: float) -> SimResult:
    ttft = 1.0 if aps <= 0.7 else 9.0
    return SimResult("online", "p", "m", "1P1D", 1, 1, 1.0, math.nan, 1, 1.0, 1.0, 0.5, 0.5,
                     0.5, 0, 0, aps=aps, ttft=latency_stats([ttft]),
                     tpot=latency_stats([0.03]))


def test_capacity_bisection_converges() -> None:
    res = find_capacity(_fake, 0.1, 2.0, steps=10)
    assert 0.69 <= res.aps <= 0.7
    assert find_capacity(_fake, 0.1, 0.5).aps == 0.5
