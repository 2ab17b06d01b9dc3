"""dualpath: operations toolkit and embedded runtime for DualPath-style LLM inference."""

from dualpath_cli import compiled as _compiled

# before any module of the simulator's core is imported: which copy of it runs
# (compiled at install, or the pure-Python reference; dualpath_cli/compiled.py)
_compiled.install()

__version__ = "0.1.0"
__all__ = ["__version__"]
