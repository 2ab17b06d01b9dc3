"""The simulator's compiled core (dualpath_cli/compiled.py): which copy runs, and why.

The golden runs (tests/test_sim_speed_golden.py) run in this process on whichever core was
loaded; :func:`test_the_golden_runs_match_on_the_pure_python_core` runs them again in a
process that loads the pure-Python reference, so both are pinned to the same results. With
``DUALPATH_REQUIRE_NATIVE=1`` (CI, which installs a compiler and mypyc) a missing compiled
core fails the suite instead of passing on the pure-Python one unnoticed."""

from __future__ import annotations

import importlib.machinery
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import dualpath_cli.sim  # noqa: F401 - loads the core's modules
from dualpath_cli import compiled

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
import test_sim_speed_golden as g
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
    from test_sim_speed_golden import PINNED

    env = {**os.environ, compiled.PURE_ENV: "1"}
    proc = subprocess.run([sys.executable, "-c", _PURE_GOLDEN], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["core"] == "python"
    assert {k: tuple(v) for k, v in got["runs"].items()} == PINNED
