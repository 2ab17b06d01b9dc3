"""Every field of a run's result pinned before the simulator's speed work (issue 36 part 3).

The expected digests were computed on main at 26b9581, before the hot paths were trimmed
(decode step time per batch size, inlined helpers), so these tests prove the faster event
core computes each run field for field as the old one did: a SHA-256 over the JSON of the
whole result (SNIC series, DRAM, utilisations, hits, latencies; only ``wall_s`` and
``turns_per_s`` left out), beside a few fields readable in a failure. The workloads are built
from an integer generator (no libm draws, so every host computes the same plans) and cover
the read policies, the oracle, layerwise-only prefill, shared prefixes with recorded
arrivals, the hierarchical scheduler, multi-node groups, host-core contention with per-request
overhead and whole-block hits, the dynamic controllers and an online run.

The simulator's core may be compiled (dualpath_cli/compiled.py: mypyc, at install): these
runs use whichever core this process loaded, and
:func:`test_the_golden_runs_match_on_the_pure_python_core` runs them again in a process that
loads the pure-Python reference, so both cores are pinned to the same results. The tests
after it check which core is loaded and why; with ``DUALPATH_REQUIRE_NATIVE=1`` (CI, which
installs a compiler and mypyc) a missing compiled core fails the suite instead of passing on
the pure-Python one unnoticed.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dualpath_cli import compiled
from dualpath_cli.core.calibration import SimCalibration
from dualpath_cli.sim import make_setup, simulate_offline, simulate_online
from dualpath_cli.sim.metrics import SimResult
from dualpath_cli.sim.trace import AgentPlan
from dualpath_cli.workload.trajectory import Turn


def _plans(agents: int, max_len: int, seed: int, shared: bool = False,
           starts: bool = False) -> list[AgentPlan]:
    """Agents from a linear congruential generator: integers only, the same on every host."""
    x = seed * 2654435761 % 2**32 or 1

    def rnd(n: int) -> int:
        nonlocal x
        x = (1103515245 * x + 12345) % 2**31
        return x % n

    out = []
    for a in range(agents):
        turns, ctx = [], 0
        first = 500 + rnd(max_len // 4)
        for k in range(2 + rnd(20)):
            app = first if k == 0 else 50 + rnd(2000)
            gen = 1 + rnd(400)
            if ctx + app + gen > max_len:
                break
            ctx += app + gen
            turns.append(Turn(app, gen))
        segs: tuple[tuple[int, int], ...] = ()
        if shared and a % 3:
            drawn = ((rnd(3), 128 + 64 * rnd(3)), (rnd(2) + 10, 256))
            segs = tuple((i, min(s, first // 4)) for i, s in drawn)
        start = (rnd(600) / 10.0) if starts and a % 2 else None
        out.append(AgentPlan(tuple(turns), segs, start))
    return out


CASES: dict[str, dict[str, Any]] = {
    "2P4D-dualpath": dict(setup=dict(pd="2P4D", policy="dualpath"), plans=(64, 64000, 1)),
    "1P1D-dualpath-ds27b": dict(setup=dict(model="ds27b", pd="1P1D", policy="dualpath"),
                                plans=(24, 32000, 2)),
    "4P8D-dualpath": dict(setup=dict(pd="4P8D", policy="dualpath"), plans=(96, 32000, 3)),
    "2P4D-basic": dict(setup=dict(pd="2P4D", policy="basic"), plans=(64, 64000, 1)),
    "2P4D-split": dict(setup=dict(pd="2P4D", policy="split"), plans=(64, 64000, 1)),
    "4P8D-round-robin": dict(setup=dict(pd="4P8D", policy="round-robin"),
                             plans=(96, 32000, 3)),
    "2P1D-oracle-ds27b": dict(setup=dict(model="ds27b", pd="2P1D", policy="oracle"),
                              plans=(48, 32000, 4)),
    "1P2D-layerwise-ds27b": dict(setup=dict(model="ds27b", pd="1P2D", policy="layerwise"),
                                 plans=(48, 32000, 4)),
    "2P4D-shared-starts": dict(setup=dict(pd="2P4D", policy="dualpath"), plans=(64, 64000, 5),
                               shared=True, starts=True),
    "4P8D-hierarchical": dict(setup=dict(pd="4P8D", policy="dualpath", hierarchical=True,
                                         sub_schedulers=2), plans=(96, 32000, 6), shared=True),
    "4P8D-groups2": dict(setup=dict(pd="4P8D", policy="dualpath", nodes_per_group=2),
                         plans=(96, 32000, 7)),
    "1P2D-host-cores": dict(setup=dict(model="ds27b", pd="1P2D", policy="dualpath"),
                            cal=dict(host_cores=4, overhead_per_request=True,
                                     prefill_overhead_s=0.002, full_blocks_only=True),
                            plans=(32, 16000, 8), shared=True),
    "2P4D-controllers": dict(setup=dict(pd="2P4D", policy="dualpath",
                                        controllers=("alpha", "beta", "quota")),
                             plans=(64, 64000, 9)),
    "2P4D-online": dict(setup=dict(pd="2P4D", policy="dualpath"), plans=(200, 16000, 10),
                        online=0.5, shared=True),
}

# case -> (turns, events, jct_s, hit_tokens, shared_hit_tokens, digest of every field)
PINNED = {
    "1P1D-dualpath-ds27b": (268, 1845, 39.234061113909306, 3027824, 0, "992edf2dc0fc0968"),
    "1P2D-host-cores": (297, 12388, 77.13470499665569, 2136512, 0, "10c63abffe3bd791"),
    "1P2D-layerwise-ds27b": (574, 3902, 40.148355358518245, 6566414, 0, "710ea2caa499e86b"),
    "2P1D-oracle-ds27b": (574, 3694, 41.69925933560992, 6566414, 0, "ce6790bcbb9afe13"),
    "2P4D-basic": (820, 6476, 182.1089291941936, 12806088, 0, "43dc3d8e09b53f7a"),
    "2P4D-controllers": (876, 6999, 176.08671539753703, 14581084, 0, "347dae63de1846a9"),
    "2P4D-dualpath": (820, 6437, 180.73925536402217, 12806088, 0, "73c6e0fb9fce067e"),
    "2P4D-online": (1142, 9102, 56.97392387738568, 7583250, 30656, "e457381e5eb14f4a"),
    "2P4D-shared-starts": (835, 6717, 189.3333013357965, 12884299, 7744, "e0ec4abcd1c5bd06"),
    "2P4D-split": (820, 7250, 180.77576459914218, 12806088, 0, "7154185aad26bf79"),
    "4P8D-dualpath": (884, 7567, 142.47069172926695, 8739964, 0, "491b07634fb6e842"),
    "4P8D-groups2": (1011, 7324, 144.50288473356028, 11775887, 0, "3e16de3d8514d18c"),
    "4P8D-hierarchical": (1102, 8142, 145.0910927480581, 13194058, 0, "58011117841d3b0b"),
    "4P8D-round-robin": (884, 7567, 142.47069172926695, 8739964, 0, "3aca8eb7b01276ae"),
}


def _fields(res: SimResult) -> dict[str, Any]:
    """The result as JSON-able fields (NaN as "nan"), without the two wall-clock ones."""
    d = res.to_dict(series=True)
    d.pop("wall_s")
    d.pop("turns_per_s")
    out: dict[str, Any] = json.loads(json.dumps(d, default=repr).replace("NaN", '"nan"'))
    return out


def _run(name: str) -> dict[str, Any]:
    case = CASES[name]
    kw = dict(case["setup"])
    if "cal" in case:
        kw["calibration"] = SimCalibration(**case["cal"])
    setup = make_setup(**kw)
    plans = _plans(*case["plans"], shared=case.get("shared", False),
                   starts=case.get("starts", False))
    if "online" in case:
        return _fields(simulate_online(setup, case["online"], horizon=300.0, plans=plans))
    return _fields(simulate_offline(setup, plans))


def test_every_case_is_pinned() -> None:
    assert set(CASES) == set(PINNED)


@pytest.mark.parametrize("name", sorted(CASES))
def test_result_fields_match_the_pinned_run(name: str) -> None:
    got = _run(name)
    digest = hashlib.sha256(json.dumps(got, sort_keys=True).encode()).hexdigest()[:16]
    summary = (got["turns"], got["events"], got["jct_s"], got["hit_tokens"],
               got["shared_hit_tokens"], digest)
    assert summary == PINNED[name]


ROOT = Path(__file__).resolve().parent.parent


def test_the_loaded_core_is_one_side_and_says_why() -> None:
    core = compiled.core()
    assert core in ("compiled", "python"), core
    loaded = [sys.modules[m] for m in compiled.MODULES if m in sys.modules]
    assert loaded
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    assert all(str(m.__file__).endswith(suffixes if core == "compiled" else ".py")
               for m in loaded)
    pure, why = compiled._decide()
    assert (core == "python") == pure and compiled.reason() == why
    if os.environ.get(compiled.PURE_ENV, "") not in ("", "0"):
        assert core == "python" and compiled.PURE_ENV in why


@pytest.mark.skipif(os.environ.get("DUALPATH_REQUIRE_NATIVE") != "1"
                    or os.environ.get(compiled.PURE_ENV, "") not in ("", "0"),
                    reason="DUALPATH_REQUIRE_NATIVE=1 (CI) makes the compiled core required")
def test_the_compiled_core_is_required_here() -> None:
    """CI installs a compiler and mypyc before ``pip install -e .``: the core must have been
    compiled and be the one imported, or CI would test only the pure-Python modules."""
    assert compiled.core() == "compiled", compiled.reason()


def _package(tmp_path: Path, built: bool, digest: str | None = None) -> Path:
    """A copy of the core's sources under ``tmp_path``, with stand-in extensions if
    ``built`` and the digest file ``digest`` (``"match"``: the sources' own)."""
    root = tmp_path / "dualpath_cli"
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    for name in compiled.MODULES:
        src = compiled._source(name, compiled._PACKAGE)
        dst = compiled._source(name, root)
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_bytes(src.read_bytes())
        if built:
            dst.with_name(dst.stem + suffix).write_bytes(b"")
    if built:
        (root / ("_simcore__mypyc" + suffix)).write_bytes(b"")
    if digest is not None:
        text = compiled.source_digest(root) if digest == "match" else digest
        (root / compiled.DIGEST_FILE).write_text(text + "\n")
    return root


def test_the_compiled_copy_runs_only_when_built_and_its_sources_are_unchanged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(compiled.PURE_ENV, raising=False)
    assert compiled._decide(_package(tmp_path / "a", built=False)) == (
        True, "not built at install (no compiler or mypyc; pip install -e . builds it)")
    root = _package(tmp_path / "b", built=True, digest="match")
    assert compiled._decide(root) == (False, "compiled at install (mypyc)")
    monkeypatch.setenv(compiled.PURE_ENV, "1")
    assert compiled._decide(root) == (True, f"{compiled.PURE_ENV}=1")
    monkeypatch.setenv(compiled.PURE_ENV, "0")
    assert compiled._decide(root)[0] is False
    # an edited source: its compiled copy is stale, so the sources run
    edited = compiled._source(compiled.MODULES[0], root)
    edited.write_text(edited.read_text() + "\n# edited\n")
    pure, why = compiled._decide(root)
    assert pure and why.startswith("sources changed since the build")
    # one extension missing: none of them runs (a compiled class cannot extend a Python one)
    root = _package(tmp_path / "c", built=True, digest="match")
    ext = compiled._extension(compiled.MODULES[-1], root)
    assert ext is not None
    ext.unlink()
    assert compiled._decide(root) == (
        True, f"incomplete build: {compiled.MODULES[-1]} not compiled")
    assert compiled._decide(_package(tmp_path / "d", built=True))[0] is True  # no digest


def test_the_finder_hands_out_the_sources_when_the_pure_side_was_chosen(
        monkeypatch: pytest.MonkeyPatch) -> None:
    folder = str(compiled._PACKAGE / "sim")
    monkeypatch.setattr(compiled, "_decision", (True, "test"))
    spec = compiled._FINDER.find_spec("dualpath_cli.sim.events", [folder])
    assert spec is not None and spec.origin == str(Path(folder, "events.py"))
    assert compiled._FINDER.find_spec("dualpath_cli.sim.plots", [folder]) is None
    monkeypatch.setattr(compiled, "_decision", (False, "test"))
    assert compiled._FINDER.find_spec("dualpath_cli.sim.events", [folder]) is None


_PURE_GOLDEN = """
import hashlib, json, sys
sys.path.insert(0, "tests")
import test_sim_speed_golden as g  # this file
from dualpath_cli import compiled
out = {}
for name in sorted(g.CASES):
    got = g._run(name)
    digest = hashlib.sha256(json.dumps(got, sort_keys=True).encode()).hexdigest()[:16]
    out[name] = [got["turns"], got["events"], got["jct_s"], got["hit_tokens"],
                 got["shared_hit_tokens"], digest]
print(json.dumps({"core": compiled.core(), "runs": out}))
"""


@pytest.mark.e2e
def test_the_golden_runs_match_on_the_pure_python_core() -> None:
    """The pinned runs on the pure-Python reference (a process with ``DUALPATH_PURE_SIM=1``),
    whichever core this process loaded: the two cores compute the same results."""
    env = {**os.environ, compiled.PURE_ENV: "1"}
    proc = subprocess.run([sys.executable, "-c", _PURE_GOLDEN], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["core"] == "python"
    assert {k: tuple(v) for k, v in got["runs"].items()} == PINNED


def test_the_core_frozen_dataclasses_pickle_and_copy_as_they_were() -> None:
    """Every frozen dataclass of the compiled modules round-trips through pickle and copy
    (compiled, pickle would set its fields one by one, which a frozen class refuses:
    core/frozen.py), and each module's classes are of the side that was loaded."""
    import copy
    import dataclasses
    import importlib
    import pickle

    from dualpath_cli.core.policies import POLICIES, ReadPlan, SchedParams
    from dualpath_cli.core.quota import PrefillWork, QuotaBatch
    from dualpath_cli.core.read_side import SplitRead
    from dualpath_cli.core.types import EngineSnapshot, ReadSide, Request, Role

    setup = make_setup("ds660b", "2P4D", "dualpath")
    examples: list[object] = [
        setup.model, setup.hardware, Request(3, 100, 40),
        EngineSnapshot(1, 0, 0, Role.DECODE, hbm_free=5), PrefillWork(3, 40, 60),
        QuotaBatch((PrefillWork(3, 40, 60),), 0.5, 1),
        SchedParams(1, 2, 1.05, 64, 1.0, 2.0, 7), ReadPlan(ReadSide.PE, 40, 0),
        SplitRead(64, range(0, 1), range(1, 3), 64, 100, 0.5, 0.5), POLICIES["basic"],
    ]
    for obj in examples:
        for twin in (pickle.loads(pickle.dumps(obj)), copy.copy(obj), copy.deepcopy(obj)):
            assert type(twin) is type(obj) and twin == obj
    frozen = {type(o).__name__ for o in examples
              if dataclasses.is_dataclass(o) and type(o).__dataclass_params__.frozen}
    assert len(frozen) >= 9
    for name in compiled.MODULES:
        mod = importlib.import_module(name)
        assert str(mod.__file__).endswith(".py") == (compiled.core() == "python")
