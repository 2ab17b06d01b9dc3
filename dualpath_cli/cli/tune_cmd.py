"""`dualpath tune`: compute the scheduler thresholds from hardware facts, and set them.

Two rules exist and both are supported (see core/thresholds.py):

* the seed's bandwidth-delay rule, alpha = storage-NIC bandwidth x latency, in bytes;
* the paper's window rule, alpha = tokens the node's storage NICs read in a window (3 s) and
  beta = prompt tokens one GPU prefills in a window (5 s), at a reference turn of --append
  new tokens after --context cached (core's ``prompt_tokens_per_s``, as config uses).

``tune set`` writes alpha, beta, the compute quota or z into a config file (atomically,
editing only those values' text so other keys and comments stay; see config/edit.py);
``--dry-run`` writes nothing and runs the simulator on one scenario with the current and the
proposed values.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.table import Table

from dualpath_cli.cli.output import emit_json, stderr, stdout
from dualpath_cli.cli.sim_cmd import (
    resolve_agents,
    resolve_workload,
    workload_keys,
    workload_label,
)
from dualpath_cli.core.profiles import (
    get_hardware_profile,
    get_model_profile,
)
from dualpath_cli.core.thresholds import (
    alpha_bytes_from_bdp,
    bytes_to_tokens,
    tokens_processable,
    tokens_readable,
)
from dualpath_cli.errors import ConfigError, DualPathError, UsageError, pick
from dualpath_cli.units import (
    format_bandwidth,
    format_bytes,
    format_duration,
    format_duration_rounded,
    format_tokens,
    parse_bandwidth,
    parse_bytes,
    parse_duration,
    parse_tokens,
)

if TYPE_CHECKING:
    from dualpath_cli.config import LoadedConfig, SchedulerConfig
    from dualpath_cli.sim import AgentPlan, SimResult, Workload

# config/ (yaml) and the simulator (numpy) are imported inside the commands so that
# ``dualpath --help`` stays fast (tests/test_cli_import_graph.py).

__all__ = ["app", "SEED_ALPHA_NOTE", "TUNABLE"]

app = typer.Typer(help="Compute the scheduler thresholds from hardware facts, and set them.",
                  no_args_is_help=True)

#: The paper's storage NIC (one 400 Gbps NIC per node), used when no bandwidth is given.
DEFAULT_SNIC = "400Gbps"

SEED_ALPHA_NOTE = ("the seed quotes alpha = 8KB for a 400Gbps storage NIC and 50us latency, "
                   "but its own rule gives 400Gbps x 50us = 2.5MB; 8KB would need a latency "
                   "of about 160ns")


def _snic(snic: str | None, hardware: str | None) -> tuple[float, str]:
    """Node storage bandwidth in bytes/s and where it came from."""
    if snic is not None:
        rate = parse_bandwidth(snic)
        if rate <= 0:  # alpha = rate x latency: a zero rate gives a zero threshold
            raise UsageError(f"--snic {snic!r}: must be greater than zero")
        return rate, "--snic"
    if hardware is not None:
        profile = get_hardware_profile(hardware)
        return profile.snic_bandwidth * profile.snics_per_node, f"hardware {profile.name}"
    return parse_bandwidth(DEFAULT_SNIC), f"default {DEFAULT_SNIC}"


def _bytes_per_token(value: str | None, model: str | None) -> tuple[int | None, str | None]:
    if value is not None:
        amount = parse_bytes(value)
        if amount <= 0:
            raise UsageError(f"invalid --bytes-per-token {value!r}: must be greater than zero")
        return amount, "--bytes-per-token"
    if model is not None:
        return get_model_profile(model).kv_bytes_per_token, f"model {model}"
    return None, None


def _render(title: str, rows: list[tuple[str, str]], notes: list[str]) -> None:
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column("quantity", style="bold")
    table.add_column("value")
    for name, value in rows:
        table.add_row(name, value)
    stdout.print(table)
    for note in notes:
        stdout.print(f"note: {note}", highlight=False, soft_wrap=True)


@app.command("alpha")
def alpha(
    latency: str | None = typer.Option(
        None, "--latency", help="Expected latency, e.g. 50us: selects the seed's "
        "bandwidth-delay rule (alpha in bytes)."),
    window: str | None = typer.Option(
        None, "--window", help="Reading window, e.g. 3s: selects the paper's rule (alpha in "
        "tokens the storage NICs read in that time)."),
    snic: str | None = typer.Option(
        None, "--snic", help="Storage-NIC bandwidth of one node, e.g. 400Gbps "
        "(default: from --hardware, else 400Gbps)."),
    bytes_per_token: str | None = typer.Option(
        None, "--bytes-per-token", help="KV bytes per token over all layers, e.g. 48068."),
    model: str | None = typer.Option(
        None, "--model", help="Model profile giving KV bytes per token (e.g. ds660b)."),
    hardware: str | None = typer.Option(
        None, "--hardware", help="Hardware profile giving the storage-NIC bandwidth."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Alpha, the short-read-queue threshold, by the seed's rule or the paper's."""
    if (latency is None) == (window is None):
        raise UsageError("tune alpha: give exactly one of --latency (the seed's bandwidth-delay "
                         "rule, bytes) or --window (the paper's rule, tokens)")
    bandwidth, bandwidth_source = _snic(snic, hardware)
    bpt, bpt_source = _bytes_per_token(bytes_per_token, model)
    if latency is not None:
        _alpha_bdp(bandwidth, bandwidth_source, parse_duration(latency), bpt, bpt_source,
                   as_json)
    else:
        assert window is not None
        if bpt is None:
            raise UsageError("tune alpha --window: give --bytes-per-token or --model to turn "
                             "bytes read into tokens")
        _alpha_window(bandwidth, bandwidth_source, parse_duration(window), bpt,
                      bpt_source or "", as_json)


