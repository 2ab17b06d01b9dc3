"""Capacity maths: equation (9), the per-link loads behind it, and the working set."""

from __future__ import annotations

import math

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from dualpath_cli.core.capacity import (
    link_loads,
    pd_ratio_range,
    storage_ratio,
    working_set_bytes,
    working_set_tokens,
)
from dualpath_cli.core.profiles import MODEL_PROFILES
from dualpath_cli.errors import UsageError
from dualpath_cli.units import parse_bandwidth

B = parse_bandwidth("400Gbps")  # 50 GB/s
M = parse_bandwidth("500GB/s")


def paper_range():
    return pd_ratio_range(8, storage_ratio(1, B, B), B, M)


def test_paper_testbed_range_is_one_seventh_to_seven_halves() -> None:
    bounds = paper_range()
    assert bounds.storage_ratio == 1.0
    assert bounds.min_ratio == pytest.approx(1 / 7)
    assert bounds.max_ratio == pytest.approx(3.5)
    assert [(b.name, b.value) for b in bounds.upper] == [
        ("de_cnic_read", pytest.approx(6.0)),
        ("de_cnic_write", pytest.approx(3.5)),
        ("de_dram", pytest.approx(3.5)),
    ]
    assert bounds.lower.name == "pe_cnic_write"
    assert bounds.feasible and bounds.pe_cnic_read_ok and bounds.pe_dram_ok


@pytest.mark.parametrize(("p", "d", "inside"), [
    (1, 1, True), (1, 2, True), (2, 1, True), (2, 4, True), (48, 96, True), (44, 88, True),
    (1, 7, True), (7, 2, True),  # exactly on the two edges
    (1, 8, False), (4, 1, False),
])
def test_paper_deployments_inside_the_range(p: int, d: int, inside: bool) -> None:
    assert paper_range().contains(p / d) is inside


def test_constraint_one_is_really_s_at_most_half_g() -> None:
    # The paper argues "since s <= g"; 2Bs/g <= B needs s <= g/2. g=8, s=5 shows the gap.
    bounds = pd_ratio_range(8, 5.0, B, 1e15)
    assert not bounds.pe_cnic_read_ok
    assert not bounds.feasible
    assert pd_ratio_range(8, 4.0, B, 1e15).pe_cnic_read_ok


def test_storage_at_least_gpus_has_no_lower_bound() -> None:
    bounds = pd_ratio_range(2, 2.0, B, M)
    assert math.isinf(bounds.min_ratio)
    assert not bounds.feasible
    assert not bounds.contains(1.0)


def test_dram_bound_binds_when_dram_is_slow() -> None:
    bounds = pd_ratio_range(8, 1.0, B, parse_bandwidth("250GB/s"))
    assert bounds.binding_upper.name == "de_dram"
    assert bounds.max_ratio == pytest.approx(1.0)  # (250/50 - 3)/2


def test_storage_ratio_counts_nics_in_cnic_units() -> None:
    assert storage_ratio(2, parse_bandwidth("200Gbps"), B) == pytest.approx(1.0)
    with pytest.raises(UsageError, match="storage-NIC bandwidth"):
        storage_ratio(1, 0.0, B)


def test_link_loads_for_2p4d() -> None:
    loads = {link.name: link for link in link_loads(2, 4, 8, 1.0, B, M)}
    assert loads["pe_cnic_read"].load == pytest.approx(2 * B / 8)
    assert loads["pe_cnic_write"].load == pytest.approx(B / 8 * 3)  # (Bs/g)(1 + D/P)
    assert loads["de_cnic_read"].load == pytest.approx(B / 8 * 2.5)  # (Bs/g)(P/D + 2)
    assert loads["de_cnic_write"].load == pytest.approx(B / 8 * 2)  # (Bs/g)(2P/D + 1)
    assert loads["pe_dram"].load == pytest.approx(2 * B)
    assert loads["de_dram"].load == pytest.approx(4 * B)  # (3 + 2P/D) sB
    assert loads["de_dram"].utilization == pytest.approx(0.4)
    assert all(link.ok for link in loads.values())


@given(
    g=st.integers(1, 16),
    s=st.floats(0.05, 8.0),
    p=st.integers(1, 64),
    d=st.integers(1, 64),
    dram_ratio=st.floats(0.5, 40.0),
)
def test_range_and_link_loads_agree(g: int, s: float, p: int, d: int,
                                    dram_ratio: float) -> None:
    """A deployment is inside equation (9) exactly when every link keeps up."""
    cnic = 50e9
    dram = dram_ratio * cnic
    bounds = pd_ratio_range(g, s, cnic, dram)
    loads = link_loads(p, d, g, s, cnic, dram)
    utilizations = [link.utilization for link in loads]
    assume(all(abs(u - 1.0) > 1e-6 for u in utilizations))  # stay off the float edge
    assert bounds.contains(p / d) == all(link.ok for link in loads)


def test_working_set_formula() -> None:
    tokens = working_set_tokens(0.45, 3000.0, 56_000)
    assert tokens == pytest.approx(0.45 * 3000 * 56_000 / 2)
    bpt = MODEL_PROFILES["ds660b"].kv_bytes_per_token
    assert bpt == 48_068
    assert working_set_bytes(0.45, 3000.0, 56_000, bpt) == pytest.approx(tokens * 48_068)
    assert working_set_tokens(0.0, 3000.0, 56_000) == 0.0


def test_bad_capacity_inputs_raise_usage_errors() -> None:
    with pytest.raises(UsageError, match="GPUs per node"):
        pd_ratio_range(0, 1.0, B, M)
    with pytest.raises(UsageError, match="DRAM bandwidth"):
        pd_ratio_range(8, 1.0, B, 0.0)
    with pytest.raises(UsageError, match="decode node count"):
        link_loads(1, 0, 8, 1.0, B, M)
    with pytest.raises(UsageError, match="arrival rate"):
        working_set_tokens(-1.0, 10.0, 100)
    with pytest.raises(UsageError, match="KV bytes per token"):
        working_set_bytes(1.0, 10.0, 100, 0)
