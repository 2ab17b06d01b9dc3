"""``dualpath drill``: rehearse every incident under load and score the operator surface.

Why: each surface (status, diagnose, the metrics, the fixes the findings offer) is tested
on its own; an operator uses them together, at 03:00, on a real fault. The drill makes each
fault the project can make (drill_rows.py), under a bounded agent load (drill_load.py),
and watches the cluster the way an operator would: every ``INTERVAL_S`` it reads
``/api/v1/status`` (the record ``status --json`` summarises), ``/metrics`` and the view and
decisions ``diagnose`` judges, and runs every diagnose workflow over the samples taken since
the fault was made. It records when each surface first reported the fault, applies the fix
the right finding offers (``tune set alpha=``, ``diagnose hbm-frag --fix``'s compaction,
``long-tail --fix``'s replicas, ``dualpath storage verify`` of a local store), clears the
fault, waits for the cluster to be back to OK,
and holds the load's tokens against a reference run of the same prompts on the healthy
cluster. The verdict is drill_score.py's.

The client is any object with the API client's methods (services cannot import the API);
the front-end (cli/drill_cmd.py) builds it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dualpath_cli.diagnose import rules
from dualpath_cli.diagnose.model import Evidence
from dualpath_cli.errors import DualPathError
from dualpath_cli.services.drill_load import AgentLoad, drill_agents
from dualpath_cli.services.drill_rows import FIX_DROP, ROWS, Made, Row, Target
from dualpath_cli.services.drill_score import (
    MetricSample,
    RowResult,
    matching_findings,
    metric_values,
    parse_metrics,
    rank,
    worst_grade,
)
from dualpath_cli.services.replicate import NO_REPLICA_ROOTS
from dualpath_cli.telemetry.recording import Sample, extras_from_metrics_text

__all__ = ["Session", "run_drill", "run_row", "pick_rows", "DrillError", "INTERVAL_S"]

#: Time between looks at the cluster while a fault is watched.
INTERVAL_S = 0.5
#: How long a row watches past its deadline before it gives up on a surface (a late
#: detection is recorded, and fails).
GRACE_S = 10.0
#: How long the cluster may take to be back to OK after the fault is cleared (an engine
#: restarted, the queues drained).
RECOVER_S = 45.0
#: Load before the fault: turns answered, so the store holds blocks to read back.
WARM_TURNS = 8
#: The diagnose window after a fault is cleared (the cluster judged healthy again).
CLEAR_WINDOW_S = 4.0
#: Before that window: the view's per-engine compute figures are over its last window of
#: about a second, so a sample taken within it of the clear still measures the fault.
SETTLE_S = 1.5


def pick_rows(only: Sequence[str]) -> list[Row]:
    """The rows ``--only`` names (every row when none), in catalogue order.

    Raises:
        UsageError: a name that is no row.
    """
    from dualpath_cli.errors import UsageError

    names = [r.name for r in ROWS]
    bad = [n for n in only if n not in names]
    if bad:
        raise UsageError(f"--only: unknown row {', '.join(bad)}; choose from "
                         f"{', '.join(names)}")
    return [r for r in ROWS if not only or r.name in only]


class _Watch:
    """Samples of the cluster since a moment, and diagnose over them."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.samples: list[Sample] = []
        self.decisions: list[Any] = []
        self.since = -1
        self.status: Any = None
        self.metrics: list[MetricSample] = []

    def reset(self) -> None:
        self.samples, self.decisions = [], []

    def look(self) -> None:
        """One look: status, view, metrics, the decisions logged since the last look."""
        c = self.client
        self.status = c.status()
        view = c.view()
        text = c.metrics_text()
        self.metrics = parse_metrics(text)
        new = c.decisions(self.since)
        if new:
            self.since = max(self.since, max(d.seq for d in new))
            self.decisions.extend(new)
        self.samples.append(Sample(view.at, view, extras_from_metrics_text(text)))

    def reports(self) -> list[dict[str, Any]]:
        """Every diagnose workflow over the samples so far (``--json``'s report dicts)."""
        if not self.samples:
            return []
        th = self.status.thresholds
        ev = Evidence(self.samples, self.decisions, audit=self.status.audit,
                      alpha_s_per_token=th.alpha_s_per_token)
        return [r.to_dict() for r in rules.run_all(ev)]


