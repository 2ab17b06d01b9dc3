"""The troubleshooting workflows' registry: a name in, the workflow's report out.

Each workflow follows one section of the seed's troubleshooting guide (6.1 performance drop
with storage-NIC imbalance, 6.2 long tail, 6.3 scaling) or one of its monitor commands
(HBM fragmentation, per-layer cache hits), or one class of fault (membership, store
health), and is a pure function in its own module under
diagnose/workflows/ (:class:`Evidence` in, findings out). Thresholds are the named
constants of diagnose/thresholds.py; every one is documented, with its reason, in
docs/troubleshooting.md. A check whose inputs the cluster does not report says so (a
finding of severity OK with "not available") rather than guessing.
"""

from __future__ import annotations

from collections.abc import Callable

from dualpath_cli.diagnose.grading import dataclass_replace
from dualpath_cli.diagnose.model import Evidence, Finding, Report
from dualpath_cli.diagnose.workflows.cache_hit import cache_hit
from dualpath_cli.diagnose.workflows.fabric import fabric
from dualpath_cli.diagnose.workflows.hbm_frag import hbm_frag
from dualpath_cli.diagnose.workflows.long_tail import long_tail
from dualpath_cli.diagnose.workflows.membership import membership
from dualpath_cli.diagnose.workflows.scaling import scaling
from dualpath_cli.diagnose.workflows.snic_imbalance import snic_imbalance
from dualpath_cli.diagnose.workflows.store_health import store_health

__all__ = ["WORKFLOWS", "ALIASES", "run_workflow", "run_all"]


WORKFLOWS: dict[str, Callable[[Evidence], list[Finding]]] = {
    "snic-imbalance": snic_imbalance,
    "long-tail": long_tail,
    "hbm-frag": hbm_frag,
    "cache-hit": cache_hit,
    "scaling": scaling,
    "membership": membership,
    "store-health": store_health,
    "fabric": fabric,
}
#: Other names a workflow answers to (the seed calls 6.1 "performance drop").
ALIASES = {"perf-drop": "snic-imbalance"}


def run_workflow(name: str, ev: Evidence, *, by_layer: bool = False) -> Report:
    """One workflow's :class:`Report` (``name`` may be an alias)."""
    canonical = ALIASES.get(name, name)
    rule = WORKFLOWS[canonical]
    # memoised: long-tail borrows hbm-frag's findings, so ``all`` computes them once
    findings = (cache_hit(ev, by_layer) if canonical == "cache-hit" else
                ev.memo(canonical, lambda: rule(ev)))
    findings = [f if f.workflow == canonical else dataclass_replace(f, workflow=canonical)
                for f in findings]
    findings.sort(key=lambda f: -int(f.severity))
    return Report(canonical, tuple(findings), ev.window_s, len(ev.samples), len(ev.decisions))


def run_all(ev: Evidence, *, by_layer: bool = False) -> list[Report]:
    """Every workflow (what cron runs); the worst severity is the exit code."""
    return [run_workflow(name, ev, by_layer=by_layer) for name in WORKFLOWS]
