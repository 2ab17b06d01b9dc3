"""``dualpath bench``: the main job. Thin: parse, call services.bench, render."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from dualpath_cli.cli.options import JsonOption, TokenFileOption, port_option, url_option
from dualpath_cli.cli.output import emit_json, stderr, stdout
from dualpath_cli.errors import UsageError
from dualpath_cli.units import format_bytes

if TYPE_CHECKING:
    from dualpath_cli.services.bench import BenchReport
    from dualpath_cli.services.runner import TurnRecord

# The runtime, services and rich.progress are imported inside the functions that use them,
# so that ``dualpath --help`` does not load numpy (tests/test_cli_import_graph.py).

__all__ = ["bench", "default_store_root", "store_root", "render_bench"]


def default_store_root() -> Path:
    """``$XDG_DATA_HOME/dualpath/store`` (``~/.local/share/dualpath/store`` by default)."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "dualpath" / "store"


def store_root(loaded: Any) -> Path:
    """Where ``bench`` and ``launch`` keep blocks without ``--store``: the config's
    ``storage.root`` when something set it, else :func:`default_store_root`."""
    root = Path(loaded.config.storage.root_path)
    return root if loaded.source("storage.root").kind != "default" else default_store_root()


def _policies(text: str) -> list[str]:
    """The --policy names, each a row of core's policy table (plugins' rows included;
    a deprecated alias becomes its policy's name)."""
    from dualpath_cli.core.policies import ALIASES, POLICIES
    from dualpath_cli.plugins.manager import load_policies

    names = [p.strip() for p in text.split(",") if p.strip()]
    load_policies()  # a plugin's policy is selectable too (and scheduler.read_side may name it)
    bad = [p for p in names if p not in POLICIES and p not in ALIASES]
    if bad or not names:
        raise UsageError(f"--policy: unknown policy {', '.join(bad) or '(none)'}; choose from "
                         f"{', '.join(POLICIES)}")
    return [ALIASES.get(p, p) for p in names]


def _ms(value: float) -> str:
    return "-" if value != value else f"{value * 1e3:.0f}"


def _ratio(value: float) -> str:
    return "-" if value != value else f"{value:.2f}"


def render_bench(report: BenchReport, console: Console, online: bool) -> None:
    """Print ``report`` for people: a setup paragraph, then two tables that fit 80 columns.

    Why two tables: one row per policy with every measurement needs about 150 columns, and
    squeezed into 80 rich folds every cell into unreadable stubs. The first table has the
    job and latency numbers, the second where the bytes went and how busy the engines were.
    """
    s = report.setup
    console.print(f"dualpath bench: {s['pd']}, {s['agents']} agents, {s['turns']} turns, "
                  f"model {s['model']}, {s['mode']}", highlight=False)
    rate = f"{format_bytes(s['snic_bw'], binary=False)}/s"
    cal = s.get("snic_calibration")
    if cal:
        console.print(f"storage NIC {rate} per node, calibrated to this machine (--snic-bw "
                      "fixes it):", highlight=False)
        how = "oracle run" if cal.get("source") == "oracle" else "probe"
        console.print(f"  {cal['flops_rate'] / 1e9:.2f} GFLOP/s ({how}): prefill "
                      f"{cal['compute_s']:.1f} s; Basic reads {cal['basic_storage_s']:.1f} s "
                      f"= {cal['multiple']:g}x", highlight=False)
    else:
        console.print(f"storage NIC {rate} per node (from the configuration)",
                      highlight=False)
    lat = Table(title="Job and latency (p50/p99, ms)", title_justify="left")
    cols = ["policy", "JCT s", "TTFT", "TPOT"] + (["TTST", "SLO"] if online else [])
    for col in cols:
        lat.add_column(col, justify="left" if col in ("policy", "SLO") else "right")
    for p in report.policies:
        row = [p.policy, f"{p.jct_s:.2f}", f"{_ms(p.ttft_p50_s)}/{_ms(p.ttft_p99_s)}",
               f"{p.tpot_p50_s * 1e3:.1f}/{p.tpot_p99_s * 1e3:.1f}"]
        if online:
            row += [f"{_ms(p.ttst_p50_s)}/{_ms(p.ttst_p99_s)}", "met" if p.slo_met else "MISSED"]
        lat.add_row(*row)
    console.print(lat)
    io = Table(title="Storage-NIC reads and compute", title_justify="left")
    for col in ("policy", "MB read by node", "Max/Avg", "GPU busy", "bubble s",
                "tokens"):
        io.add_column(col, justify="left" if col in ("policy", "tokens") else "right")
    for p in report.policies:
        nodes = " ".join(f"{b / 1e6:.1f}" for _, b in sorted(p.snic_read_bytes.items()))
        io.add_row(p.policy, nodes, _ratio(p.snic_max_avg), f"{p.gpu_busy:.0%}",
                   f"{p.bubble_s:.3f}", "same" if p.tokens_match else "DIFFERENT")
    console.print(io)
    for p in report.policies:  # faults: visible, not just survived
        dead, retried, quarantined = p.dead_engines, p.retried_turns, p.quarantined_blocks
        if dead or retried or quarantined:
            where = f" (kept in {p.quarantine_dir})" if quarantined else ""
            console.print(f"faults in {p.policy}: engines died: "
                          f"{', '.join(map(str, dead)) or 'none'}; {retried} turns retried; "
                          f"{quarantined} corrupt blocks quarantined{where}", highlight=False)
    if online:
        slo = s["slo"]
        console.print(f"SLO (p99): TTFT <= {slo['ttft_s']:.2f} s, TPOT <= "
                      f"{slo['tpot_s'] * 1e3:.1f} ms (the paper's 4 s / 50 ms x {slo['scale']})",
                      highlight=False)
    by = {p.policy: p.jct_s for p in report.policies}
    ratios = [f"{a} / {b} = {by[a] / by[b]:.2f}x" for a, b in (("basic", "dualpath"),
                                                                 ("dualpath", "oracle"))
              if a in by and b in by and by[b] > 0]
    if ratios:
        console.print("JCT " + "; ".join(ratios), highlight=False)
    other = [p.foreign_cores for p in report.policies if p.foreign_cores is not None]
    if other:
        console.print(f"other processes kept up to {max(other):.2f} cores busy during the "
                      "runs", highlight=False)


