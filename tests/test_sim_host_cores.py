"""The host-core contention model: engines sharing fewer CPU cores than there are engines."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dualpath_cli.core.calibration import SimCalibration
from dualpath_cli.errors import ConfigError
from dualpath_cli.sim.api import make_setup, simulate_offline
from dualpath_cli.sim.trace import synthetic_plans

PLANS = synthetic_plans(64_000, 64, 3)


def _jct(host_cores: int | None, pd: str = "2P1D", policy: str = "dualpath") -> float:
    setup = make_setup("ds27b", pd, policy)
    setup = replace(setup, calibration=SimCalibration(host_cores=host_cores))
    return simulate_offline(setup, PLANS).jct


def test_plenty_of_cores_changes_nothing() -> None:
    # 24 engines on 1,000 cores never contend: same JCT as the model without a host
    assert _jct(1000) == pytest.approx(_jct(None), rel=1e-9)


def test_fewer_cores_than_engines_slows_the_run() -> None:
    free, one_core = _jct(None), _jct(1)
    assert one_core > 1.5 * free


def test_more_cores_is_never_slower() -> None:
    jcts = [_jct(c) for c in (2, 8, 24)]
    assert jcts[0] >= jcts[1] >= jcts[2]


def test_invalid_host_cores_is_rejected() -> None:
    with pytest.raises(ConfigError, match="host_cores"):
        SimCalibration(host_cores=0).validate()