def _ok(st: Any) -> bool:
    """``status``'s "running": ready, every engine healthy, no fault in force."""
    ready = st.ready if st.ready is not None else st.state == "ready"
    return bool(ready) and 0 < st.engines_total == st.engines_healthy and not st.faults


def _ok_within(client: Any, timeout: float) -> bool:
    """Whether the cluster is (or becomes) OK within ``timeout``."""
    return _wait(lambda: _ok(client.status()), timeout)


def _wait(pred: Callable[[], bool], timeout: float, step: float = INTERVAL_S) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if pred():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(step)


def _fix_for(client: Any, finding: Mapping[str, Any], made: Made) -> tuple[str, Callable[[], None]]:
    """Apply the fix ``finding`` offers, if the drill can; (label, undo) or ("", no-op)."""
    action = str(finding.get("action") or "")
    ev = finding.get("evidence") or {}
    if action.startswith("dualpath tune set alpha="):
        new = action.split("=", 1)[1].split()[0]
        entry = client.update_scheduler(alpha=new)
        old_tokens = (entry.old or {}).get("alpha_tokens") or (entry.old or {}).get("alpha")

        def undo() -> None:
            if old_tokens is not None:
                client.update_scheduler(alpha=int(old_tokens))

        return f"alpha -> {new}", undo
    if "diagnose hbm-frag --fix" in action and isinstance(ev.get("engine"), int):
        client.compact_hbm(int(ev["engine"]))
        return f"compact engine {ev['engine']}", lambda: None
    if "diagnose long-tail --fix" in action and ev.get("hot_blocks"):
        try:
            entry = client.replicate_blocks(list(ev["hot_blocks"]), None)
        except DualPathError as err:
            if NO_REPLICA_ROOTS in str(err) and "--replica-root" in action:
                # a cluster launched without replica roots (an operator's joined nodes): the
                # copies cannot be made here, and the finding said so and what to do
                # (launch --replica-root DIR); not a fix that failed, none applicable
                made.detail["fix_not_applicable"] = str(err)
                return "replicate (not applicable: no replica roots)", lambda: None
            made.detail["fix_refused"] = str(err)
            return "replicate (refused)", lambda: None
        if not any((entry.new.get("added") or {}).values()):
            # the finding offered copies that exist already: advice that changes nothing
            made.detail["fix_failed"] = ("it copied nothing: every hot block was already "
                                         "on every root")
            return "replicate (nothing to copy)", lambda: None
        return f"replicate {len(ev['hot_blocks'])} blocks", lambda: None
    if "dualpath storage verify" in action and made.detail.get("store"):
        return _verify(Path(made.detail["store"])), lambda: None
    return "", lambda: None


def _verify(root: Path) -> str:
    """``dualpath storage verify ROOT`` on the drill's local store: every block read and
    checked, any other corrupt one quarantined (recomputed when next needed)."""
    from dualpath_cli.storage import PosixStore
    from dualpath_cli.storage.inspect import verify_store

    report = verify_store(PosixStore(root))
    return f"storage verify ({report.checked} checked, {len(report.corrupt)} corrupt)"


