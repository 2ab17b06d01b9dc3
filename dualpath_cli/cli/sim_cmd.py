"""`dualpath sim`: what-if runs of the cluster simulator (offline JCT, online, capacity).

Thin front-end: parse, call :mod:`dualpath_cli.sim`, render. Register with
``app.add_typer(sim_cmd.app, name="sim")``.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich import box
from rich.table import Table

from dualpath_cli.cli.options import JsonOption
from dualpath_cli.cli.output import emit_json, stderr, stdout
from dualpath_cli.core.policies import BUILTIN_POLICIES
from dualpath_cli.errors import UsageError
from dualpath_cli.units import format_duration, format_tokens, parse_tokens

if TYPE_CHECKING:
    from dualpath_cli.sim import LatencyStats, SimResult, SimSetup, Workload

# The simulator (numpy) and its plots (matplotlib, plotext) are imported inside the commands
# so that ``dualpath --help`` does not load them (tests/test_cli_import_graph.py).

__all__ = ["app", "resolve_agents", "resolve_workload", "workload_keys", "workload_label"]

app = typer.Typer(help="Simulate a DualPath cluster in simulated time with the core scheduler.",
                  no_args_is_help=True)

#: The built-in policies (core's one table, ablation order first); plugins may add more.
SIM_POLICY_NAMES: tuple[str, ...] = tuple(BUILTIN_POLICIES)
#: What ``sim compare`` runs by default: the paper's ablation, split and the oracle.
COMPARE_DEFAULT: tuple[str, ...] = ("basic", "layerwise", "round-robin", "dualpath", "split",
                                    "oracle")

_Model = Annotated[str, typer.Option("--model", help="Model profile (ds660b, ds27b, qwen32b).")]
_Pd = Annotated[str, typer.Option("--pd", help="Prefill and decode nodes, e.g. 2P4D.")]
_Hardware = Annotated[str, typer.Option("--hardware", help="Hardware profile.")]
_MaxLen = Annotated[str | None, typer.Option(
    "--max-len", help="Max length of the synthetic workload (32K, 48K, 64K; default: 64K); a "
    "--trace has its own.")]
_Seed = Annotated[int, typer.Option(
    "--seed", help="Seed of the synthetic workload, and of the augmentation of a --trace.")]
_Trace = Annotated[Path | None, typer.Option(
    "--trace", help="Replay this dualpath trace file (docs/trace-format.md), Mooncake request "
    "log or recording (dualpath record) instead of the synthetic workload; more agents than "
    "it holds are made from it as the paper does (a synthetic first round).")]
_Horizon = Annotated[float, typer.Option(
    "--horizon", help="Online: longest run, seconds (the paper's rule may end it sooner: TTFT "
    "over the last 150 s above 4 s, or steady state).")]
_FullHorizon = Annotated[bool, typer.Option(
    "--full-horizon", help="Online: run the whole --horizon, past the paper's stop rule.")]
_Config = Annotated[Path | None, typer.Option(
    "--config", "-c", help="Config file whose scheduler keys apply (read_side as the default "
    "policy, layerwise_prefill, dynamic_alpha, dynamic_beta, dynamic_quota, random_seed), and "
    "cluster.nodes_per_group; flags win.")]
_Set = Annotated[list[str] | None, typer.Option(
    "--set", help="Override one config key, e.g. --set scheduler.dynamic_alpha=true.")]
_Dynamic = Annotated[str | None, typer.Option(
    "--dynamic", help="Dynamic controllers to run: comma-separated alpha, beta, quota, or "
    "'none' (default: the config's scheduler.dynamic_* keys).")]


def _knobs(config: Path | None, sets: list[str] | None, dynamic: str | None) -> Any:
    """The config's scheduler knobs (:class:`~dualpath_cli.sim.api.SimKnobs`), with
    ``--dynamic`` over its controller keys. Plugins' policies are registered first so the
    config and ``--policy`` may name them."""
    from dataclasses import replace

    from dualpath_cli.config import load_config
    from dualpath_cli.core.controllers import CONTROLLERS
    from dualpath_cli.plugins.manager import load_policies
    from dualpath_cli.sim.api import knobs_from_config

    load_policies()
    knobs = knobs_from_config(load_config(config_file=config, overrides=sets or ()).config)
    if dynamic is not None:
        names = [] if dynamic.strip() == "none" else [
            n.strip() for n in dynamic.split(",") if n.strip()]
        bad = [n for n in names if n not in CONTROLLERS]
        if bad or (not names and dynamic.strip() != "none"):
            raise UsageError(f"--dynamic: unknown controller {', '.join(bad) or '(none)'}; "
                             f"choose from {', '.join(CONTROLLERS)}, or none")
        knobs = replace(knobs, controllers=tuple(names))
    return knobs


def _setup(model: str, pd: str, policy: str | None, hardware: str, knobs: Any) -> SimSetup:
    """A simulator setup: ``--policy`` (else the config's ``scheduler.read_side``) and the
    config's knobs."""
    from dualpath_cli.sim import make_setup

    return make_setup(model, pd, policy or knobs.policy, hardware, seed=knobs.seed,
                      layerwise_prefill=knobs.layerwise_prefill,
                      controllers=knobs.controllers, hierarchical=knobs.hierarchical,
                      nodes_per_group=knobs.nodes_per_group,
                      sub_schedulers=knobs.sub_schedulers)


def resolve_agents(value: int | None, workload: Workload, default: int) -> int:
    """``--agents``, else every trajectory of a --trace, else ``default``."""
    if value is None:
        return workload.trace_agents or default
    if value < 1:
        raise UsageError(f"invalid --agents {value}: must be at least 1")
    return value


def resolve_workload(trace: Path | None, max_len: str | None, seed: int,
                     default_max_len: str = "64K") -> Workload:
    """The synthetic workload at ``--max-len``, or the ``--trace`` file (read and checked):
    a dualpath trace, a Mooncake request log or a recording (told apart by content)."""
    from dualpath_cli.sim import Workload

    if trace is None:
        return Workload(parse_tokens(max_len or default_max_len), seed)
    if max_len is not None:
        raise UsageError("--max-len sets the synthetic workload's length; a --trace has its "
                         "own (drop one of them)")
    from dualpath_cli.services.recording_trace import is_recording, read_recording_trace

    if is_recording(trace):
        from dualpath_cli.cli.output import warn

        return Workload.from_trace(read_recording_trace(trace, on_cut=warn), str(trace), seed)
    return Workload.from_file(trace, seed)


def workload_label(workload: Workload) -> str:
    """How titles name the workload: ``64K`` or ``FILE (64K)``."""
    size = format_tokens(workload.max_len)
    return size if workload.trace is None else f"{Path(workload.source).name} ({size})"


def workload_keys(workload: Workload) -> dict[str, object]:
    """The workload's keys in JSON output."""
    return {"workload": workload.source, "max_len": workload.max_len}


def _row(r: SimResult) -> list[str]:
    """A result under :func:`_head`: offline shows the JCT (the last trajectory's end) and
    the mean trajectory time, online only the mean (its ``jct``). Wall time is in --json."""
    times = ([format_duration(r.jct), format_duration(r.extra["mean_trajectory_s"])]
             if r.mode == "offline" else [format_duration(r.jct)])
    balance = "-" if math.isnan(r.snic_max_avg) else f"{r.snic_max_avg:.2f}"  # no reads
    return [r.policy, str(r.turns), *times, balance, f"{r.snic_util:.0%}", f"{r.pe_util:.0%}"]


def _head(online: bool) -> list[str]:
    """Columns of :func:`_row`; model, P/D, workload and agents are in the title."""
    times = ["mean traj"] if online else ["JCT", "mean traj"]
    return ["policy", "turns", *times, "SNIC max/avg", "SNIC util", "PE busy"]


def _print_fitted(table: Table) -> None:
    """Print ``table`` so a narrow terminal (80 columns without a TTY) wraps headers rather
    than cutting values: every column is at least as wide as its widest cell, and the
    columns are not ruled apart."""
    table.box, table.show_edge = box.SIMPLE_HEAD, False
    for col in table.columns:
        col.min_width = max((len(str(cell)) for cell in col.cells), default=0)
    stdout.print(table)


@app.command("run")
def run(
    model: _Model = "ds660b", pd: _Pd = "2P4D", hardware: _Hardware = "hopper",
    max_len: _MaxLen = None, trace: _Trace = None,
    agents: Annotated[int | None, typer.Option(
        "--agents", help="Agents, all starting at t=0 (offline; a --trace with arrivals, such "
        "as a recording, starts each at its own) (default: 2048, or every trajectory of a "
        "--trace).")] = None,
    policy: Annotated[str | None, typer.Option(
        "--policy", help=f"One of: {', '.join(SIM_POLICY_NAMES)}, or a plugin's (default: the "
        "config's scheduler.read_side, dualpath).")] = None,
    aps: Annotated[float | None, typer.Option(
        "--aps", help="Online mode: agents per second.")] = None,
    horizon: _Horizon = 1800.0, full_horizon: _FullHorizon = False,
    plot: Annotated[Path | None, typer.Option(
        "--plot", help="Also write a PNG chart of each node's storage-NIC read rate over time "
        "(GB/s per time bin; PE nodes solid, DE nodes dashed) to this .png file.")] = None,
    plot_terminal: Annotated[bool, typer.Option(
        "--plot-terminal", help="Also draw that chart as text (on stderr with --json; above 16 "
        "nodes, each role's max and mean).")] = False,
    series: Annotated[bool, typer.Option(
        "--series", help="With --json: add snic_series, the bytes each node's storage NIC read "
        "per time bin (large for big clusters).")] = False,
    seed: _Seed = 1, json_out: JsonOption = False, config: _Config = None,
    overrides: _Set = None, dynamic: _Dynamic = None,
) -> None:
    """Run one simulation (offline JCT, or online with --aps).

    --plot and --plot-terminal chart each node's storage-NIC reads over
    time, where the balance of the read paths shows. --json --series adds
    snic_series: bin_s, end_s, line_rate_bytes_per_s, nodes (P0.. prefill,
    D0.. decode) and read_bytes (per node, the bytes read in each bin).
    """
    if series and not json_out:
        raise UsageError("--series adds the per-node series to the JSON output; "
                         "pass --json too")
    from dualpath_cli.cli.sim_progress import sim_progress
    from dualpath_cli.sim import online_agents, simulate_offline, simulate_online
    from dualpath_cli.sim.plots import check_png_path, render_series_terminal, write_series_png

    setup = _setup(model, pd, policy, hardware, _knobs(config, overrides, dynamic))
    policy = setup.policy.name
    if plot is not None:
        check_png_path(plot)
    wl = resolve_workload(trace, max_len, seed)
    with sim_progress("sim run", as_json=json_out) as progress:
        if aps is None:
            res = simulate_offline(setup, wl.plans(resolve_agents(agents, wl, 2048)),
                                   progress=progress)
        else:
            res = simulate_online(setup, aps, horizon=horizon, early_stop=not full_horizon,
                                  plans=wl.plans(online_agents(aps, horizon)),
                                  progress=progress)
    title = f"{model} {pd} {workload_label(wl)} {policy} ({res.mode})"
    if json_out:
        emit_json({**res.to_dict(series=series), **workload_keys(wl)})
    else:
        table = Table(*_head(res.mode == "online"), title=f"{model} {pd} "
                      f"{workload_label(wl)}, {res.agents} agents ({res.mode})")
        table.add_row(*_row(res))
        _print_fitted(table)
        if wl.trace is not None:  # a global KV store's view: hits across conversations
            stdout.print(f"prefix hits {res.hit_tokens:,} of {res.prompt_tokens:,} prompt "
                         f"tokens ({res.hit_ratio:.1%}); {res.shared_hit_tokens:,} across "
                         f"conversations ({res.cross_conversation_hit_share:.1%} of hits)",
                         highlight=False)
        if res.mode == "online":
            stdout.print(f"TTFT mean {_mean(res.ttft, 1.0, 's', 3)}  TTST mean "
                         f"{_mean(res.ttst, 1.0, 's', 3)}  TPOT mean "
                         f"{_mean(res.tpot, 1e3, 'ms', 1)}", highlight=False)
            _print_online_end([res])
    _charts(plot, plot_terminal, json_out, lambda path: write_series_png(res, path, title),
            lambda width, color: render_series_terminal(res, title, width, color))


@app.command("compare")
def compare(
    model: _Model = "ds660b", pd: _Pd = "2P4D", hardware: _Hardware = "hopper",
    max_len: _MaxLen = None, trace: _Trace = None,
    agents: Annotated[int | None, typer.Option(
        "--agents", help="Agents starting at t=0 (default: 1024, or every trajectory of a "
        "--trace).")] = None,
    policies: Annotated[str, typer.Option(
        "--policies", show_default=False,
        help=f"Comma-separated policies (default: {', '.join(COMPARE_DEFAULT)}).")] = ",".join(
        COMPARE_DEFAULT),
    aps: Annotated[float | None, typer.Option(
        "--aps", help="Online mode: agents per second (compares TTFT and TPOT).")] = None,
    horizon: _Horizon = 1800.0, full_horizon: _FullHorizon = False,
    plot: Annotated[Path | None, typer.Option(
        "--plot", help="Also write a PNG chart (JCT per policy; online: TTFT, TPOT) to this .png "
        "file.")] = None,
    plot_terminal: Annotated[bool, typer.Option(
        "--plot-terminal", help="Also draw the chart as text (on stderr with --json).")] = False,
    seed: _Seed = 1, json_out: JsonOption = False, config: _Config = None,
    overrides: _Set = None, dynamic: _Dynamic = None,
) -> None:
    """Run several policies on the same workload and compare JCT (online: TTFT, TPOT)."""
    from dualpath_cli.cli.sim_progress import sim_progress
    from dualpath_cli.sim import online_agents, relabelled, simulate_offline, simulate_online
    from dualpath_cli.sim.plots import check_png_path, render_compare_terminal, write_compare_png

    names = [p.strip() for p in policies.split(",") if p.strip()]
    if not names:
        raise UsageError("--policies is empty")
    knobs = _knobs(config, overrides, dynamic)
    setups = [_setup(model, pd, name, hardware, knobs) for name in names]  # validate all first
    if plot is not None:
        check_png_path(plot)
    wl = resolve_workload(trace, max_len, seed)
    n = resolve_agents(agents, wl, 1024) if aps is None else online_agents(aps, horizon)
    plans = wl.plans(n)  # every policy replays the same agents
    results = []
    with sim_progress("sim compare", as_json=json_out) as progress:
        for i, setup in enumerate(setups):
            report = None if progress is None else relabelled(
                progress, i, len(setups), setup.policy.name)
            if not json_out and progress is None:
                stderr.print(f"simulating {setup.policy.name} ...", highlight=False)
            if aps is None:
                results.append(simulate_offline(setup, plans, progress=report))
            else:
                results.append(simulate_online(setup, aps, horizon=horizon, plans=plans,
                                               early_stop=not full_horizon, progress=report))
    title = (f"{model} {pd} {workload_label(wl)}, {n} agents" if aps is None
             else f"{model} {pd} {workload_label(wl)}, {aps:g} agents/s for {horizon:g}s")
    head: dict[str, object] = {"model": model, "pd": pd, "agents": n, **workload_keys(wl)}
    if aps is not None:  # online: agents arrive at --aps; --agents does not apply
        head = {"model": model, "pd": pd, **workload_keys(wl), "aps": aps, "horizon_s": horizon}
    _output_compare(results, title, json_out, head, online=aps is not None)
    _charts(plot, plot_terminal, json_out, lambda path: write_compare_png(results, path, title),
            lambda width, color: render_compare_terminal(results, title, width, color))


def _output_compare(results: list[SimResult], title: str, json_out: bool,
                    head: dict[str, object], online: bool) -> None:
    base = next((r.jct for r in results if r.policy == "basic"), None)
    if json_out:
        emit_json({**head, "results": [r.to_dict() for r in results],
                   "speedup_vs_basic": {r.policy: base / r.jct for r in results}
                   if base else None})
        return
    if not online:
        table = Table(*_head(False), "vs basic", title=title)
        for r in results:
            table.add_row(*_row(r), f"{base / r.jct:.2f}x" if base else "-")
    else:
        table = Table(*_head(True), "TTFT mean", "TPOT mean", title=f"{title} (online)")
        for r in results:
            table.add_row(*_row(r), _mean(r.ttft, 1.0, "s", 3), _mean(r.tpot, 1e3, "ms", 1))
    _print_fitted(table)
    if online:
        _print_online_end(results)


_ENDS = {"ttft": "stopped at {t}: mean TTFT over the last 150 s above 4 s",
         "steady": "stopped at {t}: steady state (TTFT of the last 150 s within 5% of "
                   "30 minutes before)",
         "horizon": "ran the whole horizon ({t})"}


def _print_online_end(results: list[SimResult]) -> None:
    """How each online run ended and whether it met the SLO (TTFT <= 4 s, TPOT <= 50 ms)."""
    for r in results:
        verdict = "SLO met" if r.slo_ok else "SLO missed"
        end = _ENDS.get(r.stop_reason or "", "ended at {t}").format(
            t=format_duration(r.sim_time))
        stdout.print(f"{r.policy}: {verdict}; {end}", highlight=False)


def _mean(stats: LatencyStats | None, scale: float, unit: str, digits: int) -> str:
    """A latency mean for a table cell; ``-`` where no turn was measured."""
    if stats is None or math.isnan(stats.mean):
        return "-"
    return f"{stats.mean * scale:.{digits}f}{unit}"


def _charts(png: Path | None, terminal: bool, json_out: bool, write_png: Callable[[Path], int],
            render_text: Callable[[int, bool], str]) -> None:
    """Write the PNG and/or the text chart; the text chart avoids stdout under --json."""
    if png is not None:
        size = write_png(png)
        if not json_out:
            stderr.print(f"wrote {png} ({size:,} bytes)", highlight=False, soft_wrap=True)
    if terminal:
        console = stderr if json_out else stdout
        text = render_text(console.width, console.is_terminal and not console.no_color)
        (sys.stderr if json_out else sys.stdout).write(text)


@app.command("capacity")
def capacity(
    model: _Model = "ds660b", pd: _Pd = "2P4D", hardware: _Hardware = "hopper",
    max_len: _MaxLen = None, trace: _Trace = None,
    policy: Annotated[str | None, typer.Option(
        "--policy", help="Policy to size (default: the config's scheduler.read_side, "
        "dualpath).")] = None,
    lo: Annotated[float, typer.Option("--lo", help="Lowest APS to probe.")] = 0.05,
    hi: Annotated[float, typer.Option("--hi", help="Highest APS to probe.")] = 2.0,
    horizon: Annotated[float, typer.Option(
        "--horizon", help="Seconds simulated per probe.")] = 2400.0,
    steps: Annotated[int, typer.Option("--steps", help="Bisection steps.")] = 6,
    seed: _Seed = 1, json_out: JsonOption = False, config: _Config = None,
    overrides: _Set = None, dynamic: _Dynamic = None,
) -> None:
    """Highest agents/s meeting TTFT <= 4 s and TPOT <= 50 ms (bisection)."""
    from dualpath_cli.cli.sim_progress import sim_progress
    from dualpath_cli.sim import online_agents, simulate_capacity
    from dualpath_cli.sim.online import check_aps_range

    setup = _setup(model, pd, policy, hardware, _knobs(config, overrides, dynamic))
    policy = setup.policy.name
    wl = resolve_workload(trace, max_len, seed)
    check_aps_range(lo, hi)
    from dualpath_cli.limits import check_count, check_finite

    check_count("steps", steps, "--steps", least=0)  # each step is one whole simulation
    check_finite(horizon, "--horizon", positive=True)
    plans = wl.plans(online_agents(hi, horizon))
    with sim_progress("sim capacity", as_json=json_out) as progress:
        res = simulate_capacity(setup, lo=lo, hi=hi, horizon=horizon, steps=steps,
                                plans=plans, progress=progress)
    if json_out:
        emit_json({"model": model, "pd": pd, "policy": policy, **workload_keys(wl),
                   **res.to_dict()})
        return
    table = Table("APS", "SLO met", "TTFT mean", "TPOT mean",
                  title=f"{model} {pd} {workload_label(wl)} {policy}: capacity {res.aps:.3g} APS")
    for a, ok, f, p in sorted(res.probes):
        table.add_row(f"{a:.3g}", "yes" if ok else "no", f"{f:.3f}s", f"{p * 1000:.1f}ms")
    stdout.print(table)
