"""``dualpath tune show|rollback|auto|suggest`` and ``tune set`` on a running cluster.

The logic is in services/tuning.py (live changes) and services/twin.py (predictions); these
commands resolve the cluster (cli/source.py), ask, and render.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from dualpath_cli.cli.options import (
    JsonOption,
    PortOption,
    TokenFileOption,
    UrlOption,
    json_option,
)
from dualpath_cli.cli.output import emit_json, stderr, stdout
from dualpath_cli.errors import DualPathError, UsageError
from dualpath_cli.units import (
    format_duration,
    format_duration_rounded,
    format_tokens,
    parse_duration,
)

if TYPE_CHECKING:
    from dualpath_cli.api.protocol import ClusterClient
    from dualpath_cli.cli.source import ClusterRef, Target
    from dualpath_cli.sim.twin_replay import Traffic
    from dualpath_cli.telemetry.view import ClusterView

__all__ = ["show", "rollback", "auto", "suggest", "set_live", "format_metric", "print_suggestion"]


def format_metric(value: float, fmt: str) -> str:
    """A predicted or simulated metric: ``-`` for NaN, yes/no, a duration or ``fmt``."""
    if math.isnan(value):
        return "-"
    if fmt == "bool":
        return "yes" if value else "no"
    return format_duration(value) if fmt == "duration" else format(value, fmt)


def _ref(url: str | None, port: int | None, token_file: Path | None) -> ClusterRef:
    """The shared options as the one :class:`~dualpath_cli.cli.source.ClusterRef`."""
    from dualpath_cli.cli.source import ClusterRef

    return ClusterRef(url, port, token_file)


def _client(ref: ClusterRef) -> ClusterClient:
    from dualpath_cli.cli import source

    return source.connect(ref, timeout=10.0)


def _confirm(question: str, yes: bool) -> None:
    """Go on with ``--yes``; ask in a terminal; refuse otherwise (a live change is not made
    by a script that did not say so)."""
    import sys

    if yes:
        return
    if not sys.stdin.isatty():
        raise UsageError(f"{question.rstrip('?')}: not asked (stdin is not a terminal); "
                         "pass --yes to apply")
    if not typer.confirm(question, default=False, err=True):
        raise typer.Exit(1)


def _value_text(field: str, value: Any, alpha_s_per_token: float | None = None) -> str:
    """A threshold as ``status`` shows it (cli/threshold_text.py; audit values are
    scheduler units: alpha in tokens, in seconds too where ``alpha_s_per_token`` is known)."""
    from dualpath_cli.cli.threshold_text import alpha_text, beta_text, quota_text

    if value is None:
        return "-"
    if not isinstance(value, int | float) or isinstance(value, bool):
        return str(value)
    if field in ("quota", "quota_s"):
        return quota_text(float(value))
    if field in ("alpha", "alpha_tokens"):
        return alpha_text(value, value * alpha_s_per_token if alpha_s_per_token else None)
    if field in ("beta", "beta_tokens"):
        return beta_text(value)
    return str(value)


#: An audit entry's scheduler field -> the name ``status`` and ``tune set`` give it.
_FIELD_NAMES = {"alpha_tokens": "alpha", "beta_tokens": "beta", "quota_s": "quota"}


def _audit_rows(entry: Any, alpha_s_per_token: float | None = None
                ) -> list[tuple[str, str, str]]:
    keys = list(dict.fromkeys([*entry.old, *entry.new]))
    return [(_FIELD_NAMES.get(k, k), _value_text(k, entry.old.get(k), alpha_s_per_token),
             _value_text(k, entry.new.get(k), alpha_s_per_token)) for k in keys]


def _print_audit(entry: Any, title: str, alpha_s_per_token: float | None = None) -> None:
    table = Table("field", "was", "now")  # the title on its own line: a narrow table wraps it
    for row in _audit_rows(entry, alpha_s_per_token):
        table.add_row(*row)
    stdout.print(title, highlight=False, soft_wrap=True)
    stdout.print(table)


def _view_with_alpha_s(client: ClusterClient) -> ClusterView:
    """The cluster's view, its thresholds carrying alpha in seconds as ``status`` has it
    (the view itself does not know the NIC rate), so the twin writes alpha as ``status``
    does (``alpha 3s``, not ``586K tok``)."""
    from dataclasses import replace

    view = client.view()
    th = view.scheduler.thresholds
    if th.alpha_s is None:
        alpha_s = client.status().thresholds.alpha_s
        if alpha_s is not None:
            view = replace(view, scheduler=replace(view.scheduler, thresholds=replace(
                th, alpha_s=alpha_s)))
    return view


def _live_twin(client: ClusterClient, url: str, hardware: str | None) -> tuple[Any, Any]:
    """(traffic, world) of the running cluster's served turns (its decision log)."""
    from dualpath_cli.services import twin

    view = _view_with_alpha_s(client)
    traffic = twin.traffic_from_decisions(view, client.decisions(-1), url)
    return traffic, twin.world_for(traffic, hardware=hardware)


