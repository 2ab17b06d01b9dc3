"""The modules an install compiles with mypyc, and whether this process runs them compiled.

Why compiled: the scheduler's service thread is the control plane's one serial core
(``bench/control_plane.py``, ``sched_cpu_cores_48p96d``); mypyc turns its type-annotated
Python into C without a second source to keep in step (docs/benchmarks.md, session 15).

Why a guard: a compiled module is a ``.so`` beside its ``.py`` and Python imports the
``.so`` first. In an editable install (``pip install -e .``) an edited source would run as
the old binary, silently. So when the package is imported, each compiled module's source
is compared with the digest recorded when it was built (:data:`STAMP`); if any differs,
or ``DUALPATH_PURE_PYTHON=1``, every listed module is imported from its source instead
(all or none: compiled modules call each other's functions directly). A missing compiler
at install time simply leaves no ``.so``: the sources run.

Standard library only: ``setup.py`` reads :data:`MODULES` from this file before any
dependency is installed. Cheap on the common path (every CLI call imports the package): a
few ``stat`` calls and one small file; a source is hashed only when its size or time
differs from the build's.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

#: dotted names of the modules mypyc compiles (setup.py builds exactly these)
MODULES: tuple[str, ...] = ("dualpath_cli.runtime.scheduler",)
#: the sources the installed binaries were built from (beside this file): per line, module,
#: SHA-256, size and modification time (ns) of its source (:func:`stamp_line`)
STAMP = "_compiled.stamp"
#: set to 1 to run every listed module from its source
PURE_ENV = "DUALPATH_PURE_PYTHON"

_PACKAGE_DIR = Path(__file__).resolve().parent
_state: str | None = None


def source_path(module: str, root: Path | None = None) -> Path:
    """The ``.py`` of ``module`` under ``root`` (the directory holding the package)."""
    base = root if root is not None else _PACKAGE_DIR.parent
    return base.joinpath(*module.split(".")).with_suffix(".py")


def digest(path: Path) -> str:
    """SHA-256 of a source file (what the stamp records)."""
    import hashlib  # (only when a source's size or time moved: 10+ ms to import)

    return hashlib.sha256(path.read_bytes()).hexdigest()


def stamp_line(module: str, root: Path | None = None) -> str:
    """``module``'s line of :data:`STAMP`: its source's digest, size and time."""
    src = source_path(module, root)
    st = src.stat()
    return f"{module} {digest(src)} {st.st_size} {st.st_mtime_ns}\n"


def _current(module: str, recorded: list[str]) -> bool:
    """Whether ``module``'s source is the one its binary was built from."""
    src = source_path(module)
    try:
        st = src.stat()
    except OSError:
        return False
    if recorded[1:] == [str(st.st_size), str(st.st_mtime_ns)]:
        return True
    return digest(src) == recorded[0]  # touched (a checkout): the same text?


def _binary(module: str) -> Path | None:
    src = source_path(module)
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        candidate = src.with_suffix(suffix)
        if candidate.exists():
            return candidate
    return None


def _why_source() -> str | None:
    """Why the listed modules must run from source (``None``: the binaries are current;
    ``""``: there are none)."""
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        return f"{PURE_ENV} is set"
    built = [m for m in MODULES if _binary(m) is not None]
    if not built:
        return ""
    try:
        text = (_PACKAGE_DIR / STAMP).read_text()
    except (OSError, UnicodeDecodeError):
        return f"no readable {STAMP} beside the compiled modules (rebuild: pip install -e .)"
    stamp = {f[0]: f[1:] for f in (line.split() for line in text.splitlines()) if len(f) == 4}
    for module in MODULES:
        if _binary(module) is None:
            return f"{module} has no compiled module (rebuild: pip install -e .)"
        if module not in stamp or not _current(module, stamp[module]):
            return (f"{module}'s source changed since it was compiled "
                    "(rebuild: pip install -e .)")
    return None


class _SourceFinder:
    """Finds the listed modules' ``.py``, passing over their compiled ``.so`` (a meta path
    finder: only ``find_spec`` is needed, and ``importlib.abc`` costs ~40 ms to import)."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = frozenset(names)

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.names:
            return None
        src = source_path(fullname)
        return importlib.util.spec_from_file_location(fullname, src) if src.exists() else None


def install_guard() -> None:
    """Decide, once per process, whether the listed modules run compiled (called when the
    package is imported, before any of them is)."""
    global _state
    if _state is not None:
        return
    why = _why_source()
    if why is None:
        _state = "compiled (mypyc): " + ", ".join(MODULES)
        return
    if why:
        if not any(isinstance(f, _SourceFinder) for f in sys.meta_path):
            sys.meta_path.insert(0, _SourceFinder(MODULES))
        if not why.startswith(PURE_ENV):
            print(f"dualpath: running the scheduler from source: {why}", file=sys.stderr)
        _state = f"python ({why})"
    else:
        _state = "python (not compiled at install)"


def state() -> str:
    """How the listed modules run in this process, in words (for ``version`` and benches)."""
    install_guard()
    assert _state is not None
    return _state


def is_compiled(module: ModuleType) -> bool:
    """Whether ``module`` was loaded from a compiled extension."""
    return not str(getattr(module, "__file__", "")).endswith(".py")
