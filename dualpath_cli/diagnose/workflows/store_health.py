"""Store health: a node whose store fails reads, holds corrupt blocks, or refuses writes.

Why its own workflow: a failing or full store serves every turn still (a failed read is
re-read or recomputed, a corrupt block quarantined and recomputed, a block not written
recomputed when next needed), so it shows elsewhere only as a slower TTFT or a lower hit
rate with no subject; the operator needs the node and the count. A pure function over
:class:`~dualpath_cli.diagnose.model.Evidence`: it reads the growth, from the window's first
sample to its last, of the per-node counters ``/metrics`` serves (the samples' extras:
``dualpath_storage_read_errors_total``, ``_read_blocks_total``, ``_corrupt_blocks_total``,
``_write_errors_total{reason}``), graded by the rules ``store-read-errors``,
``store-corrupt`` and ``store-writes`` (diagnose/verdict.py). A cluster that does not
report these counters (a recording from before them) is said to, not guessed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dualpath_cli.diagnose.grading import CRITICAL, OK, WARNING, no_samples
from dualpath_cli.diagnose.model import Evidence, Finding, node_name
from dualpath_cli.diagnose.thresholds import STORE_READ_CRIT_MIN_READS
from dualpath_cli.diagnose.verdict import RULES, judge, not_enough
from dualpath_cli.storage.errors import WRITE_REFUSALS

__all__ = ["store_health"]

WF = "store-health"
#: How each refusal reason reads in a title.
_REFUSED = {"full": "store full", "read_only": "store read-only", "failed": "store failing writes"}


def _growth(first: Mapping[Any, int], last: Mapping[Any, int]) -> dict[Any, int]:
    """Each key's growth from ``first`` to ``last`` (a key first seen later grew from 0; an
    engine that restarted counts again from 0: never negative)."""
    return {k: max(0, v - first.get(k, 0)) for k, v in last.items()}


def _name(ev: Evidence, node: int) -> str:
    n = ev.nodes.get(node)
    return node_name(n) if n is not None else str(node)


def store_health(ev: Evidence) -> list[Finding]:
    """One finding per node with failed reads, corrupt blocks or refused writes in the
    window, worst first; OK with the counts when there are none."""
    if not ev.samples:
        return [no_samples(WF)]
    first, last = ev.samples[0].extras, ev.samples[-1].extras
    if not (last.node_store_reads or last.node_read_errors or last.node_write_errors):
        return [Finding(WF, OK, "store health not reported in this window (per-node read "
                        "and write counters: a cluster or recording from before them)")]
    n = len(ev.samples)
    out = [*_read_errors(ev, _growth(first.node_read_errors, last.node_read_errors),
                         _growth(first.node_store_reads, last.node_store_reads),
                         _growth(first.node_corrupt_blocks, last.node_corrupt_blocks)),
           *_corrupt(ev, _growth(first.node_corrupt_blocks, last.node_corrupt_blocks), n),
           *_writes(ev, _growth(first.node_write_errors, last.node_write_errors), n)]
    bad = [f for f in out if f.severity]
    if bad:
        return bad + [f for f in out if not f.severity]
    reads = sum(_growth(first.node_store_reads, last.node_store_reads).values())
    return [*out, Finding(WF, OK, f"stores healthy: {reads} reads, none failed, no corrupt "
                          "block, no write refused", evidence={"reads": reads})]


def _read_errors(ev: Evidence, failed: dict[int, int], ok_reads: dict[int, int],
                 corrupt: dict[int, int]) -> list[Finding]:
    rule = RULES["store-read-errors"]
    out = []
    for node in sorted(set(failed) | set(ok_reads)):
        bad = failed.get(node, 0)
        if not bad:
            continue
        tried = bad + ok_reads.get(node, 0) + corrupt.get(node, 0)
        name = _name(ev, node)
        subject = f"node {name}"
        share = bad / tried
        v = judge(rule, share, tried, ev.previous, subject,
                  shown=f"{bad} of {tried} reads failed ({share:.0%})")
        if v is None:
            out.append(not_enough(rule, tried, f"{subject}: {bad} of {tried} reads failed",
                                  subject))
            continue
        sev, why = v.severity, v.why
        if sev is CRITICAL and tried < STORE_READ_CRIT_MIN_READS:
            sev = WARNING
            why += (f"; capped at WARNING: CRITICAL needs {STORE_READ_CRIT_MIN_READS} reads "
                    "(STORE_READ_CRIT_MIN_READS)")
        if not sev:
            continue
        out.append(Finding(
            WF, sev, f"node {name}: {bad} of {tried} reads failed (EIO)",
            subject=subject, evidence={"node": name, "failed_reads": bad, "reads": tried,
                                       "share": round(share, 3)},
            cause="the node's store returns I/O errors (a failing disk, a flaky 3FS/NFS "
                  "mount): each failed read is re-read or its prefix recomputed, so turns "
                  "are served but slower",
            action=f"check the node's store mount and its kernel log (dmesg) on {name}; "
                   "then dualpath storage verify STORE_ROOT",
            rule=rule.name, why=why))
    return out


def _corrupt(ev: Evidence, corrupt: dict[int, int], samples: int) -> list[Finding]:
    rule = RULES["store-corrupt"]
    out = []
    for node, count in sorted(corrupt.items()):
        if not count:
            continue
        name = _name(ev, node)
        subject = f"node {name}"
        v = judge(rule, count, samples, ev.previous, subject, shown=f"{count} corrupt blocks")
        if v is None:
            out.append(not_enough(rule, samples, f"{subject}: {count} corrupt blocks",
                                  subject))
            continue
        if not v.severity:
            continue
        out.append(Finding(
            WF, v.severity, f"node {name}: {count} corrupt block{'s' * (count != 1)} "
            "found and quarantined", subject=subject,
            evidence={"node": name, "corrupt_blocks": count},
            cause="a stored block's bytes no longer match their checksum (a bit flip on "
                  "disk, a torn write, a foreign file): it was moved to quarantine/ and "
                  "its prefix recomputed, so no data was lost",
            action="dualpath storage verify STORE_ROOT   (checks every block, quarantines "
                   "the corrupt ones)",
            rule=rule.name, why=v.why))
    return out


def _writes(ev: Evidence, refused: dict[str, int], samples: int) -> list[Finding]:
    rule = RULES["store-writes"]
    by_node: dict[int, dict[str, int]] = {}
    for key, count in refused.items():
        label, _, why = key.partition("/")
        if count and label.lstrip("-").isdigit():
            by_node.setdefault(int(label), {})[why if why in WRITE_REFUSALS else "failed"] = (
                count)
    out = []
    for node, reasons in sorted(by_node.items()):
        total = sum(reasons.values())
        name = _name(ev, node)
        subject = f"node {name}"
        main = max(reasons, key=lambda r: reasons[r])
        title = f"{_REFUSED[main]} on node {name}: {total} write{'s' * (total != 1)} refused"
        v = judge(rule, total, samples, ev.previous, subject, shown=f"{total} refused writes")
        if v is None:
            out.append(not_enough(rule, samples, title, subject))
            continue
        if not v.severity:
            continue
        cause = {"full": "the store's file system is full (ENOSPC): new KV is not kept, so "
                         "later turns that would hit it recompute it",
                 "read_only": "the store's file system is read-only (EROFS): new KV is not "
                              "kept",
                 "failed": "the store fails writes (EIO): new KV is not kept"}[main]
        action = ("free space on the store (dualpath storage gc STORE_ROOT --capacity SIZE "
                  "evicts its least-recently-used blocks)" if main == "full" else
                  f"check the store mount and its kernel log on {name}")
        out.append(Finding(WF, v.severity, title, subject=subject,
                           evidence={"node": name, "refused_writes": total,
                                     "by_reason": dict(reasons)},
                           cause=cause, action=action, rule=rule.name, why=v.why))
    return out