def set_live(target: Target, ref: ClusterRef, pairs: dict[str, str], dry_run: bool, yes: bool,
              hardware: str, as_json: bool) -> None:
    from dualpath_cli.services.tuning import live_body

    body = live_body(pairs)
    if not dry_run:
        target.require_token("tune set")  # before anything is asked of the cluster
    with _client(ref) as client:
        if dry_run:
            _live_dry_run(client, target.url, body, None if hardware == "hopper" else hardware,
                          as_json)
            return
        th = client.status().thresholds
        if not as_json:
            from dualpath_cli.cli.threshold_text import alpha_text, beta_text, quota_text

            now = {"alpha": alpha_text(th.alpha_tokens, th.alpha_s),
                   "beta": beta_text(th.beta_tokens), "quota": quota_text(th.quota_s),
                   "read_side": th.read_side}
            for k, v in body.items():
                stderr.print(f"{k}: {now[k]} ({th.source.get(k, 'launch')}) -> {v}",
                             highlight=False)
        _confirm(f"apply to the running cluster at {target.url}?", yes)
        entry = client.patch_scheduler(body)
    if as_json:
        emit_json({"url": target.url, "live": True, "dry_run": False, "applied": True,
                   "audit": {"seq": entry.seq, "at": entry.at, "token_id": entry.token_id,
                             "old": entry.old, "new": entry.new}})
        return
    _print_audit(entry, f"tune set: {target.url} (audit #{entry.seq})", th.alpha_s_per_token)
    stderr.print("applied; `dualpath tune rollback` undoes it", highlight=False)


def _live_dry_run(client: ClusterClient, url: str, body: dict[str, Any], hardware: str | None,
                  as_json: bool) -> None:
    from dualpath_cli.sim import twin_search

    traffic, world = _live_twin(client, url, hardware)
    proposed = twin_search.proposed_setting(traffic, world, body)
    res = twin_search.compare(traffic, world, proposed)
    before = res.current
    after = next(p for p in res.ranked if p is not before)
    if as_json:
        emit_json({"url": url, "live": True, "dry_run": True, "applied": False,
                   "traffic": traffic.to_dict(), "world": world.to_dict(),
                   "current": before.to_dict(), "proposed": after.to_dict(),
                   "jct_change": res.change(after), "band": res.band(after),
                   "clears_band": res.clears(after), "replicates": res.replicates})
        return
    _predictions_table(f"tune set --dry-run: {url} (nothing applied; {len(traffic.plans)} "
                       f"agents, {traffic.turns} served turns replayed)", before, [after],
                       per_token_s=_alpha_per_token_s(traffic), band=res.band)
    for note in world.notes:
        stderr.print(f"note: {note}", highlight=False, soft_wrap=True)
    verdict = ("beats today's by more than its band" if res.clears(after)
               else "is inside its band: not a change the twin can tell from today's")
    stdout.print(f"proposed: {res.change(after):+.1%} +-{res.band(after):.1%} JCT {verdict}",
                 highlight=False, soft_wrap=True)


def _alpha_per_token_s(traffic: Traffic) -> float | None:
    """Seconds one token of alpha stands for as the cluster's status says it (None: the
    cluster did not say; alpha then reads in tokens, as ``status`` shows it)."""
    return traffic.alpha_s_per_token


def _setting_text(s: Any, today: Any = None, per_token_s: float | None = None) -> str:
    """A setting's fields as ``status`` shows thresholds (cli/threshold_text.py); with
    ``today``, only the fields that differ from it (a narrow terminal keeps one line)."""
    from dualpath_cli.cli.threshold_text import alpha_text, beta_text, quota_text

    fields = [("alpha", s.alpha, "alpha " + alpha_text(
                  s.alpha, s.alpha * per_token_s if per_token_s else None)),
              ("beta", s.beta, f"beta {beta_text(s.beta)}"),
              ("quota_s", s.quota_s, f"quota {quota_text(s.quota_s)}"),
              ("read_side", s.read_side, s.read_side), ("pd", s.pd, s.pd)]
    if today is not None:
        fields = [f for f in fields if getattr(today, f[0]) != f[1]] or [("", 0, "as today")]
    return ", ".join(text for _, _, text in fields)