def _alpha_bdp(bandwidth: float, bandwidth_source: str, latency: float, bpt: int | None,
               bpt_source: str | None, as_json: bool) -> None:
    amount = round(alpha_bytes_from_bdp(bandwidth, latency))
    tokens = bytes_to_tokens(amount, bpt) if bpt is not None else None
    inputs: dict[str, Any] = {"snic_bytes_per_s": bandwidth, "snic_source": bandwidth_source,
                              "latency_s": latency}
    if bpt is not None:
        inputs["bytes_per_token"] = bpt
    if as_json:
        payload: dict[str, Any] = {"rule": "bandwidth-delay", "alpha_bytes": amount}
        if tokens is not None:
            payload["alpha_tokens"] = tokens
        payload["inputs"] = inputs
        payload["note"] = SEED_ALPHA_NOTE
        emit_json(payload)
        return
    rows = [
        ("rule", "seed: alpha = storage-NIC bandwidth x latency (bandwidth-delay product)"),
        ("storage NIC", f"{format_bandwidth(bandwidth, bits=True)} = "
                        f"{format_bandwidth(bandwidth)} ({bandwidth_source})"),
        ("latency", format_duration(latency)),
        ("alpha", f"{format_bandwidth(bandwidth)} x {format_duration(latency)} = "
                  f"{format_bytes(amount, binary=False)} ({amount:,} bytes)"),
    ]
    if tokens is not None and bpt is not None:
        rows.append(("alpha in tokens", f"{amount:,} B / {bpt:,} B per token = {tokens:,} "
                                        f"tokens ({bpt_source})"))
    _render("tune alpha", rows, [SEED_ALPHA_NOTE])


