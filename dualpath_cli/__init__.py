"""dualpath: operations toolkit and embedded runtime for DualPath-style LLM inference."""

from dualpath_cli import compiled as _compiled

__version__ = "0.1.0"
__all__ = ["__version__"]

# before any module mypyc compiled at install is imported: a stale one runs from source
_compiled.install_guard()