def _predictions_table(title: str, current: Any, others: list[Any],
                       ranked_by: str = "jct", per_token_s: float | None = None,
                       band: Any = None, refused: list[tuple[Any, str]] | None = None
                       ) -> None:
    """Today's prediction and ``others`` (each by what it changes); ranked by the mean
    trajectory time (the twin's ``ranked_by``), its change has a column too. ``band``
    (a prediction -> its band) adds the band column; ``refused``: settings the simulator
    would not replay, each a row with its reason."""
    by_traj = ranked_by == "mean_trajectory"
    table = Table("setting", "JCT", "change", "mean traj.",
                  *(("traj. change",) if by_traj else ()), *(("band",) if band else ()),
                  "TTFT mean", "TTFT p90", "SNIC Max/Avg", title=title, title_justify="left")
    for p in [current, *others]:
        change = "" if p is current else f"{(p.jct_s - current.jct_s) / current.jct_s:+.1%}"
        now = current.mean_trajectory_s
        traj = "" if p is current or not by_traj else format_metric(
            (p.mean_trajectory_s - now) / now if now > 0 else math.nan, "+.1%")
        width = "" if p is current or not band else f"+-{band(p):.1%}"
        table.add_row("today" if p is current
                      else _setting_text(p.setting, current.setting, per_token_s),
                      format_metric(p.jct_s, "duration"), change,
                      format_metric(p.mean_trajectory_s, "duration"), *((traj,) if by_traj else ()),
                      *((width,) if band else ()),
                      format_metric(p.ttft_mean_s, "duration"),
                      format_metric(p.ttft_p90_s, "duration"), format_metric(p.snic_max_avg, ".2f"))
    for st, why in refused or []:
        table.add_row(_setting_text(st, current.setting, per_token_s),
                      f"not replayed: {why}", *[""] * (5 + by_traj + bool(band)))
    stdout.print(table)
    stdout.print(f"today: {_setting_text(current.setting, None, per_token_s)}",
                 highlight=False, soft_wrap=True)


def show(
    url: UrlOption = None,
    port: PortOption = None,
    token_file: TokenFileOption = None,
    last: Annotated[int, typer.Option(
        "--last", help="Scheduler changes of the audit log to list.")] = 5,
    as_json: JsonOption = False,
) -> None:
    """Thresholds in force on the running cluster, their source, and the recent changes."""
    from dualpath_cli.services.tuning import scheduler_audit

    ref = _ref(url, port, token_file)
    with _client(ref) as client:
        st = client.status()
        target = client.url
    th = st.thresholds
    changes = scheduler_audit(st.audit)[-max(0, last):] if last else []
    controllers: dict[str, Any] = dict(th.controllers or {})
    values = {"alpha": th.alpha_tokens, "beta": th.beta_tokens, "quota": th.quota_s,
              "read_side": th.read_side, "z_factor": th.z_factor}
    alpha_s = th.alpha_s
    scheduling = dict(st.scheduling or {})
    if as_json:
        emit_json({"url": target, "pd": st.pd, "model": st.model, "policy": st.policy,
                   "thresholds": {k: {"value": v, "source": th.source.get(k, "launch")}
                                  for k, v in values.items()},
                   "alpha_s": alpha_s, "scheduling": scheduling,
                   "controllers": controllers,
                   "changes": [{"seq": a.seq, "at": a.at, "token_id": a.token_id,
                                "old": a.old, "new": a.new} for a in changes]})
        return
    table = Table("threshold", "value", "source", title=f"tune show: {target} ({st.pd} "
                  f"{st.model}, {st.state})", title_justify="left")
    for k, v in values.items():
        text = _value_text(k, v) if k != "z_factor" else f"{v:g}"
        if k == "alpha" and alpha_s is not None:  # as the config gives it, tokens beside
            text = f"{format_duration_rounded(alpha_s)} ({text})"
        table.add_row(k, text, th.source.get(k, "launch"))
    stdout.print(table)
    if scheduling:
        subs = scheduling.get("sub_schedulers") or 1
        npg = scheduling.get("nodes_per_group") or 1
        stdout.print(("scheduling: hierarchical, " + f"{subs} sub-schedulers"
                      if scheduling.get("hierarchical") else "scheduling: flat (one scheduler)")
                     + f"; {npg} node{'s' if npg != 1 else ''} per engine group",
                     highlight=False)
    if controllers:
        ctl = Table("controller", "on", "bounds", "last step", title="dynamic controllers",
                    title_justify="left")
        for name, c in controllers.items():
            prev = c.get("last") or {}
            step = "-"
            if prev:
                sig = prev.get("signal")
                step = (f"{_value_text(name, prev.get('old'))} -> "
                        f"{_value_text(name, prev.get('new'))} ({prev.get('signal_name')} "
                        f"{'-' if sig is None else f'{sig:.2f}'}: {prev.get('reason', '')})")
            bounds = (f"{_value_text(name, c['floor'])} .. {_value_text(name, c['ceiling'])}"
                      if "floor" in c else "-")
            ctl.add_row(name, "on" if c.get("on") else "off", bounds, step)
        stdout.print(ctl)
    if not changes:
        stdout.print("no scheduler change since launch", highlight=False)
    import datetime as _dt

    for a in changes:
        when = _dt.datetime.fromtimestamp(a.at).strftime("%H:%M:%S")
        parts = ", ".join(f"{k} {w} -> {n}" for k, w, n in _audit_rows(a))
        stdout.print(f"#{a.seq} {when} {a.token_id}: {parts}", highlight=False,
                     soft_wrap=True)


