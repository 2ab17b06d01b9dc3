"""What plugins hand back from the registration hooks: small, typed, named records.

A plugin returns these from ``dualpath_register_policies`` / ``_stores`` / ``_metrics``; the
manager collects them, checks names are unique, and the consumers (scheduler, storage, metrics
registry) look them up by name. The records carry factories, never live objects, so loading a
plugin does no work until something is actually used.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

# Metrics use the one table's row type, so a plugin metric obeys the same naming rules.
from dualpath_cli.telemetry.metrics import MetricSpec, MetricType

__all__ = ["PolicyKind", "POLICY_KINDS", "PolicySpec", "StoreSpec", "MetricSpec", "MetricType"]

PolicyKind = Literal["read-path", "pe-fetch", "de-schedule", "batching", "threshold"]
#: Every policy kind, in the order the scheduler applies them to a request. Only
#: ``read-path`` has a consumer contract today: its factory returns a
#: :class:`dualpath_cli.core.policies.Policy`, a row of the one policy table (name, read rule
#: ``plan(request, pe, de, params, ordinal)``, layerwise, shaped, description); once
#: registered (:func:`dualpath_cli.plugins.manager.load_policies`) ``--policy NAME`` selects
#: it in ``bench``, ``sim`` and ``launch``, and ``scheduler.read_side`` may name it.
POLICY_KINDS: tuple[PolicyKind, ...] = ("pe-fetch", "de-schedule", "read-path", "batching",
                                        "threshold")


@dataclass(frozen=True, slots=True)
class PolicySpec:
    """A named scheduling or read-side policy.

    Attributes:
        name: unique name users select it by (``--policy``, config ``scheduler.read_side``).
        kind: which decision it makes (one of :data:`POLICY_KINDS`).
        factory: builds the policy, called without arguments. For ``read-path`` it returns
            a :class:`dualpath_cli.core.policies.Policy` whose ``name`` is ``name``.
        help: one line shown by ``dualpath plugins list``.
    """

    name: str
    kind: PolicyKind
    factory: Callable[..., Any]
    help: str = ""


@dataclass(frozen=True, slots=True)
class StoreSpec:
    """A named KV-store backend.

    Attributes:
        name: unique name (e.g. ``posix``, ``memory``), selected by ``storage.backend``.
        factory: builds the store; called with the storage config section as keywords.
        help: one line shown by ``dualpath plugins list``.
    """

    name: str
    factory: Callable[..., Any]
    help: str = ""
