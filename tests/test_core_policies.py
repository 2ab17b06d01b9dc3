"""Named policies and the one-request full decision."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dualpath_cli.core.de_schedule import GroupLoads
from dualpath_cli.core.policies import (
    BUILTIN_POLICIES,
    POLICIES,
    Policy,
    ReadPlan,
    SchedParams,
    decide,
    get_policy,
    random_side,
    read_plan,
    register_policy,
    unregister_policy,
)
from dualpath_cli.core.types import EngineSnapshot, ReadSide, Request, Role
from dualpath_cli.errors import NoAvailableEngine, UsageError

P = SchedParams(alpha=1000, beta=100_000, block_tokens=64)


def pe(eid: int, read_q: int = 0, tok: int = 0) -> EngineSnapshot:
    return EngineSnapshot(eid, node=0, group=0, role=Role.PREFILL, tok=tok, read_q=read_q)


def de(eid: int, read_q: int = 0, tok: int = 0, hbm: int = 1_000_000,
       node: int = 1) -> EngineSnapshot:
    return EngineSnapshot(eid, node=node, group=node, role=Role.DECODE, tok=tok, read_q=read_q,
                          hbm_free=hbm)


def test_registry_names_and_unknown() -> None:
    assert list(BUILTIN_POLICIES) == ["basic", "layerwise", "round-robin", "dualpath", "random",
                                      "split", "seed-select", "oracle"]
    assert set(BUILTIN_POLICIES) <= set(POLICIES)
    with pytest.raises(UsageError, match="did you mean 'dualpath'"):
        get_policy("dualpth")


def test_table_rows_say_layerwise_and_shaping() -> None:
    rows = {n: (p.read_rule, p.layerwise, p.shaped) for n, p in BUILTIN_POLICIES.items()}
    assert rows["basic"] == ("basic", False, True)
    assert rows["layerwise"] == ("basic", True, True)
    assert rows["oracle"] == ("basic", True, False)
    assert rows["dualpath"] == ("dualpath", True, True)
    with pytest.warns(DeprecationWarning, match="use 'round-robin'"):
        assert get_policy("dual-rr") is POLICIES["round-robin"]


def test_register_policy_adds_a_row_and_refuses_a_taken_name() -> None:
    mine = Policy("test-de-only", "DE reads", lambda r, pe, de, p, i: ReadPlan(
        ReadSide.DE, 0, r.cached))
    register_policy(mine)
    try:
        register_policy(mine)  # the same object again: a no-op
        assert get_policy("test-de-only") is mine
        with pytest.raises(UsageError, match="already in the policy table"):
            register_policy(Policy("dualpath", "shadow", mine.plan))
        with pytest.raises(UsageError, match="already in the policy table"):
            register_policy(Policy("dual-rr", "alias", mine.plan))
    finally:
        unregister_policy("test-de-only")
    unregister_policy("dualpath")  # built-in rows cannot be removed
    assert "test-de-only" not in POLICIES and "dualpath" in POLICIES


def test_plans() -> None:
    r = Request(1, 1000, cached=640)
    a, b = pe(0, read_q=500), de(10, read_q=100)
    assert read_plan(get_policy("dualpath"), r, a, b, P).side is ReadSide.DE
    assert read_plan(get_policy("basic"), r, a, b, P) .pe_tokens == 640
    s = read_plan(get_policy("split"), r, a, b, P)
    assert s.side is None and s.pe_tokens + s.de_tokens == 640 and s.split is not None
    seed = get_policy("seed-select")
    assert read_plan(seed, r, a, b, P).side is ReadSide.PE
    assert read_plan(seed, r, pe(0, read_q=5000), b, P).side is ReadSide.DE
    with pytest.raises(NoAvailableEngine):
        read_plan(seed, r, pe(0, read_q=5000), de(10, read_q=5000), P)


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 10_000), st.integers(0, 10**6))
def test_round_robin_alternates(start: int, rid: int) -> None:
    rr = get_policy("round-robin")
    r = Request(rid, 100, cached=64)
    sides = [read_plan(rr, r, pe(0), de(1), P, start + i).side for i in range(6)]
    assert all(x is not y for x, y in zip(sides, sides[1:], strict=False))


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 2**32), st.lists(st.integers(0, 10**9), min_size=1, max_size=50))
def test_random_reproducible_by_seed(seed: int, ids: list[int]) -> None:
    rnd = get_policy("random")
    params = SchedParams(1, 1, seed=seed)
    first = [read_plan(rnd, Request(i, 10, 5), pe(0), de(1), params).side for i in ids]
    again = [read_plan(rnd, Request(i, 10, 5), pe(0), de(1), params).side
             for i in reversed(ids)][::-1]
    assert first == again


def test_random_uses_both_sides_and_depends_on_seed() -> None:
    a = [random_side(1, i) for i in range(200)]
    b = [random_side(2, i) for i in range(200)]
    assert 60 < a.count(ReadSide.PE) < 140 and a != b


def test_decide_end_to_end() -> None:
    pes = [pe(0, read_q=300, tok=50), pe(1, read_q=300, tok=10)]
    groups = {1: [de(10, read_q=100, node=1)], 2: [de(20, read_q=0, node=2)]}
    loads = GroupLoads({1: 0, 2: 5})
    res = decide(get_policy("dualpath"), Request(7, 1000, cached=640), pes, groups, loads, P)
    d = res.decision
    assert (d.pe_engine, d.de_group, d.de_engine) == (1, 1, 10)
    assert d.plan.side is ReadSide.DE and (d.pe_read_q, d.de_read_q) == (300, 100)
    assert res.de_engines[0].read_q == 740 and res.de_engines[0].hbm_free == 999_000
    assert [e.tok for e in res.pe_engines] == [50, 1010]
    assert res.loads.as_dict() == {1: 1000, 2: 5}
    # inputs untouched
    assert pes[1].tok == 10 and groups[1][0].read_q == 100 and loads.as_dict()[1] == 0


def test_decide_raises_when_nothing_fits() -> None:
    groups = {1: [de(10, hbm=10)]}
    with pytest.raises(NoAvailableEngine, match="overloaded"):
        decide(get_policy("dualpath"), Request(1, 100), [pe(0, tok=P.beta + 1)], groups,
               GroupLoads({1: 0}), P)
    with pytest.raises(NoAvailableEngine, match="HBM"):
        decide(get_policy("dualpath"), Request(1, 100), [pe(0)], groups,
               GroupLoads({1: 0}), P)


def test_policy_names_match_config_choices() -> None:
    from dualpath_cli.config.schema import READ_SIDE_POLICIES

    assert tuple(BUILTIN_POLICIES) == READ_SIDE_POLICIES