def run_row(client: Any, row: Row, target: Target, load: AgentLoad,
            reference: dict[tuple[int, int], tuple[int, ...]],
            inject: Callable[[Sequence[str]], int]) -> RowResult:
    """Make one fault under load, watch, fix, clear, recover; the scored row."""
    res = RowResult(row.name, want=row.grade, deadline_s=row.deadline_s)
    why = row.skip_reason(target)
    if why:
        res.skipped = why
        return res
    watch = _Watch(client)
    try:  # the store reads so far: the warm-up's are what the load needs from the store
        scrape0 = parse_metrics(client.metrics_text())
    except DualPathError:
        scrape0 = []  # counted since start instead
    load.start()
    made: Made | None = None
    undo_fix: Callable[[], None] = lambda: None  # noqa: E731
    try:
        _wait(lambda: load.turns >= WARM_TURNS, 120)
        watch.look()
        base = watch.metrics
        target = dataclasses.replace(target, read_blocks=blocks_read(scrape0, base),
                                     read_nodes=nodes_read(scrape0, base))
        pre = watch.samples[-1]
        watch.reset()
        # the window starts just before the fault: counters diff from there (one look alone
        # would count since the cluster started, earlier rows' hot blocks included)
        watch.samples.append(pre)
        t0 = time.monotonic()
        made = row.make(target, inject)
        res.target = made.label
        res.deadline_s = made.expect.deadline_s
        best: list[Mapping[str, Any]] = []
        give_up = t0 + made.expect.deadline_s + GRACE_S
        while time.monotonic() < give_up:
            watch.look()
            now = time.monotonic() - t0
            if res.status_s is None and row.status_reports(made, watch.status):
                res.status_s = now
            if res.metrics_s is None and row.metrics_report(made, base, watch.metrics):
                res.metrics_s = now
            found = matching_findings(watch.reports(), made.expect)
            if found and res.diagnose_s is None:
                res.diagnose_s, best = now, found
            elif (found and now <= made.expect.deadline_s
                  and rank(worst_grade(found)) > rank(worst_grade(best))):
                best = found  # the grade counts as reached within the deadline
            want = rank(made.expect.grade)
            if res.detected_s is not None and (rank(worst_grade(best)) >= want
                                               or now > made.expect.deadline_s):
                break
            time.sleep(max(0.0, INTERVAL_S - (time.monotonic() - t0 - now)))
        if best:
            top = dict(best[0])
            res.grade, res.workflow = str(top["severity"]), str(top["workflow"])
            res.subject, res.subject_right = str(top.get("subject")), True
            res.finding = str(top.get("title") or "")
            res.fix, undo_fix = _fix_for(client, top, made)
            if made.detail.get("fix_refused") or made.detail.get("fix_failed"):
                res.fix_helped = False
                res.notes.append(f"fix refused: {made.detail['fix_refused']}"
                                 if made.detail.get("fix_refused") else
                                 f"fix failed: {made.detail['fix_failed']}")
            elif made.detail.get("fix_not_applicable"):
                res.notes.append(f"fix not applicable here: {made.detail['fix_not_applicable']}")
            elif res.fix:
                before = res.grade
                watch.reset()
                res.fix_helped = _wait(lambda: _better(watch, made, before, row.fix_drops,
                                                       top, res.notes),
                                       made.expect.deadline_s + GRACE_S)
            elif top.get("action") and res.grade != "OK":
                res.notes.append(f"no fix the drill can apply: {str(top['action'])[:100]}")
        else:
            other = _any_subject(watch.reports(), made) if watch.samples else []
            res.grade = worst_grade(other) if other else ""
            res.subject = str(other[0].get("subject") or "none") if other else "none"
            res.finding = str(other[0].get("title") or "") if other else ""
            if made.detail.get("block"):  # why no surface saw it: was it read at all?
                key = str(made.detail["block"])
                res.notes.append(f"the load read block {key[:12]} "
                                 f"{_reads_of(key, base, watch.metrics):g} times from the "
                                 f"store in the watch (before it: "
                                 f"{', '.join(k[:12] for k in target.read_blocks) or 'none'})")
    except DualPathError as err:
        res.error = str(err)
    except (OSError, ValueError) as err:
        res.error = f"{type(err).__name__}: {err}"
    finally:
        _clear(client, made, res)
        undo_fix()
        tally = load.stop()
        res.turns, res.turns_lost = len(tally.tokens), tally.lost()
        res.tokens_identical = tally.differing(reference) == 0 and res.turns_lost == 0
        if tally.errors:
            res.notes.append(f"lost: {tally.errors[0]}")
    if made is not None and made.detail.get("pid"):
        res.notes.append(f"node {made.detail['rejoin']} started again with its own command: "
                         f"pid {made.detail['pid']}, log {made.detail['log']}")
    if made is not None and res.cleared:
        why = _not_recovered(client, made)
        res.cleared = not why
        if why:
            res.notes.append(why)
    return res


