"""Smoke test: bench/scheduler.py runs end to end at a tiny scale and prints one JSON object."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "scheduler.py"


def test_bench_json_small(capsys: pytest.CaptureFixture[str],
                          monkeypatch: pytest.MonkeyPatch) -> None:
    spec = importlib.util.spec_from_file_location("bench_scheduler", BENCH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_scheduler", mod)  # dataclasses look it up
    spec.loader.exec_module(mod)
    rc = mod.main(["--pe-nodes", "2", "--de-nodes", "4", "--requests", "400", "--warmup",
                   "100", "--single", "50", "--rate", "100", "--cpu", "-1", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["engines"] == 48 and out["requests"] == 300
    assert out["median_us"] > 0 and out["p99_us"] >= out["median_us"]
    assert set(out["stages"]) == {"pe_fetch", "de_route", "de_place", "read_plan"}
    assert mod.main(["--requests", "10", "--warmup", "10"]) == 2
