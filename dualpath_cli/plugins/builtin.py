"""The built-in plugin: the core's read-path policies, offered through the same hook as
third-party ones (datasette/llm style), so ``dualpath plugins list`` shows what is selectable
and a plugin's policy name can never silently shadow a built-in one.
"""

from __future__ import annotations

from collections.abc import Callable

from dualpath_cli.core.policies import BUILTIN_POLICIES, Policy
from dualpath_cli.plugins.hookspecs import hookimpl
from dualpath_cli.plugins.specs import PolicySpec

__all__ = ["dualpath_register_policies"]


def _returning(policy: Policy) -> Callable[[], Policy]:
    def factory() -> Policy:
        return policy

    return factory


@hookimpl
def dualpath_register_policies() -> list[PolicySpec]:
    """Every built-in row of core's policy table (``BUILTIN_POLICIES``), kind ``read-path``."""
    return [PolicySpec(policy.name, "read-path", _returning(policy), policy.description)
            for policy in BUILTIN_POLICIES.values()]