def blocks_read(before: Sequence[MetricSample], after: Sequence[MetricSample]
                ) -> tuple[str, ...]:
    """Blocks read from the store between two scrapes (``dualpath_storage_block_reads_total``
    summed over nodes), most-read first: what the load needs from the store now."""
    name = "dualpath_storage_block_reads_total"

    def by_block(ss: Sequence[MetricSample]) -> dict[str, float]:
        out: dict[str, float] = {}
        for x in ss:
            if x.name == name and x.labels.get("block"):
                out[x.labels["block"]] = out.get(x.labels["block"], 0.0) + x.value
        return out

    b0, b1 = by_block(before), by_block(after)
    grew = {k: v - b0.get(k, 0.0) for k, v in b1.items() if v > b0.get(k, 0.0)}
    return tuple(sorted(grew, key=lambda k: (-grew[k], k)))


def _reads_of(key: str, before: Sequence[MetricSample],
              after: Sequence[MetricSample]) -> float:
    """Store reads of block ``key`` between two scrapes, all nodes."""
    name = "dualpath_storage_block_reads_total"
    return metric_values(after, name, block=key) - metric_values(before, name, block=key)


def nodes_read(before: Sequence[MetricSample], after: Sequence[MetricSample]
               ) -> tuple[int, ...]:
    """Nodes by their store reads between two scrapes (the count of
    ``dualpath_storage_read_latency_seconds``, tier store), most first; ties by index."""
    name = "dualpath_storage_read_latency_seconds_count"

    def by_node(ss: Sequence[MetricSample]) -> dict[int, float]:
        out: dict[int, float] = {}
        for x in ss:
            node = x.labels.get("node", "")
            if x.name == name and x.labels.get("tier") == "store" and node.isdigit():
                out[int(node)] = out.get(int(node), 0.0) + x.value
        return out

    n0, n1 = by_node(before), by_node(after)
    grew = {n: v - n0.get(n, 0.0) for n, v in n1.items() if v > n0.get(n, 0.0)}
    return tuple(sorted(grew, key=lambda n: (-grew[n], n)))


def _better(watch: _Watch, made: Made, before: str, drops: str = "",
            was: Mapping[str, Any] | None = None, notes: list[str] | None = None) -> bool:
    """Whether the fix helped: the grade dropped, or, for a row judged by an evidence value
    (``Row.fix_drops``), no finding is left or the value fell to :data:`FIX_DROP` of what it
    was (over a window of two looks or more since the fix: one look counts since start)."""
    watch.look()
    old = (was or {}).get("evidence", {}).get(drops) if drops else None
    if isinstance(old, int | float) and old > 0:
        if len(watch.samples) < 2:
            return False  # one look counts since start: the reads before the fix too
        found = matching_findings(watch.reports(), made.expect)
        vals = [f["evidence"][drops] for f in found
                if isinstance((f.get("evidence") or {}).get(drops), int | float)]
        if not found or (vals and max(vals) <= FIX_DROP * old):
            if notes is not None:
                now = f"{max(vals):.3g}" if vals else "no finding"
                notes.append(f"fix: {drops} {old:.3g} -> {now} (grade {worst_grade(found)})")
            return True
        return False
    return rank(worst_grade(matching_findings(watch.reports(), made.expect))) < rank(before)


