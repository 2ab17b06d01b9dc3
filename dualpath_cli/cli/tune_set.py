"""``dualpath tune set``: set the scheduler thresholds in a config file, or live.

With a cluster running (and no ``--config``) the change goes to it (cli/tune_live.py);
otherwise the config file is edited atomically, editing only those values' text so other
keys and comments stay (config/edit.py), and ``--dry-run`` writes nothing and runs the
simulator on one scenario with the current and the proposed values. config/ (yaml) and the
simulator (numpy) are imported inside the functions so that ``dualpath --help`` stays fast.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from dualpath_cli.cli.options import JsonOption, PortOption, TokenFileOption, url_option
from dualpath_cli.cli.output import emit_json, stderr, stdout
from dualpath_cli.cli.sim_cmd import (
    resolve_agents,
    resolve_workload,
    workload_keys,
    workload_label,
)
from dualpath_cli.cli.tune_live import format_metric, set_live
from dualpath_cli.core.profiles import get_hardware_profile, get_model_profile
from dualpath_cli.errors import ConfigError, UsageError, pick
from dualpath_cli.units import format_duration

if TYPE_CHECKING:
    from dualpath_cli.config import LoadedConfig, SchedulerConfig
    from dualpath_cli.sim import AgentPlan, SimResult, Workload

__all__ = ["set_thresholds", "TUNABLE"]

#: What ``tune set`` changes: short name -> config key (``scheduler.`` may be written too).
TUNABLE: dict[str, str] = {
    "alpha": "scheduler.alpha",
    "beta": "scheduler.beta",
    "compute_quota": "scheduler.compute_quota",
    "z_factor": "scheduler.z_factor",
}

#: Layer precedence (config/loader.py): a key set in a higher layer than the file written
#: keeps its value, so ``tune set`` says so instead of silently changing nothing.
_RANK = {"default": 0, "profile": 0, "preset": 0, "system": 1, "user": 2, "file": 3,
         "env": 4, "flag": 5}


def _pairs(pairs: list[str]) -> dict[str, str]:
    """``{name: value text}`` from KEY=VALUE arguments (syntax only)."""
    out: dict[str, str] = {}
    for pair in pairs:
        name, sep, text = (part.strip() for part in pair.partition("="))
        if not sep or not name or not text:
            raise UsageError(f"tune set: {pair!r}: expected KEY=VALUE, e.g. alpha=3s")
        out[name] = text
    return out


def _assignments(pairs: list[str]) -> dict[str, str]:
    """``{config key: value text}`` from KEY=VALUE arguments, each value checked alone."""
    from dualpath_cli.config.layers import scalar_from_text
    from dualpath_cli.config.schema import KEY_BY_PATH

    changes: dict[str, str] = {}
    for name, text in _pairs(pairs).items():
        try:
            key = pick(TUNABLE, name.removeprefix("scheduler."), "tunable key")
            KEY_BY_PATH[key].kind.parse(scalar_from_text(text))
        except (UsageError, ValueError) as err:
            raise UsageError(f"tune set: {name}={text}: {err}") from None
        changes[key] = text
    return changes


def _given(loaded: LoadedConfig, key: str) -> str:
    from dualpath_cli.config.render import display_value

    setting = loaded.settings[key]
    return display_value(key, setting.value, setting.raw)


def _shadowed(loaded: LoadedConfig, key: str, target_kind: str) -> str | None:
    """A note when a higher layer than the file (env, --config) sets ``key``."""
    source = loaded.source(key)
    if _RANK[source.kind] > _RANK[target_kind]:
        return (f"{key} stays {_given(loaded, key)} from {source}, which overrides the "
                "file written")
    return None


@dataclass(frozen=True, slots=True)
class _Scenario:
    """The ``--dry-run`` workload: ``sim run``'s options."""

    model: str
    pd: str
    hardware: str
    policy: str
    workload: Workload
    agents: int
    aps: float | None
    horizon: float

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "pd": self.pd, "hardware": self.hardware,
                "policy": self.policy, **workload_keys(self.workload),
                "mode": "offline" if self.aps is None else "online",
                **({"agents": self.agents} if self.aps is None
                   else {"aps": self.aps, "horizon_s": self.horizon}),
                "seed": self.workload.seed}


def _thresholds(sched: SchedulerConfig, sc: _Scenario) -> dict[str, float]:
    """alpha/beta in tokens, quota in seconds, z: resolved against the scenario's profiles."""
    from dualpath_cli.config import resolve_alpha, resolve_beta, resolve_quota

    model, hw = get_model_profile(sc.model), get_hardware_profile(sc.hardware)
    return {
        "scheduler.alpha": resolve_alpha(sched.alpha, model, hw).value,
        "scheduler.beta": resolve_beta(sched.beta, model, hw, sched.reference_context,
                                       sched.reference_append).value,
        "scheduler.compute_quota": resolve_quota(sched.compute_quota, hw).value,
        "scheduler.z_factor": sched.z_factor,
    }