def _alpha_window(bandwidth: float, bandwidth_source: str, window: float, bpt: int,
                  bpt_source: str, as_json: bool) -> None:
    tokens = tokens_readable(bandwidth, bpt, window)
    if as_json:
        emit_json({"rule": "window", "alpha_tokens": tokens, "inputs": {
            "snic_bytes_per_s": bandwidth, "snic_source": bandwidth_source, "window_s": window,
            "bytes_per_token": bpt, "bytes_per_token_source": bpt_source}})
        return
    per_s = bandwidth / bpt
    _render("tune alpha", [
        ("rule", "paper: alpha = tokens the node's storage NICs read in the window"),
        ("storage NIC", f"{format_bandwidth(bandwidth, bits=True)} = "
                        f"{format_bandwidth(bandwidth)} ({bandwidth_source})"),
        ("KV per token", f"{bpt:,} bytes ({bpt_source})"),
        ("read rate", f"{format_bandwidth(bandwidth)} / {bpt:,} B = "
                      f"{format_tokens(per_s)} tokens/s"),
        ("window", format_duration(window)),
        ("alpha", f"{format_tokens(per_s)} tokens/s x {format_duration(window)} = "
                  f"{tokens:,} tokens ({format_tokens(tokens)})"),
    ], [])


@app.command("beta")
def beta(
    window: str = typer.Option("5s", "--window", help="GPU work window (the paper uses 5s)."),
    tokens_per_s: str | None = typer.Option(
        None, "--tokens-per-s", help="Prefill throughput of one GPU in tokens/s, e.g. 12K."),
    model: str | None = typer.Option(
        None, "--model", help="Model profile (e.g. ds660b) to derive tokens/s from FLOPs."),
    hardware: str = typer.Option(
        "hopper", "--hardware", help="Hardware profile giving the GPU's achieved FLOP/s."),
    context: str = typer.Option(
        "32K", "--context", help="Cached context of the reference turn, for the FLOP model."),
    append: str = typer.Option(
        "429", "--append", help="New tokens of the reference turn (the paper's mean append "
        "on the 64K trace is 429)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Beta, the unfinished-token limit: tokens one GPU processes in the window."""
    seconds = parse_duration(window)
    inputs: dict[str, Any] = {"window_s": seconds}
    if tokens_per_s is not None:
        if model is not None:
            raise UsageError("tune beta: give --tokens-per-s or --model, not both")
        rate = float(parse_tokens(tokens_per_s))
        inputs.update({"tokens_per_s": rate, "source": "--tokens-per-s"})
        derivation = f"{format_tokens(rate)} tokens/s (given)"
    elif model is not None:
        profile, node = get_model_profile(model), get_hardware_profile(hardware)
        cached, new = parse_tokens(context), parse_tokens(append)
        if new < 1:
            raise UsageError(f"invalid --append {append!r}: must be at least 1 token")
        rate = node.prompt_tokens_per_s(profile, cached, new)
        inputs.update({"tokens_per_s": rate, "source": "profile", "model": profile.name,
                       "hardware": node.name, "context_tokens": cached,
                       "append_tokens": new})
        derivation = (f"({format_tokens(cached)} cached + {format_tokens(new)} new) prompt "
                      f"tokens / {node.prefill_s(profile, cached, new) * 1e3:.4g} ms to "
                      f"prefill the {format_tokens(new)} new ({profile.name}, {node.name} GPU "
                      f"{node.gpu_flops / 1e12:.4g} TFLOP/s achieved) = "
                      f"{format_tokens(rate)} prompt tokens/s")
    else:
        raise UsageError("tune beta: give --tokens-per-s, or --model (with --hardware, "
                         "--context and --append) to derive it from the FLOP model")
    tokens = tokens_processable(rate, seconds)
    if as_json:
        emit_json({"rule": "window", "beta_tokens": tokens, "inputs": inputs})
        return
    _render("tune beta", [
        ("rule", "paper: beta = tokens one GPU processes in the window"),
        ("throughput", derivation),
        ("window", format_duration(seconds)),
        ("beta", f"{format_tokens(rate)} tokens/s x {format_duration(seconds)} = "
                 f"{tokens:,} tokens ({format_tokens(tokens)})"),
    ], [])


# --- tune set ------------------------------------------------------------------------------

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
    from dualpath_cli.sim import SimCalibration, make_setup, simulate_offline, simulate_online

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


def _fmt(value: float, fmt: str) -> str:
    if math.isnan(value):
        return "-"
    if fmt == "bool":
        return "yes" if value else "no"
    return format_duration(value) if fmt == "duration" else format(value, fmt)


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


@app.command("set")
def set_thresholds(
    assignments: list[str] = typer.Argument(
        ..., metavar="KEY=VALUE", help="Thresholds to set: alpha, beta, compute_quota, "
        "z_factor (optionally scheduler.-prefixed), e.g. alpha=2s beta=300K."),
    config: Path | None = typer.Option(
        None, "--config", "-c", help="Config file to update (default: the user config file, "
        "$XDG_CONFIG_HOME/dualpath/config.yaml); created if missing."),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Write nothing: simulate the scenario below with the current "
        "and the proposed thresholds and print the predicted difference."),
    model: str = typer.Option("ds660b", "--model", help="Dry run: model profile."),
    pd: str = typer.Option("2P4D", "--pd", help="Dry run: prefill and decode nodes."),
    hardware: str = typer.Option("hopper", "--hardware", help="Dry run: hardware profile."),
    max_len: str | None = typer.Option(
        None, "--max-len", help="Dry run: max length of the synthetic workload (default: "
        "32K); a --trace has its own."),
    trace: Path | None = typer.Option(
        None, "--trace", help="Dry run: replay this dualpath trace file instead of the "
        "synthetic workload (augmented as the paper does past its size)."),
    agents: int | None = typer.Option(
        None, "--agents", help="Dry run: agents starting at t=0 (default: 512, or every "
        "trajectory of a --trace)."),
    policy: str = typer.Option("dualpath", "--policy", help="Dry run: simulator policy."),
    aps: float | None = typer.Option(
        None, "--aps", help="Dry run: online mode at this many agents/s (TTFT, TPOT)."),
    horizon: float = typer.Option(600.0, "--horizon", help="Dry run: online length, s."),
    seed: int = typer.Option(1, "--seed", help="Dry run: seed of the synthetic workload "
                             "(and of a --trace's augmentation)."),
    url: str | None = typer.Option(
        None, "--url", help="Change this running cluster (default: DUALPATH_URL, else the "
        "running cluster's state file; with none, the config file is edited)."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Live: apply without asking."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Set scheduler thresholds live on the running cluster, or in a config file.

    With a cluster running (--url, DUALPATH_URL or the state file) and no --config, the
    change goes through PATCH /api/v1/scheduler (token needed, audited; asks first unless
    --yes), and --dry-run replays the cluster's served turns in the simulator (the twin).
    Otherwise the config file is edited atomically (other keys and comments stay), and
    --dry-run simulates the scenario options below.
    """
    from dualpath_cli.config import default_user_file, load_config

    if config is None:
        from dualpath_cli.cli import source

        live = source.running(url)
        if live is not None:
            _set_live(live, url, _pairs(assignments), dry_run, yes, hardware, as_json)
            return
    elif url is not None:
        raise UsageError("tune set: --url changes a running cluster and --config a file; "
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
        table.add_row(name, _fmt(a, fmt), _fmt(b, fmt),
                      "-" if change is None or fmt == "bool" else f"{change:+.1%}")
    stdout.print(table)
    for note in notes:
        stderr.print(f"note: {note}", highlight=False, soft_wrap=True)


# --- live: set, show, rollback, auto, suggest ----------------------------------------------------
# The logic is in services/tuning.py (live changes) and services/twin.py (predictions); these
# commands resolve the cluster (cli/source.py), ask, and render.

def _client(url: str | None) -> Any:
    from dualpath_cli.cli import source

    return source.connect(url, timeout=10.0)


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


def _tokens(value: Any) -> str:
    return f"{format_tokens(value)} tokens" if isinstance(value, int | float) else str(value)


def _value_text(field: str, value: Any) -> str:
    """A threshold as an operator reads it (audit values are scheduler units)."""
    if value is None:
        return "-"
    if field in ("quota", "quota_s") and isinstance(value, int | float):
        return format_duration(float(value))
    if field in ("alpha", "beta", "alpha_tokens", "beta_tokens"):
        return _tokens(value)
    return str(value)


def _audit_rows(entry: Any) -> list[tuple[str, str, str]]:
    keys = list(dict.fromkeys([*entry.old, *entry.new]))
    return [(k, _value_text(k, entry.old.get(k)), _value_text(k, entry.new.get(k)))
            for k in keys]


def _print_audit(entry: Any, title: str) -> None:
    table = Table("field", "was", "now", title=title, title_justify="left")
    for row in _audit_rows(entry):
        table.add_row(*row)
    stdout.print(table)


def _live_twin(client: Any, url: str, hardware: str | None) -> tuple[Any, Any]:
    """(traffic, world) of the running cluster's served turns (its decision log)."""
    from dualpath_cli.services import twin

    view = client.view()
    traffic = twin.traffic_from_decisions(view, client.decisions(-1), url)
    return traffic, twin.world_for(traffic, hardware=hardware)


def _set_live(target: Any, url: str | None, pairs: dict[str, str], dry_run: bool, yes: bool,
              hardware: str, as_json: bool) -> None:
    from dualpath_cli.services.tuning import live_body

    body = live_body(pairs)
    if not dry_run:
        target.require_token("tune set")  # before anything is asked of the cluster
    with _client(url) as client:
        if dry_run:
            _live_dry_run(client, target.url, body, None if hardware == "hopper" else hardware,
                          as_json)
            return
        th = client.status().thresholds
        if not as_json:
            now = {"alpha": _tokens(th.alpha_tokens), "beta": _tokens(th.beta_tokens),
                   "quota": format_duration(th.quota_s), "read_side": th.read_side}
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
    _print_audit(entry, f"tune set: {target.url} (audit #{entry.seq})")
    stderr.print("applied; `dualpath tune rollback` undoes it", highlight=False)


def _live_dry_run(client: Any, url: str, body: dict[str, Any], hardware: str | None,
                  as_json: bool) -> None:
    from dualpath_cli.sim import twin_replay, twin_search

    traffic, world = _live_twin(client, url, hardware)
    proposed = twin_search.proposed_setting(traffic, world, body)
    before = twin_replay.predict(traffic, world, traffic.current)
    after = twin_replay.predict(traffic, world, proposed, "proposed")
    if as_json:
        emit_json({"url": url, "live": True, "dry_run": True, "applied": False,
                   "traffic": traffic.to_dict(), "world": world.to_dict(),
                   "current": before.to_dict(), "proposed": after.to_dict(),
                   "jct_change": (after.jct_s - before.jct_s) / before.jct_s})
        return
    _predictions_table(f"tune set --dry-run: {url} (nothing applied; {len(traffic.plans)} "
                       f"agents, {traffic.turns} served turns replayed)", before, [after],
                       per_token_s=_alpha_per_token_s(traffic, world))
    for note in world.notes:
        stderr.print(f"note: {note}", highlight=False, soft_wrap=True)


def _alpha_per_token_s(traffic: Any, world: Any) -> float | None:
    """Seconds one token of alpha stands for (its KV read at the node's storage NICs), so
    alpha reads as the config gives it; None where the cluster's NICs have no rate."""
    from dualpath_cli.core.thresholds import read_seconds

    return read_seconds(1, world.model.kv_bytes_per_token,
                        getattr(traffic, "snic_bytes_per_s", None) or 0.0)


def _setting_text(s: Any, today: Any = None, per_token_s: float | None = None) -> str:
    """A setting's fields (alpha in seconds of reading where ``per_token_s`` is known); with
    ``today``, only the fields that differ from it (a narrow terminal keeps one line)."""
    alpha = (format_duration_rounded(s.alpha * per_token_s) if per_token_s
             else format_tokens(s.alpha))
    fields = [("alpha", s.alpha, f"alpha {alpha}"),
              ("beta", s.beta, f"beta {format_tokens(s.beta)}"),
              ("quota_s", s.quota_s, f"quota {format_duration(s.quota_s)}"),
              ("read_side", s.read_side, s.read_side), ("pd", s.pd, s.pd)]
    if today is not None:
        fields = [f for f in fields if getattr(today, f[0]) != f[1]] or [("", 0, "as today")]
    return ", ".join(text for _, _, text in fields)


def _predictions_table(title: str, current: Any, others: list[Any],
                       ranked_by: str = "jct", per_token_s: float | None = None) -> None:
    """Today's prediction and ``others`` (each by what it changes); ranked by the mean
    trajectory time (the twin's ``ranked_by``), its change has a column too."""
    by_traj = ranked_by == "mean_trajectory"
    table = Table("setting", "JCT", "change", "mean traj.",
                  *(("traj. change",) if by_traj else ()), "TTFT mean", "TTFT p90",
                  "SNIC Max/Avg", title=title, title_justify="left")
    for p in [current, *others]:
        change = "" if p is current else f"{(p.jct_s - current.jct_s) / current.jct_s:+.1%}"
        now = current.mean_trajectory_s
        traj = "" if p is current or not by_traj else _fmt(
            (p.mean_trajectory_s - now) / now if now > 0 else math.nan, "+.1%")
        table.add_row("today" if p is current
                      else _setting_text(p.setting, current.setting, per_token_s),
                      _fmt(p.jct_s, "duration"), change,
                      _fmt(p.mean_trajectory_s, "duration"), *((traj,) if by_traj else ()),
                      _fmt(p.ttft_mean_s, "duration"),
                      _fmt(p.ttft_p90_s, "duration"), _fmt(p.snic_max_avg, ".2f"))
    stdout.print(table)
    stdout.print(f"today: {_setting_text(current.setting, None, per_token_s)}",
                 highlight=False, soft_wrap=True)


@app.command("show")
def show(
    url: str | None = typer.Option(None, "--url", help="The cluster's API (default: "
                                   "DUALPATH_URL, else the running cluster's state file)."),
    last: int = typer.Option(5, "--last", help="Scheduler changes of the audit log to list."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Thresholds in force on the running cluster, their source, and the recent changes."""
    from dualpath_cli.services.tuning import scheduler_audit

    with _client(url) as client:
        st = client.status()
        target = getattr(client, "url", url or "")
    th = st.thresholds
    changes = scheduler_audit(st.audit)[-max(0, last):] if last else []
    controllers: dict[str, Any] = dict(getattr(th, "controllers", None) or {})
    values = {"alpha": th.alpha_tokens, "beta": th.beta_tokens, "quota": th.quota_s,
              "read_side": th.read_side, "z_factor": th.z_factor}
    alpha_s = getattr(th, "alpha_s", None)
    scheduling = dict(getattr(st, "scheduling", None) or {})
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


@app.command("rollback")
def rollback(
    url: str | None = typer.Option(None, "--url", help="The cluster's API (default: "
                                   "DUALPATH_URL, else the running cluster's state file)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Say what would be restored."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Apply without asking."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Undo the last scheduler change of the audit log (a second rollback redoes it)."""
    from dualpath_cli.cli import source
    from dualpath_cli.services.tuning import rollback_body

    target = source.resolve(url)
    if not dry_run:
        target.require_token("tune rollback")
    with _client(url) as client:
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


@app.command("auto")
def auto(
    duration: str = typer.Option("10m", "--for", help="How long to watch after turning the "
                                 "controllers on."),
    window: str = typer.Option("30s", "--window", help="Throughput window (also the "
                               "baseline measured first)."),
    interval: str = typer.Option("2s", "--interval", help="Time between looks."),
    max_drop: float = typer.Option(0.10, "--max-drop", help="Roll back when throughput over "
                                   "the window falls by more than this fraction."),
    url: str | None = typer.Option(None, "--url", help="The cluster's API (default: "
                                   "DUALPATH_URL, else the running cluster's state file)."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Start without asking."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object at the end."),
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
    target = source.resolve(url)
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
    with _client(url) as client:
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


@app.command("suggest")
def suggest(
    url: str | None = typer.Option(None, "--url", help="The cluster's API (default: "
                                   "DUALPATH_URL, else the running cluster's state file)."),
    from_file: Path | None = typer.Option(None, "--from", help="A recording (dualpath "
                                          "record) instead of the live cluster."),
    pd: str | None = typer.Option(None, "--pd", help="Also try other P/D splits (applied by "
                                  "relaunching): auto (those of the same node count in the "
                                  "bottleneck-free range) or a list, e.g. 4P8D,3P9D,6P6D."),
    hardware: str | None = typer.Option(None, "--hardware", help="Hardware profile for a "
                                        "cluster of a model profile (default: hopper)."),
    top: int = typer.Option(3, "--top", help="Best settings to print."),
    budget: str = typer.Option("50s", "--budget", help="Stop searching after about this "
                               "long (the rest is listed as skipped)."),
    window: str | None = typer.Option(None, "--window", help="Live cluster: replay only the "
                                      "turns decided in this last stretch, e.g. 10m (default: "
                                      "every decision the scheduler still keeps)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Replay the cluster's served turns in the simulator and suggest better settings.

    Searches alpha, beta, the compute quota and the read-side policy (with --pd also the
    P/D split) one at a time around today's, then the best of each together; prints the
    predicted JCT, TTFT and SNIC Max/Avg of the best few beside today's and the command
    that applies the best. A recording with finished requests' stories (dualpath record
    keeps them) first calibrates the simulator to itself: the engines' busy time, the
    turns' hand-off and the client's gap between turns; a note says what was fitted.
    Ranked by predicted JCT; when the recorded arrivals set the JCT (no setting moves it
    by more than 1%), by the mean trajectory time, and the output says which.
    """
    from dualpath_cli.services import twin
    from dualpath_cli.sim import twin_search

    if from_file is not None and url is not None:
        raise UsageError("--from and --url exclude each other")
    if top < 1:
        raise UsageError(f"--top {top}: must be at least 1")
    budget_s = parse_duration(budget)
    splits = _pd_choice(pd)
    window_s = parse_duration(window) if window is not None else None
    if window_s is not None and from_file is not None:
        raise UsageError("--window is for the live cluster: a recording replays its own "
                         "window (dualpath record --window)")
    if window_s is not None and window_s <= 0:
        raise UsageError(f"--window {window}: must be longer than 0 s")
    if from_file is not None:
        from dualpath_cli.services.recording import read_recording

        traffic = twin.traffic_from_recording(read_recording(from_file), str(from_file))
    else:
        with _client(url) as client:
            target = getattr(client, "url", url or "")
            view = client.view()
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
    world = twin.world_for(traffic, hardware=hardware)
    res = twin_search.suggest(traffic, world, pd=splits, budget_s=budget_s)
    if as_json:
        emit_json(res.to_dict(top))
        return
    best = [p for p in res.ranked if p is not res.current][:top]
    _predictions_table(f"tune suggest: {traffic.source} ({world.kind} world, "
                       f"{len(res.ranked)} settings in {res.wall_s:.1f} s; {res.ranking})",
                       res.current, best, res.ranked_by,
                       _alpha_per_token_s(traffic, world))
    for note in world.notes:
        stderr.print(f"note: {note}", highlight=False, soft_wrap=True)
    if res.skipped:
        stderr.print(f"note: {len(res.skipped)} settings skipped: " + "; ".join(res.skipped),
                     highlight=False, soft_wrap=True)
    measure = "JCT" if res.ranked_by == "jct" else "mean trajectory time"
    if res.best is res.current:
        stdout.print(f"keep today's settings: nothing predicted more than "
                     f"{twin_search.MIN_GAIN:.0%} better ({res.ranking})", highlight=False,
                     soft_wrap=True)
    else:
        jct = "" if res.ranked_by == "jct" else (
            f" ({res.change(res.best):+.1%} JCT: arrivals set it)")
        stdout.print(f"best: {res.gain(res.best):+.1%} {measure}{jct}; apply with: "
                     f"{res.best.setting.command(traffic.current)}", highlight=False,
                     soft_wrap=True)
