"""Verdicts as documented functions of evidence: each graded rule states what it counts, the
least evidence it grades on, its WARNING and CRITICAL thresholds and a hysteresis band.

Why: a grade that follows how many reads happened to land on a node flips from window to
window under a steady fault. A :class:`Rule` grades one measured quantity; below its minimum
evidence the finding is OK with "not enough evidence: N <unit>" (not a guess); with the
previous grade of the same rule and subject known (:attr:`Evidence.previous`), a value must
cross a threshold by more than the band to change the grade, so a steady fault keeps it.
docs/troubleshooting.md has the table of these rules (a test checks each is there).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from dualpath_cli.diagnose import thresholds as th
from dualpath_cli.diagnose.model import Finding, Severity

__all__ = ["Rule", "RULES", "Verdict", "grade", "judge", "verdict_key", "previous_of",
           "not_enough", "previous_grades"]


@dataclass(frozen=True)
class Rule:
    """One graded rule.

    Args:
        name: its name (``snic-link``), unique; findings carry it (``Finding.rule``).
        workflow: the workflow that applies it.
        evidence: what it counts, in words (the docs table's "evidence" column).
        unit: what ``minimum`` counts (``samples``, ``reads``, ``turns``).
        minimum: the least evidence for a grade.
        warn: the WARNING threshold of the graded value.
        crit: the CRITICAL threshold (``None``: the rule tops out at WARNING).
        band: hysteresis: with a previous grade, the value must pass a threshold by more
            than this to change the grade.
        lower_is_worse: the value is bad when low (a link at 25% of expected).
        relative_band: ``band`` is a share of the threshold it is about (a latency, whose
            window-to-window wobble grows with it: 20 ms at 100 ms is 200 ms at 1 s).
    """

    name: str
    workflow: str
    evidence: str
    unit: str
    minimum: int
    warn: float
    crit: float | None
    band: float
    lower_is_worse: bool = False
    relative_band: bool = False

    def band_at(self, threshold: float) -> float:
        """The band around ``threshold``."""
        return self.band * abs(threshold) if self.relative_band else self.band

    def raw(self, value: float, toward: int = 0) -> Severity:
        """The grade by the thresholds, each moved its band ``toward`` the bad side (1),
        the good side (-1) or not at all (0)."""
        def past(t: float) -> bool:
            moved = toward * self.band_at(t)
            return value < t - moved if self.lower_is_worse else value >= t + moved

        if self.crit is not None and past(self.crit):
            return Severity.CRITICAL
        return Severity.WARNING if past(self.warn) else Severity.OK

    def thresholds_text(self) -> str:
        """``WARNING < 0.75, CRITICAL < 0.5 (band 0.05)`` for a finding's why."""
        op = "<" if self.lower_is_worse else ">="
        crit = f", CRITICAL {op} {self.crit:g}" if self.crit is not None else ""
        band = f"{self.band:.0%} of the threshold" if self.relative_band else f"{self.band:g}"
        return f"WARNING {op} {self.warn:g}{crit}, band {band}"


@dataclass(frozen=True)
class Verdict:
    """A rule's grade of a value and why (the words a finding prints)."""

    severity: Severity
    why: str
    held: bool = False  # kept at the previous grade inside the band


def grade(rule: Rule, value: float, evidence_n: int, previous: Severity | None = None, *,
          shown: str | None = None) -> Verdict:
    """``rule``'s grade of ``value``, measured over ``evidence_n`` units of evidence.

    Without a previous grade: the thresholds as they are. With one: the grade moves up only
    when the value passes the next threshold by more than the band, and down only when it
    is back past the threshold by more than the band; otherwise it stays where it was.
    Below the minimum evidence callers report :func:`not_enough` instead (:func:`judge`
    checks the minimum and finds the previous grade).
    """
    text = shown if shown is not None else f"{value:.3g}"
    raw = rule.raw(value)
    counted = f"{evidence_n} {rule.unit}"
    if previous is None or previous not in (Severity.OK, Severity.WARNING, Severity.CRITICAL):
        return Verdict(raw, f"{rule.name} {text} over {counted}: {raw.name} "
                            f"({rule.thresholds_text()})")
    up = rule.raw(value, 1)      # needs the band beyond a threshold to go up
    down = rule.raw(value, -1)   # needs the band back past it to come down
    if up > previous:
        sev = up
    elif down < previous:
        sev = down
    else:
        sev = previous
    held = sev != raw
    why = (f"{rule.name} {text} over {counted}: {sev.name}"
           + (", kept from the previous verdict (within the band of a threshold)"
              if held else "") + f" ({rule.thresholds_text()})")
    return Verdict(sev, why, held)


def judge(rule: Rule, value: float, evidence_n: int,
          previous: Mapping[str, Severity] | None, subject: str | None, *,
          shown: str) -> Verdict | None:
    """``rule``'s :func:`grade` of ``subject``'s ``value`` over ``evidence_n`` units of
    evidence, from the subject's grade in ``previous`` (:attr:`Evidence.previous`).

    Why one call: every workflow grades this way, and the minimum is the rule's own.
    ``None`` below the rule's minimum evidence: no grade, the caller says :func:`not_enough`
    (or nothing, where a shortfall is not worth a finding).
    """
    if evidence_n < rule.minimum:
        return None
    return grade(rule, value, evidence_n, previous_of(previous, rule, subject), shown=shown)


def not_enough(rule: Rule, n: int, title: str, subject: str | None = None) -> Finding:
    """The OK finding of a rule with less evidence than its minimum: no guess."""
    return Finding(rule.workflow, Severity.OK,
                   f"{title}: not enough evidence: {n} {rule.unit} (< {rule.minimum})",
                   subject=None, evidence={"evidence_n": n, "minimum": rule.minimum,
                                           "about": subject},
                   rule=rule.name,
                   why=f"{rule.name}: {n} {rule.unit} < the minimum {rule.minimum}: no grade")


def verdict_key(rule: str, subject: str | None) -> str:
    """The key a previous verdict is kept under (``snic-link|node D1``)."""
    return f"{rule}|{subject or ''}"


def previous_of(previous: Mapping[str, Severity] | None, rule: Rule,
                subject: str | None) -> Severity | None:
    """The previous grade of ``rule`` on ``subject`` (``None``: none known: an unknown
    subject had no finding then, i.e. it was OK, when anything at all was kept)."""
    if previous is None:
        return None
    return previous.get(verdict_key(rule.name, subject), Severity.OK)


def previous_grades(findings: list[Finding]) -> dict[str, Severity]:
    """What to keep of a run's findings for the next: each graded finding's grade."""
    out: dict[str, Severity] = {}
    for f in findings:
        graded = dict(f.evidence.get("rule_grades") or {})  # a finding of several rules
        if f.rule and f.rule not in graded:
            graded[f.rule] = f.severity.name
        for rule, name in graded.items():
            sev = Severity[name] if name in Severity.__members__ else Severity.UNKNOWN
            if sev is Severity.UNKNOWN:
                continue
            key = verdict_key(rule, f.subject)
            out[key] = max(out.get(key, Severity.OK), sev)
    return out


def _rules() -> dict[str, Rule]:
    snic = "snic-imbalance"
    tail = "long-tail"
    rules = [
        Rule("snic-link", snic, "a node's storage-NIC rate (its link's shaped or negotiated "
             "rate) against the fastest node's in the cluster (one configured rate)",
             "samples", th.MIN_SAMPLES, th.SNIC_BW_WARN, th.SNIC_BW_CRIT,
             th.SNIC_BW_BAND, lower_is_worse=True),
        Rule("snic-balance", snic, "mean storage-NIC utilisation of the busiest node of a "
             "role over the role's mean (Max/Avg), the role busy", "samples",
             th.MIN_SAMPLES, th.SNIC_MAX_AVG_WARN, th.SNIC_MAX_AVG_CRIT,
             th.SNIC_MAX_AVG_BAND),
        Rule("snic-saturated", snic, "share of samples with the node's storage NIC at or "
             "above SNIC_SATURATED", "samples", th.MIN_SAMPLES, th.PERSIST_FRACTION,
             None, th.SHARE_BAND),
        Rule("read-queue", snic, "share of samples with the node's read queue over alpha",
             "samples", th.MIN_SAMPLES, th.PERSIST_FRACTION, None, th.SHARE_BAND),
        Rule("store-latency", snic, "a node's mean store service time per read batch "
             "(from the batch's I/O start to the store's return; a read: one batch) over "
             "the window, or where the cluster does not report it its mean store read "
             "latency (each block from queued to delivered; a read: one block); with fewer "
             "reads in it than the minimum (reads steered away from a slow store), over the "
             "node's last reads back to a count an earlier diagnose run took, at most "
             "STORE_LATENCY_LOOKBACK_S back",
             "reads", th.STORE_LATENCY_MIN_READS,
             th.STORE_LATENCY_WARN_S, th.STORE_LATENCY_CRIT_S, th.STORE_LATENCY_BAND,
             relative_band=True),
        Rule("misclassified", snic, "share of an engine's decisions whose PE class its "
             "inputs contradict", "decisions", th.MISCLASS_MIN_DECISIONS, th.MISCLASS_WARN,
             None, th.MISCLASS_BAND),
        Rule("ttft-tail", tail, "TTFT P99/P50 of the window's turns (histogram)", "turns",
             th.TTFT_MIN_TURNS, th.TAIL_RATIO_WARN, th.TAIL_RATIO_CRIT, th.TAIL_RATIO_BAND),
        Rule("hot-block", tail, "the share of the store's block reads in the window taken "
             "by the busiest copy of the most-read block of the node reading it (of the "
             "reported blocks' reads where the store's total is not reported)", "reads",
             th.HOT_BLOCK_MIN_READS, th.HOT_BLOCK_SHARE, th.HOT_BLOCK_CRIT, th.HOT_BLOCK_BAND),
        Rule("over-beta", tail, "share of samples with the engine's tokens over beta",
             "samples", th.MIN_SAMPLES, th.PERSIST_FRACTION, None, th.SHARE_BAND),
        Rule("slow-engine", tail, "share of samples with the engine's unfinished requests at "
             "SLOW_ENGINE_FACTOR x its role peers'", "samples", th.MIN_SAMPLES,
             th.PERSIST_FRACTION, None, th.SHARE_BAND),
        Rule("slow-service", tail, "the engine's mean service time over its role peers' "
             "median (samples that measured one)", "samples", th.SLOW_SERVICE_MIN_SAMPLES,
             th.SLOW_SERVICE_FACTOR, None, th.SLOW_SERVICE_BAND),
        Rule("hbm-frag", "hbm-frag", "the engine's HBM fragmentation score, median of the "
             "window's samples", "samples", 1, th.HBM_FRAG_WARN, th.HBM_FRAG_CRIT,
             th.HBM_FRAG_BAND),
        Rule("prefix-hit", "cache-hit", "prompt tokens of follow-up turns found cached, as a "
             "share", "turns", th.PREFIX_MIN_TURNS, th.PREFIX_HIT_WARN, None,
             th.SHARE_BAND, lower_is_worse=True),
        Rule("kv-wait", "cache-hit", "a prefill engine's mean wait for its cached KV (s), "
             "samples that measured one", "samples", th.KV_WAIT_MIN_SAMPLES,
             th.KV_WAIT_WARN_S, th.KV_WAIT_CRIT_S, th.KV_WAIT_BAND_S),
        Rule("kv-lost", "fabric", "turns of the engine run again in the window because a KV "
             "message on its compute-fabric link was lost", "turns", th.KV_LOST_MIN_TURNS,
             th.KV_LOST_WARN, None, th.KV_LOST_BAND),
        Rule("scheduler-cpu", "scaling", "cores the scheduler thread used over the window",
             "samples", th.MIN_SAMPLES, th.SCHED_CPU_WARN, th.SCHED_CPU_CRIT,
             th.SCHED_CPU_BAND),
        Rule("decision-p99", "scaling", "a kind of scheduling call's p99 over the mean gap "
             "between two arriving requests (the kind with the worst)", "calls",
             th.DECISION_MIN_CALLS, th.DECISION_P99_WARN, th.DECISION_P99_CRIT,
             th.DECISION_P99_BAND),
        Rule("store-read-errors", "store-health", "share of a node's store reads in the "
             "window that failed (EIO, timed out)", "reads", th.STORE_READ_MIN_READS,
             th.STORE_READ_ERRORS_WARN, th.STORE_READ_ERRORS_CRIT, th.STORE_READ_ERRORS_BAND),
        Rule("store-corrupt", "store-health", "blocks a node's loader found corrupt "
             "(checksum, truncated, foreign header) and quarantined in the window", "samples",
             th.STORE_MIN_SAMPLES, th.STORE_EVENTS_WARN, None, th.STORE_EVENTS_BAND),
        Rule("store-writes", "store-health", "block writes a node's store refused in the "
             "window (full, read-only, failing)", "samples", th.STORE_MIN_SAMPLES,
             th.STORE_EVENTS_WARN, None, th.STORE_EVENTS_BAND),
    ]
    return {r.name: r for r in rules}


#: Every graded rule by name (docs/troubleshooting.md's table lists each).
RULES: dict[str, Rule] = _rules()