def _simulate(values: dict[str, float], sc: _Scenario, plans: list[AgentPlan]) -> SimResult:
    from dualpath_cli.core.calibration import SimCalibration
    from dualpath_cli.sim import make_setup, simulate_offline, simulate_online

    cal = replace(SimCalibration(), quota_s=values["scheduler.compute_quota"],
                  z_factor=values["scheduler.z_factor"])
    beta = int(values["scheduler.beta"])
    if beta < cal.block_tokens:
        raise UsageError(f"tune set --dry-run: beta resolves to {beta} tokens for "
                         f"{sc.model} on {sc.hardware}, below one block ({cal.block_tokens})")
    setup = make_setup(sc.model, sc.pd, sc.policy, sc.hardware, calibration=cal,
                       alpha=int(values["scheduler.alpha"]), beta=beta)
    if sc.aps is None:
        return simulate_offline(setup, plans)
    return simulate_online(setup, sc.aps, horizon=sc.horizon, plans=plans)


def _metrics(res: SimResult) -> list[tuple[str, float, str]]:
    """(name, value, format) compared by the dry run; NaN where the run has no value."""
    from dualpath_cli.sim import meets_slo

    nan = float("nan")
    rows = [("JCT" if res.mode == "offline" else "mean trajectory time", res.jct, "duration")]
    if res.mode == "offline":  # the JCT is the slowest trajectory; the mean the typical one
        rows.append(("mean trajectory time", res.extra["mean_trajectory_s"], "duration"))
    if res.mode == "online":
        rows += [("TTFT mean", res.ttft.mean if res.ttft else nan, "duration"),
                 ("TTFT p90", res.ttft.p90 if res.ttft else nan, "duration"),
                 ("TTST mean", res.ttst.mean if res.ttst else nan, "duration"),
                 ("TPOT mean", res.tpot.mean if res.tpot else nan, "duration"),
                 ("SLO met", float(meets_slo(res)), "bool")]
    rows += [("SNIC Max/Avg", res.snic_max_avg, ".2f"), ("SNIC util", res.snic_util, ".0%"),
             ("PE busy", res.pe_util, ".0%")]
    return rows


def _change(current: float, proposed: float) -> float | None:
    if math.isnan(current) or math.isnan(proposed) or current == 0:
        return None
    return (proposed - current) / current


def _resolved_text(key: str, value: float) -> str:
    if key == "scheduler.compute_quota":
        return format_duration(value)
    if key == "scheduler.z_factor":
        return f"{value:g}"
    return f"{int(value):,} tokens"


def set_thresholds(
    assignments: Annotated[list[str], typer.Argument(
        metavar="KEY=VALUE", help="Thresholds to set: alpha, beta, compute_quota, z_factor "
        "(optionally scheduler.-prefixed), e.g. alpha=2s beta=300K.")],
    config: Annotated[Path | None, typer.Option(
        "--config", "-c", help="Config file to update (default: the user config file, "
        "$XDG_CONFIG_HOME/dualpath/config.yaml); created if missing.")] = None,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Write nothing: simulate the scenario below with the current and the "
        "proposed thresholds and print the predicted difference.")] = False,
    model: Annotated[str, typer.Option("--model", help="Dry run: model profile.")] = "ds660b",
    pd: Annotated[str, typer.Option("--pd", help="Dry run: prefill and decode nodes.")] = "2P4D",
    hardware: Annotated[str, typer.Option(
        "--hardware", help="Dry run: hardware profile.")] = "hopper",
    max_len: Annotated[str | None, typer.Option(
        "--max-len", help="Dry run: max length of the synthetic workload (default: 32K); a "
        "--trace has its own.")] = None,
    trace: Annotated[Path | None, typer.Option(
        "--trace", help="Dry run: replay this dualpath trace file instead of the synthetic "
        "workload (augmented as the paper does past its size).")] = None,
    agents: Annotated[int | None, typer.Option(
        "--agents", help="Dry run: agents starting at t=0 (default: 512, or every trajectory of "
        "a --trace).")] = None,
    policy: Annotated[str, typer.Option(
        "--policy", help="Dry run: simulator policy.")] = "dualpath",
    aps: Annotated[float | None, typer.Option(
        "--aps", help="Dry run: online mode at this many agents/s (TTFT, TPOT).")] = None,
    horizon: Annotated[float, typer.Option("--horizon", help="Dry run: online length, s.")] = 600.0,
    seed: Annotated[int, typer.Option(
        "--seed", help="Dry run: seed of the synthetic workload (and of a --trace's "
        "augmentation).")] = 1,
    url: Annotated[str | None, url_option(
        "Change this running cluster (default: --port's cluster, else DUALPATH_URL, else "
        "the running cluster's state file; with none, the config file is edited).")] = None,
    port: PortOption = None,
    token_file: TokenFileOption = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Live: apply without asking.")] = False,
    as_json: JsonOption = False,
) -> None:
    """Set scheduler thresholds live on the running cluster, or in a config file.

    With a cluster running (--url, --port, DUALPATH_URL or the state file) and no --config, the
    change goes through PATCH /api/v1/scheduler (token needed, audited; asks first unless
    --yes), and --dry-run replays the cluster's served turns in the simulator (the twin).
    Otherwise the config file is edited atomically (other keys and comments stay), and
    --dry-run simulates the scenario options below.
    """
    from dualpath_cli.config import default_user_file, load_config

    if config is None:
        from dualpath_cli.cli import source

        ref = source.ClusterRef(url, port, token_file)
        live = source.running(ref)
        if live is not None:
            set_live(live, ref, _pairs(assignments), dry_run, yes, hardware, as_json)
            return
    elif url is not None or port is not None:
        flag = "--url" if url is not None else "--port"
        raise UsageError(f"tune set: {flag} changes a running cluster and --config a file; "
                         "give one")
    changes = _assignments(assignments)
    target = config if config is not None else default_user_file(os.environ)
    base = config if config is not None and config.exists() else None
    current = load_config(config_file=base)
    try:
        proposed = load_config(config_file=base,
                               overrides=[f"{k}={v}" for k, v in changes.items()])
    except ConfigError as err:  # e.g. beta below one block: name the key, not "--set"
        raise UsageError(f"tune set: {str(err).removeprefix('--set: ')}") from None
    kind = "file" if config is not None else "user"
    notes = [n for n in (_shadowed(current, k, kind) for k in changes) if n]
    rows = [{"key": k, "current": _given(current, k), "current_source": str(current.source(k)),
             "proposed": _given(proposed, k)} for k in changes]
    if dry_run:
        wl = resolve_workload(trace, max_len, seed, default_max_len="32K")
        _dry_run(target, rows, notes, current, proposed, _Scenario(
            model, pd, hardware, policy, wl, resolve_agents(agents, wl, 512), aps, horizon),
            as_json)
        return
    _write(target, changes, rows, notes, as_json)


