"""``dualpath diagnose WORKFLOW``: collect evidence, print findings, exit with a verdict.

Exit codes are the contract cron and CI branch on: 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN
(cli/checks.py). Bad arguments, an unreadable recording and an unreachable cluster are
UNKNOWN (3) here, not Click's usage code 2, which would read as CRITICAL. The rules are
pure functions in dualpath_cli/diagnose/rules.py; this module only collects samples and
renders.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar

import typer

from dualpath_cli.cli.checks import CheckCommand, Unknown, emit_unknown
from dualpath_cli.cli.options import JsonOption, PortOption, TokenFileOption, UrlOption
from dualpath_cli.errors import DualPathError

if TYPE_CHECKING:
    from rich.console import Console

    from dualpath_cli.api.protocol import ClusterClient
    from dualpath_cli.cli.source import ClusterRef
    from dualpath_cli.diagnose.model import Evidence, Report

__all__ = ["diagnose", "register", "render_reports", "WORKFLOW_NAMES"]

#: What diagnose decodes of a recording at most: samples, and samples x engines (evenly
#: spaced, the first and the last always). The rules judge shares of samples and
#: first-to-last deltas, which an even stride keeps; decoding every 1 s sample of 1,152
#: engines over 10 minutes would take most of a minute. A 1P2D recording is read whole up
#: to 600 samples; 1,152 engines give about 52 (one every ~12 s over 10 minutes).
MAX_SAMPLES = 600
MAX_ENGINE_SAMPLES = 60_000
#: What WORKFLOW accepts (perf-drop is the seed's name for snic-imbalance).
WORKFLOW_NAMES = ("perf-drop", "snic-imbalance", "long-tail", "hbm-frag", "cache-hit",
                  "scaling", "membership", "store-health", "fabric", "all")
#: Workflows whose findings ``--fix`` can act on (hbm-frag: compaction; long-tail: copies of
#: its hot blocks on the store's replica roots, and the HBM findings it borrows).
_FIXABLE = ("hbm-frag", "long-tail")
#: How long ``--fix`` watches the cluster again after applying its remedies.
RECHECK_WINDOW = "2s"


class _DiagnoseCommand(CheckCommand):
    """Click's usage errors are UNKNOWN (3); the ``--json`` object has no reports."""

    unknown_fields: ClassVar[dict[str, Any]] = {"reports": []}


def register(app: typer.Typer) -> None:
    """Add ``diagnose`` to the ``dualpath`` app."""
    app.command("diagnose", cls=_DiagnoseCommand)(diagnose)


def _evidence(ref: ClusterRef, from_file: Path | None, window: str,
              interval: str) -> tuple[Evidence, str, int]:
    """The window's evidence, where it came from, and how many samples it had."""
    from dualpath_cli.diagnose.model import Evidence

    if from_file is not None:
        from dualpath_cli.cli.output import warn
        from dualpath_cli.services.recording import read_recording

        rec = read_recording(from_file, max_samples=MAX_SAMPLES,
                             max_engine_samples=MAX_ENGINE_SAMPLES, on_cut=warn)
        in_file = int(rec.header.get("samples_in_file", len(rec.samples)))
        # a recording with an ``audit`` line names a change by its audit entry; an older
        # one (audit None) has its changes read off the samples' thresholds
        return (Evidence(rec.samples, rec.decisions, audit=rec.audit,
                         alpha_s_per_token=rec.alpha_s_per_token),
                str(from_file), in_file)
    from dualpath_cli.cli import source
    from dualpath_cli.cli.sampling import parse_interval
    from dualpath_cli.services.recording import collect
    from dualpath_cli.telemetry.view import Decision
    from dualpath_cli.units import parse_duration

    window_s = parse_duration(window)
    interval_s = min(parse_interval(interval), max(window_s / 2, 0.25))
    decisions: list[Decision] = []
    with source.connect(ref, timeout=max(5.0, interval_s * 4)) as client:
        target = client.url
        samples = list(collect(client, window_s, interval_s, decisions_out=decisions))
        th = (status := client.status()).thresholds  # the audit log, as of the window's end
        earlier = _earlier_decisions(client, samples, decisions, status.audit, th)
    return (Evidence(samples, decisions, audit=status.audit, earlier=earlier,
                     alpha_s_per_token=th.alpha_s_per_token),
            target, len(samples))