def rollback(
    url: UrlOption = None,
    port: PortOption = None,
    token_file: TokenFileOption = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Say what would be restored.")] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Apply without asking.")] = False,
    as_json: JsonOption = False,
) -> None:
    """Undo the last scheduler change of the audit log (a second rollback redoes it)."""
    from dualpath_cli.cli import source
    from dualpath_cli.services.tuning import rollback_body

    ref = _ref(url, port, token_file)
    target = source.resolve(ref)
    if not dry_run:
        target.require_token("tune rollback")
    with _client(ref) as client:
        last, body = rollback_body(client.status().audit)
        if dry_run:
            if as_json:
                emit_json({"url": target.url, "undo": last.seq, "restore": body,
                           "applied": False})
            else:
                stdout.print(f"would undo audit #{last.seq}: " + ", ".join(
                    f"{k} -> {_value_text(k, v)}" for k, v in body.items()), highlight=False)
            return
        if not as_json:
            stderr.print(f"undo audit #{last.seq}: " + ", ".join(
                f"{k} -> {_value_text(k, v)}" for k, v in body.items()), highlight=False)
        _confirm(f"restore these values on {target.url}?", yes)
        entry = client.patch_scheduler(body)
    if as_json:
        emit_json({"url": target.url, "undo": last.seq, "restore": body, "applied": True,
                   "audit_seq": entry.seq})
        return
    _print_audit(entry, f"tune rollback: {target.url} (audit #{entry.seq} undoes "
                 f"#{last.seq})")


