"""Decision classes the read model counts: the PE's C1/C2/C3 and the DE's normal/high-token."""

from __future__ import annotations

import pytest

from dualpath_cli.core.de_schedule import (
    DEClass,
    classify_de,
    de_place,
    pick_de,
    placement_classes,
)
from dualpath_cli.core.pe_fetch import PEClass, classify_pe
from dualpath_cli.core.types import EngineSnapshot, Request, Role


def _de(eid: int, tok: int, hbm: int = 10_000, seq: int = 0) -> EngineSnapshot:
    return EngineSnapshot(eid, 1, 1, Role.DECODE, seq=seq, tok=tok, hbm_free=hbm)


def test_pe_class_labels_follow_the_paper() -> None:
    pe = EngineSnapshot(0, 0, 0, Role.PREFILL, tok=50, read_q=10)
    assert classify_pe(pe, alpha=10, beta=100).label == "C2"
    assert classify_pe(pe, alpha=9, beta=100).label == "C3"
    assert classify_pe(pe, alpha=10, beta=49).label == "C1"
    assert [c.label for c in PEClass] == ["C1", "C2", "C3"]


def test_classify_de_is_the_z_rule() -> None:
    assert classify_de(_de(0, 90), 10, 100.0) is DEClass.NORMAL
    assert classify_de(_de(0, 91), 10, 100.0) is DEClass.HIGH_TOKEN
    assert DEClass.HIGH_TOKEN.value == "high_token"


def test_placement_classes_replay_de_place() -> None:
    # one DE far above the mean: requests go to the normal one until it, too, passes Z
    engines = [_de(0, 0), _de(1, 400)]
    queue = [Request(i, 100) for i in range(5)]
    res = de_place(queue, engines, z_factor=1.0)
    classes = placement_classes(queue, engines, res.assignments, res.z)
    assert len(classes) == len(res.assignments) == 5
    # check each against pick_de's own rule, replayed by hand
    work = [e.copy() for e in engines]
    for r, (_, de), cls in zip(queue, res.assignments, classes, strict=True):
        chosen = pick_de(work, r.length, res.z)
        assert chosen is not None and chosen.engine_id == de
        assert cls is classify_de(chosen, r.length, res.z)
        chosen.tok += r.length
        chosen.hbm_free -= r.length
        chosen.seq += 1
    assert DEClass.NORMAL in classes and DEClass.HIGH_TOKEN in classes


def test_placement_classes_refuses_a_foreign_assignment() -> None:
    with pytest.raises(ValueError, match="not the queue's request"):
        placement_classes([Request(1, 10)], [_de(0, 0)], [(2, 0)], 100.0)