def _print_trace_hits(report: BenchReport, trajectories: Any, block_tokens: int) -> None:
    """The runtime's prefix hits (its scheduler's store lookups) next to what one global
    store of the trace's blocks holds (workload.prefix_store, as ``trace stats``)."""
    from dualpath_cli.workload.stats import trace_stats

    expected = trace_stats(trajectories, block_tokens)
    stdout.print("prefix hits (share of prompt tokens found in the store): " + ", ".join(
        f"{p.policy} {p.hit_ratio:.1%}" for p in report.policies)
        + f"; the trace's global store {expected.hit_ratio:.1%}", highlight=False)
    stdout.print("hits across conversations: " + ", ".join(
        f"{p.policy} {p.cross_conversation_hit_share:.1%}" for p in report.policies)
        + f"; the trace's global store {expected.cross_conversation_hit_share:.1%}",
        highlight=False)


def _render(report: BenchReport, online: bool) -> None:
    render_bench(report, stdout, online)


def bench(
    policy: Annotated[str, typer.Option("--policy", help="Comma-separated policies.")] = (
        "dualpath,basic"),
    agents: Annotated[int, typer.Option("--agents", min=1, help="Number of agents.")] = 16,
    turns: Annotated[int, typer.Option("--turns", min=1, help="Rounds per agent (built-in "
                                       "workload).")] = 12,
    pd: Annotated[str | None, typer.Option("--pd", help="Prefill/decode nodes, e.g. 1P2D or "
                                           "2P4D (default: cluster.pd).")] = None,
    trace: Annotated[Path | None, typer.Option("--trace", help="Replay this trace file "
                                               "instead.")] = None,
    store: Annotated[Path | None, typer.Option("--store", help="Store directory (default: "
                                               "dualpath/store under $XDG_DATA_HOME).")] = None,
    snic: Annotated[str | None, typer.Option("--snic-bw", help="Storage-NIC bandwidth per "
                                             "node (default: hardware.snic_bandwidth when set, "
                                             "else calibrated so that Basic's reads take 2.5x "
                                             "the measured compute).")] = None,
    aps: Annotated[float | None, typer.Option("--aps", min=0.001, help="Online mode: agents "
                                              "per second (Poisson arrivals).")] = None,
    slo_scale: Annotated[float, typer.Option("--slo-scale", min=0.0001, help="Scale of the "
                                             "SLO TTFT <= 4 s, TPOT <= 50 ms for this small "
                                             "model.")] = 0.25,
    preset: Annotated[str | None, typer.Option("--preset", help="Config preset to start "
                                               "from.")] = None,
    config: Annotated[Path | None, typer.Option("--config", "-c", help="Config file.")] = None,
    overrides: Annotated[list[str] | None, typer.Option(
        "--set", help="Override one config key, e.g. --set storage.block_size=32.")] = None,
    as_json: JsonOption = False,
    calibrate: Annotated[str, typer.Option("--calibrate", help="How the storage NICs are "
                                           "sized when no rate is set: 'oracle' runs the "
                                           "compute-only oracle first and uses its rate "
                                           "(offline: it becomes the oracle row); 'probe' "
                                           "times one engine's prefill.")] = "oracle",
    url: Annotated[str | None, url_option("Drive the cluster launched at this "
                                            "URL (dualpath launch) through its API instead; "
                                            "--policy is the cluster's own.")] = None,
    port: Annotated[int | None, port_option("Drive the cluster launched on this host on "
                                            "this port, as --url does.")] = None,
    token_file: TokenFileOption = None,
) -> None:
    """Run the embedded 1P2D system on an agentic workload and compare policies."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from dualpath_cli.config.model import parse_pd
    from dualpath_cli.runtime.gctune import pace_gc_for_scheduler
    from dualpath_cli.runtime.options import options_from_config
    from dualpath_cli.runtime.workloads import agentic_workload
    from dualpath_cli.services.bench import (
        SLO,
        calibrate_by_oracle,
        check_bench_inputs,
        load_bench_config,
        run_bench,
    )

    names = _policies(policy)
    pace_gc_for_scheduler()  # the embedded runs host their schedulers in this process
    check_bench_inputs(agents=agents, turns=turns, aps=aps, slo_scale=slo_scale, store=store,
                       snic_bw=snic)
    if calibrate not in ("oracle", "probe"):
        raise UsageError(f"--calibrate: expected oracle or probe, got {calibrate!r}")
    if token_file is not None and url is None and port is None:
        raise UsageError("--token-file is for a launched cluster (--url or --port); the "
                         "in-process bench needs no token")
    block_tokens = 512  # tokens one id of a trace's block chains covers (its header's)
    if trace is not None:
        from dualpath_cli.workload.mooncake_link import read_agent_trace

        replayed = read_agent_trace(trace)[0]
        trajectories = list(replayed.trajectories)[:agents]
        block_tokens = replayed.header.block_tokens
    else:
        trajectories = agentic_workload(agents, turns=turns)
    if url is not None or port is not None:
        from dualpath_cli.cli.bench_remote import bench_url
        from dualpath_cli.cli.source import ClusterRef

        given = {"--pd": pd, "--store": store, "--snic-bw": snic, "--preset": preset,
                 "--config": config, "--set": overrides}
        bench_url(ClusterRef(url, port, token_file), trajectories, aps=aps,
                  slo_scale=slo_scale, as_json=as_json,
                  refused=[k for k, v in given.items() if v], block_tokens=block_tokens)
        return
    sets = list(overrides or [])
    if pd is not None:
        sets.append(f"cluster.pd={parse_pd(pd)}")
    loaded, _, calibration = load_bench_config(trajectories, preset=preset,
                                               config_file=config, sets=sets, snic_bw=snic)
    base = options_from_config(loaded, processes=True)
    root = store or store_root(loaded)
    done: dict[str, Any] = {}
    if calibration is not None and calibrate == "oracle":
        stderr.print("calibrating: the oracle (compute only) runs first", highlight=False)
        loaded, _, calibration, oracle = calibrate_by_oracle(
            trajectories, base, root, preset=preset, config_file=config, sets=sets,
            block_tokens=block_tokens)
        base = options_from_config(loaded, processes=True)
        if aps is None:  # offline: the calibration run is the oracle row
            done["oracle"] = oracle
            names = ["oracle", *[n for n in names if n != "oracle"]]
    if calibration is not None:
        stderr.print(f"compute {calibration.flops_rate / 1e9:.2f} GFLOP/s: storage NIC set to "
                     f"{format_bytes(calibration.snic_bw, binary=False)}/s per node, Basic's "
                     f"reads = {calibration.multiple:g} x the prefill compute "
                     f"({calibration.compute_s:.1f} s)", highlight=False)
    total = sum(t.num_turns for t in trajectories) * len([n for n in names if n not in done])
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=stderr, transient=True,
                  disable=not stderr.is_terminal) as progress:
        task = progress.add_task("bench", total=total)

        def on_turn(name: str, rec: TurnRecord) -> None:
            progress.update(task, advance=1, description=f"{name}")

        report = run_bench(names, base, trajectories, root,
                           aps=aps, slo=SLO(scale=slo_scale), on_turn=on_turn,
                           calibration=calibration, done=done, block_tokens=block_tokens)
    if as_json:
        emit_json(report.to_dict())
    else:
        _render(report, online=aps is not None)
        if trace is not None:  # a global KV store's view of the trace's prefix hits
            _print_trace_hits(report, trajectories, block_tokens)
    failed = [f"{p.policy}: {p.errors[-1]}" for p in report.policies if p.errors]
    if failed:  # results above are partial: say so in the exit code and one line
        from dualpath_cli.errors import DualPathError

        more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
        raise DualPathError(f"bench incomplete: {failed[0]}{more}")
