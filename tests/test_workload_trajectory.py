"""Trajectory replay lengths (paper Appendix A.3) and truncation at MaxLen."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dualpath_cli.workload.trajectory import Trajectory, Turn, truncate

TRAJ = Trajectory(7, (Turn(100, 10), Turn(20, 5), Turn(30, 1)), token_seed=3)


def test_context_is_sum_of_earlier_appends_and_gens() -> None:
    assert TRAJ.context_lengths() == (0, 110, 135)
    assert [TRAJ.prompt_length(i) for i in range(3)] == [100, 130, 165]
    assert TRAJ.total == 166
    assert (TRAJ.total_append, TRAJ.total_gen, TRAJ.num_turns) == (150, 16, 3)
    assert TRAJ.mean_context() == (0 + 110 + 135) / 3


def test_hit_length_of_next_turn_equals_its_context() -> None:
    # checklist A1: the hit of turn i+1 is len(Context_{i+1}) = prompt_i + gen_i
    for i in range(TRAJ.num_turns - 1):
        assert TRAJ.hit_length(i + 1) == TRAJ.prompt_length(i) + TRAJ.turns[i].gen
        assert TRAJ.hit_length(i + 1) == TRAJ.context_length(i + 1)


def test_turn_index_out_of_range() -> None:
    with pytest.raises(IndexError):
        TRAJ.context_length(3)


def test_truncate_keeps_whole_turns_and_cuts_the_last() -> None:
    cut = truncate(TRAJ, 125)
    assert cut.turns == (Turn(100, 10), Turn(14, 1))
    assert cut.total == 125
    assert (cut.agent_id, cut.token_seed) == (7, 3)
    assert truncate(TRAJ, 500) is TRAJ
    assert truncate(TRAJ, 111).turns == (Turn(100, 10),)  # one token left: turn dropped


turns_st = st.lists(st.builds(Turn, st.integers(1, 500), st.integers(1, 500)), min_size=1,
                    max_size=30)


@given(turns_st, st.integers(2, 5000))
def test_truncate_properties(turns: list[Turn], cap: int) -> None:
    traj = Trajectory(0, tuple(turns))
    cut = truncate(traj, cap)
    assert cut.total <= cap
    assert all(t.append >= 1 and t.gen >= 1 for t in cut.turns)
    n = len(cut.turns)
    assert cut.turns[: n - 1] == traj.turns[: n - 1]
    if traj.total > cap:  # filled up to the cap (a last turn of one token is dropped)
        assert cut.total >= cap - 1
