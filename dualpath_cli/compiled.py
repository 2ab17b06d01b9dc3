"""The simulator's compiled core: which modules mypyc compiles at install, and which copy runs.

Why: a simulated turn is about 114 Python calls spread evenly over the event handlers, so no
hand-trimming makes the simulator much faster; compiled by mypyc (the same source, typed as
mypy checks it) the same handlers run about twice as fast. ``setup.py`` builds
:data:`MODULES` into optional extensions at install (beside the native block reader); the
pure-Python modules stay the reference, and tests/test_sim_speed_golden.py pins both to the
same results.

Which copy runs is decided once, at the first import of one of :data:`MODULES`, by a finder
:func:`install` puts in front of the import system (``dualpath_cli/__init__.py`` calls it,
so it is in place before any of them is imported): the compiled one, unless

- ``DUALPATH_PURE_SIM=1`` asks for the pure-Python reference,
- the build did not happen (no compiler, no mypyc: ``pip install`` still succeeds), or is
  incomplete, or
- a module's source changed since the build (an edited checkout must not run its stale
  compiled copy; ``pip install -e .`` rebuilds): the build records the sources' digest.

Every one of the modules comes from the same side: a compiled class cannot extend a
pure-Python one. :func:`core` says which side was loaded (``bench/sim_speed.py`` reports it)
and :func:`reason` why. This module imports only the standard library: ``setup.py`` reads
:data:`MODULES` from it before the package can be imported.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from importlib.abc import MetaPathFinder
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType

__all__ = ["DIGEST_FILE", "GROUP", "MODULES", "PURE_ENV", "core", "install", "reason",
           "source_digest"]

MODULES: tuple[str, ...] = (
    "dualpath_cli.sim.events",
    "dualpath_cli.sim.links",
    "dualpath_cli.sim.state",
    "dualpath_cli.sim.base",
    "dualpath_cli.sim.fetch",
    "dualpath_cli.sim.kv_reads",
    "dualpath_cli.sim.prefill",
    "dualpath_cli.sim.decode",
    "dualpath_cli.sim.control",
    "dualpath_cli.sim.cluster",
    "dualpath_cli.sim.hierarchy",
    "dualpath_cli.sim.measured",
    "dualpath_cli.core.pe_fetch",
    "dualpath_cli.core.de_schedule",
    "dualpath_cli.core.quota",
    "dualpath_cli.core.costs",
    "dualpath_cli.core.profiles",
    "dualpath_cli.core.types",
    "dualpath_cli.core.policies",
    "dualpath_cli.core.read_side",
)
"""The modules mypyc compiles: the simulator's event core and the core/ functions it calls
on every turn."""

GROUP = "dualpath_cli._simcore"
"""mypyc's name for the modules' shared library (``dualpath_cli/_simcore__mypyc.*.so``):
inside the package, so an editable install finds it as it finds the modules."""

DIGEST_FILE = "_simcore.sources"
"""Written beside the shared library by a successful build: :func:`source_digest` of the
sources it compiled."""

PURE_ENV = "DUALPATH_PURE_SIM"
"""``1``: run the pure-Python modules even where the compiled ones were built."""

_PACKAGE = Path(__file__).resolve().parent
_decision: tuple[bool, str] | None = None  # (pure, why), decided at the first lookup


def _source(name: str, root: Path) -> Path:
    """The ``.py`` file of module ``name`` under the package directory ``root``."""
    return root.joinpath(*name.split(".")[1:]).with_suffix(".py")


def _extension(name: str, root: Path) -> Path | None:
    """The built extension of module ``name`` (a dotted name) under ``root``, if any."""
    base = root.joinpath(*name.split(".")[1:])
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = base.with_name(base.name + suffix)
        if path.is_file():
            return path
    return None


def source_digest(root: Path = _PACKAGE, modules: Sequence[str] = MODULES) -> str:
    """SHA-256 over the sources of ``modules`` (names and texts, in order)."""
    h = hashlib.sha256()
    for name in modules:
        h.update(name.encode())
        h.update(b"\0")
        h.update(_source(name, root).read_bytes())
        h.update(b"\0")
    return h.hexdigest()


def _decide(root: Path = _PACKAGE) -> tuple[bool, str]:
    """(run the pure-Python modules?, why) for the package at ``root``."""
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        return True, f"{PURE_ENV}={os.environ[PURE_ENV]}"
    if _extension(GROUP + "__mypyc", root) is None:
        return True, "not built at install (no compiler or mypyc; pip install -e . builds it)"
    missing = [m for m in MODULES if _extension(m, root) is None]
    if missing:
        return True, f"incomplete build: {missing[0]} not compiled"
    try:
        built = (root / DIGEST_FILE).read_text(encoding="ascii").strip()
    except OSError:
        built = ""
    try:
        current = source_digest(root)
    except OSError:  # an install without the sources: the compiled copy is all there is
        return False, "compiled at install (mypyc; no sources to compare)"
    if built != current:
        return True, "sources changed since the build (pip install -e . rebuilds it)"
    return False, "compiled at install (mypyc)"


class _CoreFinder(MetaPathFinder):
    """Hands out the ``.py`` of each of :data:`MODULES` when the pure side was chosen."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        if fullname not in _NAMES or not _choice()[0]:
            return None  # the regular machinery: the extension, where it was built
        leaf = fullname.rpartition(".")[2]
        for folder in path or ():
            source = Path(folder, leaf + ".py")
            if source.is_file():
                return importlib.util.spec_from_file_location(fullname, source)
        return None


_NAMES = frozenset(MODULES)
_FINDER = _CoreFinder()


def _choice() -> tuple[bool, str]:
    global _decision
    if _decision is None:
        _decision = _decide()
    return _decision


def install() -> None:
    """Put the finder in front of the import system (once)."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


def core() -> str:
    """``compiled`` or ``python``: which side of :data:`MODULES` was imported (``mixed``
    should never happen; ``none`` before any was imported)."""
    loaded = [sys.modules[m] for m in MODULES if m in sys.modules]
    compiled = sum(1 for mod in loaded
                   if not str(getattr(mod, "__file__", "") or "").endswith(".py"))
    if not loaded:
        return "none"
    if compiled == len(loaded):
        return "compiled"
    return "python" if compiled == 0 else "mixed"


def reason() -> str:
    """Why that side runs (the finder's decision, taken now if not yet)."""
    return _choice()[1]
