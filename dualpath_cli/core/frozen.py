"""Pickling the frozen dataclasses of the compiled core: through their constructor.

Why: mypyc compiles a frozen dataclass into a native class that pickle (and ``copy``) would
rebuild by setting one field after another, which a frozen class refuses. Rebuilt by its
constructor from its fields, the compiled class pickles as the pure-Python one does (the
twin's worker processes get a setup's profiles this way). Each frozen dataclass of a
compiled module (dualpath_cli/compiled.py) has ``__reduce__`` return :func:`by_fields`.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

__all__ = ["by_fields"]


def by_fields(obj: Any) -> tuple[Any, tuple[Any, ...]]:
    """``(class, field values)``: what ``__reduce__`` returns for a frozen dataclass."""
    return type(obj), tuple(getattr(obj, f.name) for f in fields(obj))
