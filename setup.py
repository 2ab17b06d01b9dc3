"""Build hook for what pyproject.toml cannot declare: the optional compiled extensions.

Both are *optional*: where a build cannot happen the install still succeeds, with a warning,
and dualpath runs the pure-Python code instead.

- ``dualpath_cli/storage/_native/reader.c``, the native block reader: where no C compiler
  (or libc headers) is available it is skipped; dualpath then compiles the source at run
  time if it can, else reads through the pure-Python path (dualpath_cli/storage/native.py
  says which, once, at WARNING, and ``dualpath storage bench`` shows it). The library is
  plain C loaded with ctypes: it needs no Python headers.
- the simulator's compiled core: the modules ``dualpath_cli/compiled.py`` lists
  (``MODULES``), compiled by mypyc (a build requirement) into C extensions that need the
  Python headers. All of them or none: when mypyc cannot translate them or the compiler
  fails on one, none is installed, and the pure-Python modules run (the reference either
  way; ``DUALPATH_PURE_SIM=1`` picks them where the build happened). A successful build
  writes the digest of the sources it compiled beside them, so an edited checkout runs its
  sources until ``pip install -e .`` rebuilds.

All metadata lives in pyproject.toml.
"""

from __future__ import annotations

import os
import runpy
import sys
import traceback
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CCompilerError, CompileError, LinkError

# dualpath_cli/compiled.py imports only the standard library: read it as a file, since the
# package itself cannot be imported before its dependencies are installed
_CORE = runpy.run_path(os.path.join("dualpath_cli", "compiled.py"))
_SKIP_ENV = "DUALPATH_NO_COMPILE"  # set: install without the compiled core


def _warn(message: str) -> None:
    print(f"WARNING: {message}; the simulator runs its pure-Python modules", file=sys.stderr)


def _core_extensions() -> list[Extension]:
    """mypyc's extensions for the core (empty, with a warning, when it cannot make them)."""
    if os.environ.get(_SKIP_ENV, "") not in ("", "0"):
        return []
    try:
        from mypyc.build import mypycify
    except ImportError as err:
        _warn(f"mypyc is not available ({err})")
        return []
    paths = [os.path.join(*m.split(".")) + ".py" for m in _CORE["MODULES"]]
    try:
        return list(mypycify(paths, group_name=_CORE["GROUP"], opt_level="3"))
    except SystemExit:  # mypyc refused the sources (it exits on a type error): no core
        traceback.print_exc()
        _warn("mypyc could not translate the simulator's core")
        return []


class BuildExt(build_ext):
    """Builds the core's extensions all or none, and records the sources they came from."""

    def build_extensions(self) -> None:
        core_names = {*_CORE["MODULES"], _CORE["GROUP"] + "__mypyc"}
        core = [e for e in self.extensions if e.name in core_names]
        self.extensions = [e for e in self.extensions if e.name not in core_names]
        super().build_extensions()  # the native reader (optional: failures are warnings)
        self._core_built = False
        if not core:
            return
        try:
            for ext in core:
                self.build_extension(ext)
        except (CCompilerError, CompileError, LinkError, OSError) as err:  # none of the core
            _warn(f"the simulator's compiled core did not build ({err})")
            for ext in core:
                out = self.get_ext_fullpath(ext.name)
                if os.path.exists(out):
                    os.remove(out)
            return
        self.extensions += core
        self._core_built = True

    def run(self) -> None:
        super().run()
        if getattr(self, "_core_built", False):
            digest = _CORE["source_digest"](Path("dualpath_cli").resolve())
            folders = {os.path.join(self.build_lib, "dualpath_cli")}
            if self.inplace:
                folders.add(os.path.abspath("dualpath_cli"))
            for folder in folders:
                os.makedirs(folder, exist_ok=True)
                with open(os.path.join(folder, _CORE["DIGEST_FILE"]), "w",
                          encoding="ascii") as out:
                    out.write(digest + "\n")


setup(
    cmdclass={"build_ext": BuildExt},
    ext_modules=[
        Extension(
            "dualpath_cli.storage._native._reader",
            sources=["dualpath_cli/storage/_native/reader.c"],
            extra_compile_args=["-O2", "-pthread"],
            extra_link_args=["-pthread"],
            optional=True,
        ),
        *_core_extensions(),
    ],
)