def _any_subject(reports: list[dict[str, Any]], made: Made) -> list[dict[str, Any]]:
    """The findings of the expected workflow whatever their subject (what diagnose said
    instead, for the table)."""
    wf = made.expect.workflow
    return [f for r in reports for f in r.get("findings", ())
            if (wf is None or f.get("workflow") == wf)
            and f.get("severity") in ("WARNING", "CRITICAL")]


def _clear(client: Any, made: Made | None, res: RowResult) -> None:
    """Undo the fault: clear it through the API, or wait for the engine to come back."""
    if made is None:
        return
    try:
        if made.fault_id:
            client.clear_fault(made.fault_id)
        if made.undo is not None:
            made.undo()
        res.cleared = True
    except (DualPathError, OSError) as err:
        res.notes.append(f"clear failed: {err}")


def _serves(st: Any, name: str) -> bool:
    """Whether node ``name`` (the operator's) serves in ``st``'s membership record."""
    m = st.membership
    return m is not None and any(n.name == name and n.state == "serving" for n in m.nodes)


def _not_recovered(client: Any, made: Made) -> str:
    """Why the cluster is not back to OK ("": it is): status running with no fault within
    :data:`RECOVER_S`, and diagnose over a fresh window naming nothing about the subject at
    WARNING or worse."""
    if not _wait(lambda: _ok(client.status()), RECOVER_S):
        st = client.status()
        return (f"status not OK {RECOVER_S:g} s after the fault was cleared: {st.state}, "
                f"{st.engines_healthy}/{st.engines_total} engines healthy, "
                f"{len(st.faults)} faults in force")
    name = made.detail.get("rejoin")
    if name and not _wait(lambda: _serves(client.status(), str(name)), RECOVER_S):
        return (f"node {name} did not serve again within {RECOVER_S:g} s of being started "
                f"again (its log: {made.detail.get('log', 'none')})")
    watch = _Watch(client)
    watch.look()  # takes the decisions logged so far: the window holds only what follows
    time.sleep(SETTLE_S)  # the view's compute windows (about 1 s) end past the clear
    watch.reset()
    end = time.monotonic() + CLEAR_WINDOW_S
    while time.monotonic() < end:
        watch.look()
        time.sleep(INTERVAL_S)
    still = matching_findings(watch.reports(), made.expect)
    if still:
        return (f"diagnose still says after the fault was cleared: {still[0].get('severity')} "
                f"{still[0].get('title')}")
    return ""


@dataclass
class Session:
    """The cluster under drill: a client of its API, the API's URL and token, whether its
    processes run on this host, its store directory (where it is local), and the drill's own
    work directory for it (where the drill launched it)."""

    client: Any
    url: str
    token: str | None
    local: bool
    store: Path | None
    scratch: Path | None = None


