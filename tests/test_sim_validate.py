"""The runtime-calibration plumbing of bench/validate_sim.py (not the full validation)."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import pytest

from dualpath_cli.core.calibration import SimCalibration, calibrate_from_measurements
from dualpath_cli.core.costs import build_cost_model
from dualpath_cli.core.profiles import HARDWARE_PROFILES, MODEL_PROFILES
from dualpath_cli.runtime.workloads import agentic_workload
from dualpath_cli.sim import SimSetup, Simulation, get_sim_policy, plans_from_trajectories

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def validate() -> ModuleType:
    path = ROOT / "bench" / "validate_sim.py"
    spec = importlib.util.spec_from_file_location("validate_sim", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["validate_sim"] = mod
    spec.loader.exec_module(mod)
    return mod


COMPUTE = {"flops": 2e9, "prefill_overhead_s": 1e-3, "decode_step_s": 2e-3}


@pytest.mark.e2e
def test_predict_uses_the_bench_setup_and_measured_rates(validate: ModuleType) -> None:
    traj = agentic_workload(4, turns=4)
    basic = validate.predict(traj, "1P1D", "basic", COMPUTE)
    dual = validate.predict(traj, "1P1D", "dualpath", COMPUTE)
    assert 0 < dual < basic  # the bench's 7 MB/s storage NICs make basic I/O-bound
    slower = validate.predict(traj, "1P1D", "dualpath", {**COMPUTE, "flops": 2e8})
    assert slower > dual  # a slower measured compute rate predicts a longer run
    assert validate.engines_of("2P1D") == 3 and validate.engines_of("1p2d") == 3


def test_calibrated_hardware_reaches_the_cost_model() -> None:
    hw, cal = calibrate_from_measurements(HARDWARE_PROFILES["cpu"], achieved_flops=3e9,
                                          decode_step_s=0.004, snic_rate=4e6, cnic_rate=5e8,
                                          base=SimCalibration(cnic_model_share=0.0))
    cost = build_cost_model(MODEL_PROFILES["reference"], hw, cal, 1, 2)
    assert cost.flops == 3e9 and cost.snic_rate == 4e6 and cost.cnic_kv_rate == 5e8
    assert cost.decode_step_s(8, 10_000) == 0.004  # measured step replaces the roofline
    assert cost.hbm_bandwidth == HARDWARE_PROFILES["cpu"].hbm_bandwidth
    over = build_cost_model(MODEL_PROFILES["reference"], hw, replace(cal, hbm_bandwidth=1e9),
                            1, 2)
    assert over.hbm_bandwidth == 1e9


def test_full_blocks_only_recomputes_the_partial_block() -> None:
    traj = agentic_workload(2, turns=3, first_append=100, append=64, gen=2)
    plans = plans_from_trajectories(traj)
    hw, cal = calibrate_from_measurements(HARDWARE_PROFILES["cpu"], achieved_flops=1e9)
    results = {}
    for whole in (False, True):
        setup = SimSetup(model=MODEL_PROFILES["reference"], hardware=hw, prefill_nodes=1,
                         decode_nodes=1, policy=get_sim_policy("basic"),
                         calibration=replace(cal, full_blocks_only=whole, block_tokens=64))
        sim = Simulation(setup, plans)
        results[whole] = sim.run_offline()
        assert results[whole].turns == 6
    # turn 2 has 102 tokens of context: 64 hit in whole blocks, 38 recomputed
    assert results[True].jct > results[False].jct
