"""Benchmark isolation (telemetry/hostload.py): autogroup priority and others' CPU.

Why they matter: under autogroup scheduling another session's ``nice`` job takes a fair
share of the machine from the runtime being measured, which read as a 27% simulator miss
(2P1D dualpath) before the script raised its own priority and reported the foreign CPU.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dualpath_cli.telemetry import hostload

STAT = """cpu  100 20 30 500 7 0 5 10 0 0
cpu0 50 10 15 250 3 0 2 5 0 0
intr 12345
"""


def test_busy_seconds_counts_everything_but_idle_and_iowait() -> None:
    # user 100 + nice 20 + system 30 + irq 0 + softirq 5 + steal 10 ticks at 100 Hz
    assert hostload.busy_seconds(STAT, 100.0) == pytest.approx(1.65)
    with pytest.raises(ValueError):
        hostload.busy_seconds("intr 1\n", 100.0)


def test_cpu_priority_boosts_and_restores(tmp_path: Path) -> None:
    group, flag = tmp_path / "autogroup", tmp_path / "enabled"
    group.write_text("/autogroup-7 nice 0\n")
    flag.write_text("1\n")
    with hostload.cpu_priority(True, group, flag) as boosted:
        assert boosted and hostload.autogroup_nice(group) == hostload.BOOST_NICE
    assert hostload.autogroup_nice(group) == 0  # the session's value is given back


def test_cpu_priority_leaves_the_group_alone_when_off_or_unsupported(
        tmp_path: Path) -> None:
    group, flag = tmp_path / "autogroup", tmp_path / "enabled"
    group.write_text("/autogroup-7 nice 0\n")
    flag.write_text("0\n")  # autogroup disabled: nice already works, nothing to do
    with hostload.cpu_priority(True, group, flag) as boosted:
        assert not boosted
    flag.write_text("1\n")
    with hostload.cpu_priority(False, group, flag) as boosted:  # --no-boost
        assert not boosted
    assert group.read_text() == "/autogroup-7 nice 0\n"
    with hostload.cpu_priority(True, tmp_path / "missing", flag) as boosted:
        assert not boosted
    assert not hostload.set_autogroup_nice(-20, tmp_path)  # a directory: not writable


def test_foreign_cpu_is_machine_busy_time_less_our_own(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    stat.write_text(STAT)
    meter = hostload.ForeignCpu(stat)
    meter.tick = 100.0
    meter.start()
    assert meter.stop() == 0.0  # the machine did nothing (our own CPU cannot make it < 0)
    meter.start()
    sum(i * i for i in range(200_000))  # some CPU of our own, which is not foreign
    stat.write_text(STAT.replace("cpu  100", "cpu  100100"))  # 1000 s busy elsewhere
    assert meter.stop() > 0
    meter.stat = tmp_path / "absent"
    meter.start()
    assert meter.stop() is None