def _earlier_decisions(client: ClusterClient, samples: list[Any], decisions: list[Any],
                       audit: Sequence[Any], th: Any) -> list[Any]:
    """Decisions the cluster logged before the window, back to where the snic-imbalance
    rule needs them: a change of alpha or the read side made shortly before (or in) the
    window is judged against the reads before it (as long before it as has passed since).
    Nothing is fetched when no such change can be in reach (no scheduler change in the audit
    log near the window, no alpha controller on). The server's ring bounds how far back."""
    from dualpath_cli.diagnose.model import Evidence
    from dualpath_cli.diagnose.workflows.snic_imbalance import change_reach_s

    if not samples:
        return []
    start, end = samples[0].at, samples[-1].at
    reach = change_reach_s(end - start)
    changes = Evidence([], audit=audit).changes
    need = [c.at - (end - c.at) for c in changes if start - reach <= c.at <= end]
    ctl = (th.controllers or {}).get("alpha") or {}
    if (isinstance(ctl, dict) and ctl.get("on")) or th.source.get("alpha") == "controller":
        need.append(start - reach - (end - start + reach))  # a step at the reach's edge
    if not need or min(need) >= start:
        return []
    first = min((d.seq for d in decisions), default=None)
    if first is None:
        last = samples[-1].view.scheduler.last_decision_seq
        first = (last + 1) if last is not None else None
    back = 256
    while True:
        since = -1 if first is None else max(-1, first - 1 - back)
        got = [d for d in client.decisions(since) if first is None or d.seq < first]
        # far enough back, all the ring keeps, or nothing older kept (the ring wrapped)
        if since == -1 or not got or got[0].at <= min(need) or got[0].seq > since + 1:
            return got
        back *= 4


def diagnose(
    workflow: Annotated[str, typer.Argument(help="One of: " + ", ".join(WORKFLOW_NAMES)
                                            + ".")],
    window: Annotated[str, typer.Option("--window", "-w", help="How long to watch a live "
                                        "cluster, e.g. 60s, 2m.")] = "30s",
    interval: Annotated[str, typer.Option("--interval", "-i", help="Time between samples "
                                          "(live).")] = "1s",
    url: UrlOption = None,
    port: PortOption = None,
    token_file: TokenFileOption = None,
    from_file: Annotated[Path | None, typer.Option("--from", help="Diagnose a recording "
                                                   "(dualpath record) instead.")] = None,
    by_layer: Annotated[bool, typer.Option("--by-layer", help="cache-hit: include the "
                                           "per-layer table.")] = False,
    fix: Annotated[bool, typer.Option("--fix", help="hbm-frag: compact; long-tail: add "
                                      "replicas of hot blocks (needs the token).")] = False,
    as_json: JsonOption = False,
) -> None:
    """Troubleshooting workflows (seed section 6). Exit 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN."""
    from dualpath_cli.cli.source import ClusterRef

    try:
        code = _diagnose(workflow, window, interval, ClusterRef(url, port, token_file),
                         from_file, by_layer, fix, as_json)
    except DualPathError as err:  # usage, recording, unreachable: no verdict
        if as_json:
            emit_unknown(str(err), reports=[])
        if isinstance(err, Unknown):
            raise
        raise Unknown(str(err)) from None
    raise typer.Exit(code)


def _diagnose(workflow: str, window: str, interval: str, ref: ClusterRef,
              from_file: Path | None, by_layer: bool, fix: bool, as_json: bool) -> int:
    from dualpath_cli.diagnose import rules
    from dualpath_cli.errors import UsageError, pick

    if workflow != "all":
        pick({n: n for n in WORKFLOW_NAMES}, workflow, "workflow", UsageError)
    if from_file is not None and ref.named:
        raise UsageError(f"--from and {ref.named} exclude each other")
    if fix:
        canonical = rules.ALIASES.get(workflow, workflow)
        if canonical not in _FIXABLE:
            raise UsageError(f"--fix applies to hbm-frag and long-tail, not {workflow}")
        if from_file is not None:
            raise UsageError("--fix acts on a live cluster, not a recording (drop --from)")
    ev, source, in_file = _evidence(ref, from_file, window, interval)
    live = from_file is None
    if live:
        ev = _with_previous(ev, source)
    reports = _run(rules, workflow, ev, by_layer)
    worst = max(int(r.severity) for r in reports)
    fixes: list[dict[str, Any]] | None = None
    before = reports
    if fix:
        fixes = _apply_fixes(ref, reports)
        if any(f["applied"] for f in fixes):  # judge again what the cluster reports now
            # (afresh: the fix changed what the previous verdict was about)
            ev, source, in_file = _evidence(ref, None, RECHECK_WINDOW, interval)
            reports = _run(rules, workflow, ev, by_layer)
            worst = max(int(r.severity) for r in reports)
    if live and ev.samples:
        from dualpath_cli.cli.verdict_memory import save_verdicts

        save_verdicts(source, ev.samples[-1].at, reports, ev.samples)
    names = ("OK", "WARNING", "CRITICAL", "UNKNOWN")
    if as_json:
        from dualpath_cli.cli.output import emit_json

        doc: dict[str, Any] = {
            "severity": names[worst], "exit_code": worst, "source": source,
            "window_s": ev.window_s, "samples": len(ev.samples), "samples_in_file": in_file,
            "decisions": len(ev.decisions), "reports": [r.to_dict() for r in reports]}
        if fixes is not None:
            doc["fixes"] = fixes
            doc["before"] = {"severity": names[max(int(r.severity) for r in before)],
                             "reports": [r.to_dict() for r in before]}
        emit_json(doc)
    else:
        from dualpath_cli.cli.output import stdout

        if fixes is not None and reports is not before:
            render_reports(stdout, before, source, by_layer)
            _render_fixes(stdout, fixes)
            stdout.print(f"re-checked over {RECHECK_WINDOW} after --fix:", highlight=False)
        elif fixes is not None:
            _render_fixes(stdout, fixes)
        render_reports(stdout, reports, source, by_layer, in_file)
    return worst