def auto(
    duration: Annotated[str, typer.Option(
        "--for", help="How long to watch after turning the controllers on.")] = "10m",
    window: Annotated[str, typer.Option(
        "--window", help="Throughput window (also the baseline measured first).")] = "30s",
    interval: Annotated[str, typer.Option("--interval", help="Time between looks.")] = "2s",
    max_drop: Annotated[float, typer.Option(
        "--max-drop", help="Roll back when throughput over the window falls by more than this "
        "fraction.")] = 0.10,
    url: UrlOption = None,
    port: PortOption = None,
    token_file: TokenFileOption = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Start without asking.")] = False,
    as_json: Annotated[bool, json_option(
        "Print one JSON object at the end.")] = False,
) -> None:
    """Turn the dynamic controllers on, watch throughput and TTFT, roll back on a drop.

    The scheduler runs its own controllers when it has them; an older server gets the
    client's controller steps (alpha from storage-NIC utilisation, beta from GPU
    utilisation) through PATCH. Either way the previous thresholds come back when
    throughput over --window falls more than --max-drop below the baseline.
    """
    from dualpath_cli.cli import source
    from dualpath_cli.services.tuning import guard_change

    duration_s, window_s = parse_duration(duration), parse_duration(window)
    interval_s = parse_duration(interval)
    if interval_s <= 0 or duration_s <= 0:
        raise UsageError("tune auto: --for and --interval must be more than zero")
    ref = _ref(url, port, token_file)
    target = source.resolve(ref)
    target.require_token("tune auto")
    _confirm(f"turn the dynamic controllers on at {target.url} for {duration}?", yes)

    def step(s: dict[str, Any]) -> None:
        if not as_json:
            rate = s["turns_per_s"]
            stderr.print(f"{s['t_s']:7.1f}s  {'-' if rate is None else f'{rate:.3g}'} turns/s"
                         f"  alpha {format_tokens(s['alpha'])}  beta "
                         f"{format_tokens(s['beta'])}"
                         + (f"  set {s['set']}" if "set" in s else ""), highlight=False)

    if not as_json:
        stderr.print(f"measuring the baseline over {window} ...", highlight=False)
    with _client(ref) as client:
        res = guard_change(client, duration_s=duration_s, window_s=window_s,
                           interval_s=interval_s, max_drop=max_drop, on_step=step)
    if as_json:
        emit_json({"url": target.url, **res.to_dict()})
    else:
        word = "rolled back" if res.rolled_back else "kept"
        stdout.print(f"tune auto ({res.mode} controllers): {word}: {res.reason}",
                     highlight=False, soft_wrap=True)
    if res.rolled_back:
        raise typer.Exit(1)


def _pd_choice(value: str | None) -> bool | list[str]:
    """``--pd``: none (False), ``auto`` (True) or the listed splits, each checked."""
    from dualpath_cli.config.model import parse_pd

    if value is None:
        return False
    if value.strip().lower() == "auto":
        return True
    out: list[str] = []
    for part in (p.strip() for p in value.split(",")):
        try:
            spec = parse_pd(part)
        except DualPathError as err:
            raise UsageError(f"--pd {value}: {err}") from None
        name = f"{spec.prefill_nodes}P{spec.decode_nodes}D"
        if name not in out:
            out.append(name)
    return out


