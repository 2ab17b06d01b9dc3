"""``dualpath bench``: the main job. Thin: parse, call services.bench, render."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from dualpath_cli.cli.output import emit_json, stderr, stdout
from dualpath_cli.config.model import parse_pd
from dualpath_cli.errors import UsageError
from dualpath_cli.runtime.options import options_from_config
from dualpath_cli.runtime.scheduler import RUNTIME_POLICIES
from dualpath_cli.runtime.workloads import agentic_workload
from dualpath_cli.services.bench import SLO, BenchReport, load_bench_config, run_bench
from dualpath_cli.services.runner import TurnRecord
from dualpath_cli.units import format_bytes

__all__ = ["bench", "default_store_root"]


def default_store_root() -> Path:
    """``$XDG_DATA_HOME/dualpath/store`` (``~/.local/share/dualpath/store`` by default)."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "dualpath" / "store"


def _policies(text: str) -> list[str]:
    names = [p.strip() for p in text.split(",") if p.strip()]
    bad = [p for p in names if p not in RUNTIME_POLICIES]
    if bad or not names:
        raise UsageError(f"--policy: unknown policy {', '.join(bad) or '(none)'}; choose from "
                         f"{', '.join(RUNTIME_POLICIES)}")
    return names


def _ms(value: float) -> str:
    return "-" if value != value else f"{value * 1e3:.0f}"


def _render(report: BenchReport, online: bool) -> None:
    s = report.setup
    table = Table(title=f"dualpath bench: {s['pd']}, {s['agents']} agents, {s['turns']} turns, "
                        f"model {s['model']}, storage NIC {format_bytes(s['snic_bw'])}/s, "
                        f"{s['mode']}")
    cols = ["policy", "JCT", "TTFT p50/p99 ms", "TPOT p50/p99 ms"]
    if online:
        cols += ["TTST p50/p99 ms", "SLO"]
    cols += ["SNIC bytes per node", "SNIC Max/Avg", "GPU busy", "bubble", "tokens"]
    for col in cols:
        table.add_column(col)
    for p in report.policies:
        nodes = " ".join(f"{n}:{format_bytes(b)}" for n, b in sorted(p.snic_read_bytes.items()))
        row = [p.policy, f"{p.jct_s:.2f} s", f"{_ms(p.ttft_p50_s)}/{_ms(p.ttft_p99_s)}",
               f"{p.tpot_p50_s * 1e3:.1f}/{p.tpot_p99_s * 1e3:.1f}"]
        if online:
            row += [f"{_ms(p.ttst_p50_s)}/{_ms(p.ttst_p99_s)}", "met" if p.slo_met else "MISSED"]
        row += [nodes, "-" if p.snic_max_avg != p.snic_max_avg else f"{p.snic_max_avg:.2f}",
                f"{p.gpu_busy:.0%}", f"{p.bubble_s:.3f} s",
                "same" if p.tokens_match else "DIFFERENT"]
        table.add_row(*row)
    stdout.print(table)
    if online:
        slo = s["slo"]
        stdout.print(f"SLO (p99): TTFT <= {slo['ttft_s']:.2f} s, TPOT <= "
                     f"{slo['tpot_s'] * 1e3:.1f} ms (the paper's 4 s / 50 ms x {slo['scale']})")
    by = {p.policy: p.jct_s for p in report.policies}
    if "basic" in by and "dualpath" in by and by["dualpath"] > 0:
        stdout.print(f"JCT basic / dualpath = {by['basic'] / by['dualpath']:.2f}x")


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
                                               "$XDG_DATA_HOME/dualpath/store).")] = None,
    snic: Annotated[str | None, typer.Option("--snic-bw", help="Storage-NIC bandwidth per "
                                             "node (default: hardware.snic_bandwidth when set, "
                                             "else an I/O-bound 7MB/s).")] = None,
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
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Run the embedded 1P2D system on an agentic workload and compare policies."""
    names = _policies(policy)
    if trace is not None:
        from dualpath_cli.workload.trace_io import read_trace

        trajectories = list(read_trace(trace).trajectories)[:agents]
    else:
        trajectories = agentic_workload(agents, turns=turns)
    sets = list(overrides or [])
    if pd is not None:
        sets.append(f"cluster.pd={parse_pd(pd)}")
    loaded, _ = load_bench_config(trajectories, preset=preset, config_file=config, sets=sets,
                                  snic_bw=snic)
    base = options_from_config(loaded, processes=True)
    total = sum(t.num_turns for t in trajectories) * len(names)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=stderr, transient=True,
                  disable=not stderr.is_terminal) as progress:
        task = progress.add_task("bench", total=total)

        def on_turn(name: str, rec: TurnRecord) -> None:
            progress.update(task, advance=1, description=f"{name}")

        report = run_bench(names, base, trajectories, store or default_store_root(),
                           aps=aps, slo=SLO(scale=slo_scale), on_turn=on_turn)
    if as_json:
        emit_json(report.to_dict())
    else:
        _render(report, online=aps is not None)