def _with_previous(ev: Evidence, target: str) -> Evidence:
    """``ev`` with the previous verdicts on ``target`` where one run ended just before this
    window, and the store-read counts earlier runs kept (cli/verdict_memory.py): the rules'
    hysteresis reads the first, store-latency's lookback the second."""
    from dualpath_cli.cli.verdict_memory import (
        load_previous,
        load_read_history,
        load_service_history,
    )

    if not ev.samples:
        return ev
    ev.previous = load_previous(target, ev.samples[0].at, ev.window_s)
    ev.read_history = load_read_history(target)
    ev.service_history = load_service_history(target)
    return ev


def _run(rules: Any, workflow: str, ev: Evidence, by_layer: bool) -> list[Report]:
    if workflow == "all":
        return list(rules.run_all(ev, by_layer=by_layer))
    return [rules.run_workflow(workflow, ev, by_layer=by_layer)]


def _fix_plan(reports: list[Report]) -> tuple[list[int], list[str], int | None]:
    """Engines whose HBM to compact, hot blocks found (WARNING or worse findings), and the
    copies the hot blocks need (each copy under half the hot share; None: not said)."""
    engines: list[int] = []
    blocks: list[str] = []
    copies: int | None = None
    for r in reports:
        for f in r.findings:
            if not f.severity or f.severity.name == "UNKNOWN":
                continue
            ev = f.evidence
            if "fragmentation" in ev and isinstance(ev.get("engine"), int):
                if ev["engine"] not in engines:
                    engines.append(ev["engine"])
            for key in ev.get("hot_blocks") or {}:
                if key not in blocks:
                    blocks.append(key)
            for n in (ev.get("copies_needed") or {}).values():
                copies = max(copies or 0, int(n))
    return engines, blocks, copies


def _apply_fixes(ref: ClusterRef, reports: list[Report]) -> list[dict[str, Any]]:
    """Apply the remedies the findings call for, with the launch's token: HBM compaction
    of the named engines, copies of the named hot blocks on the store's replica roots
    (``POST /api/v1/store/replicate``; a store without replica roots says so, and nothing
    changes)."""
    from dualpath_cli.api.errors import Rejected
    from dualpath_cli.cli import source

    engines, blocks, copies = _fix_plan(reports)
    fixes: list[dict[str, Any]] = []
    if engines or blocks:
        source.resolve(ref).require_token("diagnose --fix")  # nothing applied without it
    if engines:
        with source.connect(ref, timeout=30.0) as client:
            for eid in engines:
                entry = client.compact_hbm(eid)
                fixes.append({"action": "compact", "engine": eid, "applied": True,
                              "audit": entry.seq, "old": entry.old, "new": entry.new})
    if blocks:
        with source.connect(ref, timeout=60.0) as client:
            try:
                # a copy on every replica root, not only the finding's minimum: that was
                # sized from one window's mix of reads, and a hot block's share can grow
                entry = client.replicate_blocks(blocks, None)
            except Rejected as err:  # e.g. no replica roots: nothing was changed
                fixes.append({"action": "replicate", "blocks": blocks, "applied": False,
                              "why": f"{err}; nothing was changed"})
            else:
                held = entry.new.get("blocks", {})
                fixes.append({"action": "replicate", "blocks": blocks,
                              "applied": any(len(held.get(b, ())) > 1 for b in blocks),
                              "audit": entry.seq, "needed": copies, "copies": held,
                              "added": entry.new.get("added", {}),
                              "errors": entry.new.get("errors", {})})
    if not fixes:
        fixes.append({"action": "none", "applied": False,
                      "why": "no finding called for a fix the runtime can apply"})
    return fixes