def suggest(
    url: UrlOption = None,
    port: PortOption = None,
    token_file: TokenFileOption = None,
    from_file: Annotated[Path | None, typer.Option(
        "--from", help="A recording (dualpath record) instead of the live cluster.")] = None,
    pd: Annotated[str | None, typer.Option(
        "--pd", help="Also try other P/D splits (applied by relaunching): auto (those of the "
        "same node count in the bottleneck-free range) or a list, e.g. 4P8D,3P9D,6P6D (each "
        "listed split is a row of the answer).")] = None,
    hardware: Annotated[str | None, typer.Option(
        "--hardware", help="Hardware profile for a cluster of a model profile (default: "
        "hopper).")] = None,
    top: Annotated[int, typer.Option("--top", help="Best settings to print.")] = 3,
    max_settings: Annotated[int, typer.Option(
        "--max-settings", help="Most settings to replay besides today's and the listed P/D "
        "splits (the rest is listed as skipped).")] = 40,
    replicates: Annotated[int, typer.Option(
        "--replicates", help="Replays per setting: the spread of the replicates (arrivals and "
        "compute perturbed by seed) is each change's band.")] = 3,
    remeasure: Annotated[bool, typer.Option(
        "--remeasure", help="Measure this host's compute again (the embedded world keeps its "
        "first measurement, so that answers repeat).")] = False,
    budget: Annotated[str | None, typer.Option(
        "--budget", hidden=True, help="Ignored: the search is bounded by --max-settings, not "
        "by time.")] = None,
    window: Annotated[str | None, typer.Option(
        "--window", help="Live cluster: replay only the turns decided in this last stretch, e.g. "
        "10m (default: every decision the scheduler still keeps).")] = None,
    as_json: JsonOption = False,
) -> None:
    """Replay the cluster's served turns in the simulator and suggest better settings.

    Searches alpha, beta, the compute quota and the read-side policy (with --pd also the
    P/D split) one at a time around today's, then the best of each together; prints the
    predicted JCT, TTFT and SNIC Max/Avg of the best few (and every listed P/D split)
    beside today's, each change with its band, and the command that applies the best. A
    change is suggested only when it beats today's by more than its band (the spread of
    --replicates seeded replays; at least 1%); otherwise "keep today's settings" and why.
    The same recording and options give the same answer (with --json, all but wall_s). A
    recording with finished requests' stories (dualpath record keeps them) first
    calibrates the simulator to itself: the engines' busy time, the turns' hand-off and
    the client's gap between turns; a note says what was fitted. Ranked by predicted JCT;
    when the recorded arrivals set the JCT (no setting moves it by more than 1%), by the
    mean trajectory time, and the output says which.
    """
    from dualpath_cli.services import twin
    from dualpath_cli.sim import twin_search

    ref = _ref(url, port, token_file)
    if from_file is not None and ref.named:
        raise UsageError(f"--from and {ref.named} exclude each other")
    if top < 1:
        raise UsageError(f"--top {top}: must be at least 1")
    if max_settings < 0 or replicates < 1:
        raise UsageError("--max-settings must be at least 0 and --replicates at least 1")
    if budget is not None:
        parse_duration(budget)  # still a duration, as before; no longer a bound
    splits = _pd_choice(pd)
    window_s = parse_duration(window) if window is not None else None
    if window_s is not None and from_file is not None:
        raise UsageError("--window is for the live cluster: a recording replays its own "
                         "window (dualpath record --window)")
    if window_s is not None and window_s <= 0:
        raise UsageError(f"--window {window}: must be longer than 0 s")
    if from_file is not None:
        from dualpath_cli.cli.output import warn
        from dualpath_cli.services.recording import read_recording

        traffic = twin.traffic_from_recording(read_recording(from_file, on_cut=warn),
                                               str(from_file))
    else:
        with _client(ref) as client:
            target = client.url
            view = _view_with_alpha_s(client)
            decisions = client.decisions(-1)
            if window_s is not None:  # the decisions' clock is the view's (recording.py)
                decisions = [d for d in decisions if d.at >= view.at - window_s]
            traffic = twin.traffic_from_decisions(view, decisions, target, window_s or 0.0)
    if not as_json:
        groups = (f" (engine groups of {traffic.nodes_per_group} nodes)"
                  if traffic.nodes_per_group > 1 else "")
        stderr.print(f"replaying {len(traffic.plans)} agents ({traffic.turns} turns) of "
                     f"{traffic.source} on {traffic.pd} {traffic.model}{groups} ...",
                     highlight=False)
        if budget is not None:
            stderr.print("note: --budget is ignored: the search is bounded by "
                         "--max-settings, so that it answers the same twice", highlight=False)
    if remeasure:
        twin.forget_compute()
    world = twin.world_for(traffic, hardware=hardware)
    res = twin_search.suggest(traffic, world, pd=splits, max_settings=max_settings,
                              replicates=replicates)
    if as_json:
        emit_json(res.to_dict(top))
        return
    print_suggestion(res, top)


def print_suggestion(res: Any, top: int) -> None:
    """``tune suggest``'s table, notes and verdict line."""
    traffic, world = res.traffic, res.world
    per_token_s = _alpha_per_token_s(traffic)
    rows = [p for p in res.ranked if p is not res.current][:top]
    asked = [p for p in res.rows() if p.setting.pd in res.asked and p.setting.pd != traffic.pd
             and p not in rows]
    refused = [(s, why) for dim, s, why in res.refused if dim == "pd" and s.pd in res.asked]
    _predictions_table(f"tune suggest: {traffic.source} ({world.kind} world, "
                       f"{len(res.ranked)} settings x {res.replicates} replays; "
                       f"{res.ranking})", res.current, rows + asked, res.ranked_by,
                       per_token_s, res.band, refused)
    for note in world.notes:
        stderr.print(f"note: {note}", highlight=False, soft_wrap=True)
    if res.skipped:
        stderr.print(f"note: {len(res.skipped)} settings skipped: " + "; ".join(res.skipped),
                     highlight=False, soft_wrap=True)

    def label(s: Any) -> str:
        return _setting_text(s, traffic.current, per_token_s)

    if res.best is res.current:
        stdout.print(f"keep today's settings: {res.why(label)}", highlight=False,
                     soft_wrap=True)
        return
    best = res.best
    measure = "JCT" if res.ranked_by == "jct" else "mean trajectory time"
    jct = "" if res.ranked_by == "jct" else f" ({res.change(best):+.1%} JCT: arrivals set it)"
    stdout.print(f"best: {res.gain(best):+.1%} +-{res.band(best):.1%} {measure}{jct}; "
                 f"apply with: {res.command(best)}", highlight=False, soft_wrap=True)
