"""Build hooks for what pyproject.toml cannot declare: the native block reader and the
scheduler compiled with mypyc. Both are optional: without a C compiler (or mypyc) the
build is skipped with a warning, ``pip install`` still succeeds and dualpath runs the
pure-Python path (and says which, see below). All metadata lives in pyproject.toml.

- ``dualpath_cli/storage/_native/reader.c``: plain C loaded with ctypes (no Python
  headers); where it is not built here dualpath compiles it at run time if it can, else
  reads through the pure-Python path (dualpath_cli/storage/native.py says which, once, at
  WARNING, and ``dualpath storage bench`` shows it).
- the modules listed in ``dualpath_cli/compiled.py`` (``MODULES``): compiled by mypyc from
  their annotated source; the digests of the sources built are written beside them
  (``_compiled.stamp``) so a later edit of a source runs as source, not as the stale binary
  (``dualpath_cli.compiled.install_guard``). ``DUALPATH_PURE_PYTHON=1`` at install builds
  none, and at run time runs the sources.
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path
from typing import Any

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
_COMPILED: dict[str, Any] = runpy.run_path(str(ROOT / "dualpath_cli" / "compiled.py"))
MODULES: tuple[str, ...] = _COMPILED["MODULES"]


def _warn(what: str) -> None:
    print(f"dualpath setup: {what}; the scheduler runs as Python", file=sys.stderr)


def _mypyc_extensions() -> list[Extension]:
    """The mypyc extensions of :data:`MODULES` (none where mypyc cannot build them)."""
    if os.environ.get(_COMPILED["PURE_ENV"], "") not in ("", "0"):
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        _warn("mypyc is not installed")
        return []
    paths = [str(_COMPILED["source_path"](m, ROOT).relative_to(ROOT)) for m in MODULES]
    try:
        exts = mypycify(paths, opt_level="3", debug_level="0")
    except (Exception, SystemExit) as err:  # mypyc exits on a type error  # noqa: BLE001
        _warn(f"mypyc could not compile {', '.join(paths)} ({err})")
        return []
    for ext in exts:
        ext.optional = True  # a compiler failure leaves the sources to run
    return list(exts)


class BuildExt(build_ext):
    """``build_ext`` that records the digests of the compiled sources once all are built."""

    def run(self) -> None:
        super().run()
        built = {m: Path(self.get_ext_fullpath(m)) for m in MODULES}
        if not any(e.name in built for e in self.extensions):
            return
        stamp = built[MODULES[0]].parents[len(MODULES[0].split(".")) - 2] / _COMPILED["STAMP"]
        if all(p.exists() for p in built.values()):
            stamp.write_text("".join(_COMPILED["stamp_line"](m, ROOT) for m in MODULES))
        else:
            _warn("mypyc's extensions were not all built")
            stamp.unlink(missing_ok=True)


setup(
    ext_modules=[
        Extension(
            "dualpath_cli.storage._native._reader",
            sources=["dualpath_cli/storage/_native/reader.c"],
            extra_compile_args=["-O2", "-pthread"],
            extra_link_args=["-pthread"],
            optional=True,
        ),
        *_mypyc_extensions(),
    ],
    cmdclass={"build_ext": BuildExt},
)