def _render_fixes(console: Console, fixes: list[dict[str, Any]]) -> None:
    from rich.markup import escape

    for f in fixes:
        if f["action"] == "compact":
            o, n = f["old"], f["new"]
            console.print(
                f"[bold]fixed[/]    engine {f['engine']}: HBM compacted, fragmentation "
                f"{o['hbm_fragmentation']:.2f} -> {n['hbm_fragmentation']:.2f}, largest free "
                f"run {o['hbm_largest_free_blocks']} -> {n['hbm_largest_free_blocks']} blocks "
                f"(audit #{f['audit']})", highlight=False, soft_wrap=True)
        elif f["action"] == "replicate" and f["applied"]:
            for key in f["blocks"]:
                held, added = f["copies"].get(key, []), f["added"].get(key, [])
                why = f["errors"].get(key)
                console.print(
                    f"[bold]fixed[/]    block {key[:12]}: {len(held)} copies ("
                    f"+{len(added)}: {escape(', '.join(added)) or 'none new'})"
                    + (f"; not copied: {escape(why)}" if why else "")
                    + f" (audit #{f['audit']})", highlight=False, soft_wrap=True)
        else:
            what = (f"{len(f['blocks'])} hot blocks not replicated" if f["action"] ==
                    "replicate" else "nothing to fix")
            console.print(f"[yellow]not fixed[/] {what}: {escape(f['why'])}",
                          highlight=False, soft_wrap=True)


_STYLE = {"OK": "green", "WARNING": "yellow", "CRITICAL": "bold red", "UNKNOWN": "magenta"}


def _print_wrapped(console: Console, head: str, indent: int, text: str,
                   width: int | None) -> None:
    """``head`` (markup) then ``text``; on a terminal of ``width`` columns the text wraps
    under itself at ``indent`` (a finding reads as a block at 80 columns); on a pipe it
    stays one line, so ``grep`` sees a whole finding."""
    import textwrap

    from rich.markup import escape

    chunks = [text]
    if width is not None:
        chunks = textwrap.wrap(text, max(20, width - indent), break_long_words=False,
                               break_on_hyphens=False) or [text]
    console.print(head + escape(chunks[0]), highlight=False, soft_wrap=True)
    for chunk in chunks[1:]:
        console.print(" " * indent + escape(chunk), highlight=False, soft_wrap=True)


def render_reports(console: Console, reports: list[Report], source: str,
                   by_layer: bool = False, in_file: int | None = None) -> None:
    """The human rendering: one block per finding, worst first, then a verdict line."""
    from rich.markup import escape

    width = max(len(r.workflow) for r in reports)
    findings = sorted(((f, r) for r in reports for f in r.findings),
                      key=lambda fr: -int(fr[0].severity))
    pad = " " * (9 + width + 2)
    wrap_at = console.width if console.is_terminal else None
    for f, _r in findings:
        sev = f.severity.name
        _print_wrapped(console, f"[{_STYLE[sev]}]{sev:<8}[/] {f.workflow:<{width}}  ",
                       len(pad), f.title, wrap_at)
        for label, text in (("likely: ", f.cause), ("do:     ", f.action), ("why:    ", f.why)):
            if text:
                _print_wrapped(console, pad + label, len(pad) + len(label), text, wrap_at)
        layers = f.evidence.get("layers") if by_layer else None
        if layers:
            _layer_table(console, layers)
    worst = max(reports, key=lambda r: int(r.severity)).severity
    r0 = reports[0]
    console.print(f"{worst.name} (exit {int(worst)}): {len(reports)} workflow"
                  f"{'s' if len(reports) > 1 else ''} over {r0.window_s:.0f} s, "
                  f"{r0.samples} samples"
                  + (f" (evenly spaced, of {in_file})" if in_file and in_file > r0.samples
                     else "")
                  + f", {r0.decisions} decisions from {escape(source)}",
                  highlight=False, soft_wrap=True)


def _layer_table(console: Console, layers: list[dict[str, Any]]) -> None:
    from rich.table import Table

    table = Table(box=None, padding=(0, 1))
    for col in ("layer", "dram", "store", "peer", "slack", "worst"):
        table.add_column(col, justify="right")

    def pct(v: float | None) -> str:
        return "n/a" if v is None else f"{v * 100:.0f}%"

    def ms(v: float | None) -> str:
        return "n/a" if v is None else f"{v * 1e3:+.2f} ms"

    for r in layers:
        table.add_row(str(r["layer"]), pct(r["dram_share"]), pct(r["store_share"]),
                      pct(r["peer_share"]), ms(r["slack_s"]), ms(r["worst_slack_s"]))
    console.print(table)
