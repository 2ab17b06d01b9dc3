"""bench/control_plane.py's ``--pin``: the emulated cluster kept off the scheduler's CPU."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from dualpath_cli.cluster.system import RuntimeSystem
from dualpath_cli.runtime.options import RuntimeOptions

BENCH = Path(__file__).resolve().parents[1] / "bench" / "control_plane.py"

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(  # e2e: emulated hosts as processes
    not hasattr(os, "sched_setaffinity") or not os.path.isdir("/proc/self/task")
    or len(os.sched_getaffinity(0)) < 2, reason="needs Linux thread affinity and 2 CPUs")]


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> Any:
    spec = importlib.util.spec_from_file_location("bench_control_plane", BENCH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_control_plane", mod)  # dataclasses look it up
    spec.loader.exec_module(mod)
    return mod


def _cpus_of(pid: int) -> dict[int, set[int]]:
    return {int(t): os.sched_getaffinity(int(t)) for t in os.listdir(f"/proc/{pid}/task")}


@pytest.mark.parametrize("how", ["launcher", "scheduler"])
def test_pin_keeps_the_emulated_hosts_off_the_first_cpu(bench: Any, how: str,
                                                        tmp_path: Path) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    before = _cpus_of(os.getpid())
    opts = RuntimeOptions(prefill_nodes=1, decode_nodes=1, gpus_per_node=2,
                          engines="emulated", emulated_model="ds27b", emulated_hosts=2,
                          store_dir=tmp_path)
    try:
        with RuntimeSystem(opts) as system:
            pinned = bench._pin(system, how)
            assert pinned == {"how": how, "first_cpu": cpus[0], "other_cpus": cpus[1:]}
            hosts = system.cluster.host_pids()  # type: ignore[union-attr]
            assert len(hosts) == 2
            for pid in hosts:
                assert set(map(frozenset, _cpus_of(pid).values())) == {frozenset(cpus[1:])}
            sched = system.scheduler._thread.native_id  # type: ignore[union-attr]
            mine = _cpus_of(os.getpid())
            assert mine[sched] == {cpus[0]}
            others = {frozenset(c) for t, c in mine.items() if t != sched}
            assert others == ({frozenset({cpus[0]})} if how == "launcher"
                              else {frozenset(cpus[1:])})
    finally:  # this process's threads back on the CPUs they had (new ones: the main's)
        for tid in _cpus_of(os.getpid()):
            try:
                os.sched_setaffinity(tid, before.get(tid, before[os.getpid()]))
            except ProcessLookupError:
                pass