def run_drill(session: Session, rows: Sequence[Row], *, repeat: int = 1,
              on_row: Callable[[RowResult], None] | None = None,
              relaunch: Callable[[], Session] | None = None,
              joined: Callable[[], Session] | None = None) -> list[RowResult]:
    """Every row ``repeat`` times against ``session``'s cluster.

    A row starts only on an OK cluster: when an earlier row left it broken (an engine that
    was not brought back), ``relaunch`` (the drill's own embedded cluster) gives a fresh one
    and the row says so; without it the row fails with that reason. A row that needs a
    joined node the cluster lacks (a leave) runs on the cluster ``joined`` gives (the
    drill's own joined one, launched on first need) and says so; without it, it is skipped.

    Raises:
        DualPathError: the cluster is not healthy to begin with, or the reference run failed.
    """
    s = session
    if not _ok_within(s.client, RECOVER_S):
        raise DrillError("the cluster is not OK before the drill (status: not running, or "
                         "faults in force): clear them first (dualpath faults clear --all)")
    out: list[RowResult] = []
    load = AgentLoad(s.url, s.token, drill_agents())
    side = _Side(joined)
    try:
        reference = load.reference()
        for _ in range(max(1, repeat)):
            for row in rows:
                note = ""
                if not _ok_within(s.client, RECOVER_S) and relaunch:
                    load.close()
                    s = relaunch()
                    load = AgentLoad(s.url, s.token, drill_agents())
                    note = "ran on a relaunched cluster: an earlier row left it not OK"
                if not _ok(s.client.status()):
                    res = RowResult(row.name, want=row.grade, deadline_s=row.deadline_s,
                                    error="the cluster was not OK before this row (an "
                                    "earlier row left it so)")
                else:
                    target = _target(s)
                    res = (side.run(row) if side.wanted(row, target) else
                           run_row(s.client, row, target, load, reference,
                                   _injector(s.client)))
                if note:
                    res.notes.append(note)
                out.append(res)
                if on_row is not None:
                    on_row(res)
    finally:
        load.close()
        side.close()
    return out


def _target(s: Session) -> Target:
    return Target(s.client.status(), s.client.view(), s.local, s.store, scratch=s.scratch)


class _Side:
    """The drill's own joined cluster, for the rows that need a node with a launcher of its
    own (a leave) where the cluster under drill has none: launched on first need, with its
    own load and reference run (its tokens are its own cluster's)."""

    NOTE = ("ran on the drill's own joined cluster (a scheduler and nodes P0, D0, D1, each "
            "its own launcher on loopback): the embedded default runs every node in one "
            "launcher, and a leave needs a node's own launcher to stop")

    def __init__(self, launch: Callable[[], Session] | None) -> None:
        self.launch = launch
        self.session: Session | None = None
        self.load: AgentLoad | None = None
        self.reference: dict[tuple[int, int], tuple[int, ...]] = {}

    def wanted(self, row: Row, target: Target) -> bool:
        """Whether ``row`` runs here: it is skipped on ``target`` for want of a joined node,
        and there is a joined cluster to launch."""
        return self.launch is not None and row.how == "leave" and bool(
            row.skip_reason(target))

    def run(self, row: Row) -> RowResult:
        """``row`` on the joined cluster (launched now if not yet); an error row when it
        cannot be launched or is not OK."""
        try:
            if self.session is None:
                assert self.launch is not None
                self.session = self.launch()
                self.load = AgentLoad(self.session.url, self.session.token, drill_agents())
                if not _ok_within(self.session.client, RECOVER_S):
                    raise DrillError("the drill's joined cluster was not OK after its launch")
                self.reference = self.load.reference()
            s = self.session
            if not _ok_within(s.client, RECOVER_S):
                raise DrillError("the drill's joined cluster was not OK before this row (an "
                                 "earlier row left it so)")
            assert self.load is not None
            res = run_row(s.client, row, _target(s), self.load, self.reference,
                          _injector(s.client))
        except DualPathError as err:
            res = RowResult(row.name, want=row.grade, deadline_s=row.deadline_s,
                            error=f"on the drill's joined cluster: {err}")
        res.notes.append(self.NOTE)
        return res

    def close(self) -> None:
        """Stop its load (the cluster itself is the front-end's to stop)."""
        if self.load is not None:
            self.load.close()
            self.load = None


def _injector(client: Any) -> Callable[[Sequence[str]], int]:
    """Inject SPECs through the API (audited); the id of the newest fault in force."""
    def inject(specs: Sequence[str]) -> int:
        entry = client.set_faults(list(specs))
        ids = [int(f.get("id", 0)) for f in entry.new.get("faults", [])]
        return max(ids, default=0)

    return inject


class DrillError(DualPathError):
    """The drill could not start (exit 3: no verdict)."""

    exit_code = 3
