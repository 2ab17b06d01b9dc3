"""Integer query and path parameters, each with both bounds, declared in one place.

Why: an integer parameter with only a lower bound let ``?since=9223372036854775808``
through to ``itertools.islice`` (a 500, issue 34 item 3). Every integer parameter of the
API is declared with :func:`int_query` or :func:`int_path`, which add the upper bound
:data:`INT_MAX` (a signed 64-bit integer, what any client stores) unless a tighter one is
given; a value outside the bounds is a 422 with the house's ``{"detail": ...}`` body, before
a handler runs. tests/test_api_params.py checks that no integer parameter is unbounded.
"""

from __future__ import annotations

from typing import Any

from fastapi import Path, Query

__all__ = ["INT_MAX", "int_path", "int_query"]

#: The largest integer any query or path parameter takes (2**63 - 1).
INT_MAX = 2**63 - 1


def int_query(*, ge: int, le: int = INT_MAX, description: str | None = None) -> Any:
    """An integer query parameter within ``[ge, le]``."""
    return Query(ge=ge, le=min(le, INT_MAX), description=description)


def int_path(*, ge: int, le: int = INT_MAX, description: str | None = None) -> Any:
    """An integer path parameter within ``[ge, le]``."""
    return Path(ge=ge, le=min(le, INT_MAX), description=description)
