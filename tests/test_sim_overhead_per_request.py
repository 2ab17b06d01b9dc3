"""The prefill overhead per request of a batch (``SimCalibration.overhead_per_request``).

The embedded runtime runs each request of a prefill batch as its own forward, so batching
turns saves none of the fixed cost per forward; a GPU batch pays it once. The twin's
embedded world charges it per request: without that, a compute-bound replay that batches
many turns finished sooner than the runtime did (bench/twin_check.py's after runs).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from dualpath_cli.core.calibration import SimCalibration
from dualpath_cli.sim import Simulation, make_setup
from dualpath_cli.sim.trace import AgentPlan
from dualpath_cli.workload.trajectory import Turn

OVERHEAD = 0.01
PLANS = [AgentPlan((Turn(300 + 7 * i, 4), Turn(40, 4))) for i in range(24)]


def _run(per_request: bool) -> Simulation:
    setup = make_setup("ds27b", "1P1D", "dualpath")
    cal = replace(setup.calibration, prefill_overhead_s=OVERHEAD,
                  overhead_per_request=per_request)
    sim = Simulation(replace(setup, calibration=cal), PLANS)
    sim.run_offline()
    return sim


def test_each_further_request_of_a_batch_pays_the_overhead_again() -> None:
    once, each = _run(False), _run(True)
    turns = sum(p.num_turns for p in PLANS)
    batches = sum(pe.batches for pe in once.pes)  # the node's engines together
    assert batches < turns  # the 24 first turns arrive together: batched
    # every turn pays it with the flag: busy = the compute + one overhead per request,
    # against one per batch (the same batches: the quota packs by predicted compute)
    assert [pe.batches for pe in each.pes] == [pe.batches for pe in once.pes]
    busy = [sum(pe.busy_time for pe in sim.pes) for sim in (once, each)]
    assert busy[1] - busy[0] == pytest.approx(OVERHEAD * (turns - batches), rel=1e-6)


def test_one_request_per_batch_is_the_same_either_way() -> None:
    plans = [AgentPlan((Turn(300, 4), Turn(40, 4)))]
    runs = []
    for flag in (False, True):
        setup = make_setup("ds27b", "1P1D", "dualpath")
        cal = replace(setup.calibration, prefill_overhead_s=OVERHEAD,
                      overhead_per_request=flag)
        runs.append(Simulation(replace(setup, calibration=cal), plans).run_offline().jct)
    assert runs[0] == runs[1]


def test_the_default_is_a_gpu_batch() -> None:
    assert SimCalibration().overhead_per_request is False