def _write(target: Path, changes: dict[str, str], rows: list[dict[str, Any]],
           notes: list[str], as_json: bool) -> None:
    from dualpath_cli.config.edit import write_config_values
    from dualpath_cli.config.layers import scalar_from_text

    write_config_values(target, {k: scalar_from_text(v) for k, v in changes.items()})
    if as_json:
        emit_json({"path": str(target), "dry_run": False, "written": True, "changes": rows,
                   "notes": notes})
        return
    table = Table("key", "was", "now", title=f"tune set: {target}", title_justify="left")
    for row in rows:
        table.add_row(row["key"], f"{row['current']} ({row['current_source']})",
                      row["proposed"])
    stdout.print(table)
    for note in notes:
        stderr.print(f"note: {note}", highlight=False, soft_wrap=True)
    stderr.print(f"wrote {target}", highlight=False, soft_wrap=True)


def _dry_run(target: Path, rows: list[dict[str, Any]], notes: list[str],
             current: LoadedConfig, proposed: LoadedConfig, sc: _Scenario,
             as_json: bool) -> None:
    from dualpath_cli.sim import online_agents

    n = sc.agents if sc.aps is None else online_agents(sc.aps, sc.horizon)
    old, new = (_thresholds(c.config.scheduler, sc) for c in (current, proposed))
    for row in rows:
        row.update({"current_resolved": old[row["key"]], "proposed_resolved": new[row["key"]]})
    plans = sc.workload.plans(n)  # both runs replay the same agents
    before, after = _simulate(old, sc, plans), _simulate(new, sc, plans)
    metrics = [(name, a, b, fmt) for (name, a, fmt), (_, b, _) in
               zip(_metrics(before), _metrics(after), strict=True)]
    if as_json:
        emit_json({"path": str(target), "dry_run": True, "written": False, "changes": rows,
                   "notes": notes, "scenario": sc.to_dict(), "simulation": {
                       "current": before.to_dict(), "proposed": after.to_dict(),
                       "delta": {name: {"current": a, "proposed": b, "change": _change(a, b)}
                                 for name, a, b, _ in metrics}}})
        return
    settings = Table("key", "current", "proposed", title=f"tune set --dry-run: {target} "
                     "(nothing written)", title_justify="left")
    for row in rows:
        settings.add_row(
            row["key"],
            f"{row['current']} = {_resolved_text(row['key'], row['current_resolved'])}",
            f"{row['proposed']} = {_resolved_text(row['key'], row['proposed_resolved'])}")
    stdout.print(settings)
    what = (f"{sc.agents} agents" if sc.aps is None
            else f"{sc.aps:g} agents/s for {sc.horizon:g}s")
    table = Table("predicted", "current", "proposed", "change", title_justify="left",
                  title=f"{sc.model} {sc.pd} {workload_label(sc.workload)}, {what}, {sc.policy}")
    for name, a, b, fmt in metrics:
        change = _change(a, b)
        table.add_row(name, format_metric(a, fmt), format_metric(b, fmt),
                      "-" if change is None or fmt == "bool" else f"{change:+.1%}")
    stdout.print(table)
    for note in notes:
        stderr.print(f"note: {note}", highlight=False, soft_wrap=True)


