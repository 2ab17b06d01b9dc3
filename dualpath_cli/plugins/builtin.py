"""The built-in plugin: the core's read-path policies, offered through the same hook as
third-party ones (datasette/llm style), so ``dualpath plugins list`` shows what is selectable
and a plugin's policy name can never silently shadow a built-in one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from dualpath_cli.plugins.hookspecs import hookimpl
from dualpath_cli.plugins.specs import PolicySpec

if TYPE_CHECKING:
    from dualpath_cli.core.policies import Policy

__all__ = ["dualpath_register_policies"]


def _returning(policy: Policy) -> Callable[[], Policy]:
    def factory() -> Policy:
        return policy

    return factory


@hookimpl
def dualpath_register_policies() -> list[PolicySpec]:
    """Every built-in row of core's policy table (``BUILTIN_POLICIES``), kind ``read-path``.

    The table is imported here, not at module level: loading plugins (which ``dualpath
    --help`` does, to list their commands) must not import the core."""
    from dualpath_cli.core.policies import BUILTIN_POLICIES

    return [PolicySpec(policy.name, "read-path", _returning(policy), policy.description)
            for policy in BUILTIN_POLICIES.values()]
