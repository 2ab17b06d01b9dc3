"""A process hosting a scheduler collects garbage in fewer, larger passes (its launcher
sets the pace), and a process that chose its own pace keeps it."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from dualpath_cli.cluster.system import RuntimeSystem
from dualpath_cli.runtime.gctune import SCHEDULER_GC_THRESHOLD, pace_gc_for_scheduler
from dualpath_cli.runtime.options import RuntimeOptions


@pytest.fixture(autouse=True)
def _restore_threshold() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)


def test_the_default_pace_is_raised_and_the_older_generations_kept() -> None:
    gc.set_threshold(700, 10, 10)
    pace_gc_for_scheduler()
    assert gc.get_threshold() == (SCHEDULER_GC_THRESHOLD, 10, 10)


@pytest.mark.parametrize("first", [0, SCHEDULER_GC_THRESHOLD * 5])
def test_a_disabled_or_slower_pace_is_kept(first: int) -> None:
    gc.set_threshold(first, 7, 9)
    pace_gc_for_scheduler()
    assert gc.get_threshold() == (first, 7, 9)


def test_building_a_scheduler_leaves_the_process_pace_to_its_owner() -> None:
    """The launcher (cli/local_launch.py, cli/ray_launch.py, cli/bench_cmd.py) paces its
    process; a library that builds a system does not change it behind its caller."""
    gc.set_threshold(700, 10, 10)
    system = RuntimeSystem(RuntimeOptions(prefill_nodes=1, decode_nodes=1, processes=False))
    try:
        assert gc.get_threshold() == (700, 10, 10)
    finally:
        system.close()
