"""``dualpath bench``: the main job. Thin: parse, call runtime.bench, render."""

from __future__ import annotations

import os
from pathlib import Path

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from dualpath_cli.cli.output import emit_json, stderr, stdout
from dualpath_cli.config.model import parse_pd
from dualpath_cli.errors import UsageError
from dualpath_cli.runtime.bench import BenchReport, run_bench
from dualpath_cli.runtime.runner import TurnRecord
from dualpath_cli.runtime.scheduler import RUNTIME_POLICIES
from dualpath_cli.runtime.system import RuntimeOptions
from dualpath_cli.runtime.workloads import agentic_workload
from dualpath_cli.units import format_bytes, parse_bandwidth

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


def _render(report: BenchReport) -> None:
    s = report.setup
    table = Table(title=f"dualpath bench: {s['pd']}, {s['agents']} agents, {s['turns']} turns, "
                        f"model {s['model']}, storage NIC {format_bytes(s['snic_bw'])}/s")
    for col in ("policy", "JCT", "TTFT p50/p99", "TPOT p50/p99", "SNIC bytes per node",
                "SNIC Max/Avg", "GPU busy", "bubble", "tokens"):
        table.add_column(col)
    for p in report.policies:
        nodes = " ".join(f"{n}:{format_bytes(b)}" for n, b in sorted(p.snic_read_bytes.items()))
        table.add_row(p.policy, f"{p.jct_s:.2f} s",
                      f"{p.ttft_p50_s * 1e3:.0f}/{p.ttft_p99_s * 1e3:.0f} ms",
                      f"{p.tpot_p50_s * 1e3:.1f}/{p.tpot_p99_s * 1e3:.1f} ms", nodes,
                      "-" if p.snic_max_avg != p.snic_max_avg else f"{p.snic_max_avg:.2f}",
                      f"{p.gpu_busy:.0%}", f"{p.bubble_s:.3f} s",
                      "same" if p.tokens_match else "DIFFERENT")
    stdout.print(table)
    by = {p.policy: p.jct_s for p in report.policies}
    if "basic" in by and "dualpath" in by and by["dualpath"] > 0:
        stdout.print(f"JCT basic / dualpath = {by['basic'] / by['dualpath']:.2f}x")


def bench(
    policy: str = typer.Option("dualpath,basic", "--policy", help="Comma-separated policies."),
    agents: int = typer.Option(8, "--agents", min=1, help="Number of agents."),
    turns: int = typer.Option(4, "--turns", min=1, help="Rounds per agent (built-in workload)."),
    pd: str = typer.Option("1P2D", "--pd", help="Prefill/decode nodes, e.g. 1P2D or 2P4D."),
    trace: Path | None = typer.Option(None, "--trace", help="Replay this trace file instead."),
    store: Path | None = typer.Option(None, "--store", help="Store directory (default: "
                                      "$XDG_DATA_HOME/dualpath/store)."),
    snic: str = typer.Option("4MB/s", "--snic-bw", help="Storage-NIC bandwidth per node."),
    aps: float | None = typer.Option(None, "--aps", help="Online mode: agents per second."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Run the embedded 1P2D system on an agentic workload and compare policies."""
    names = _policies(policy)
    spec = parse_pd(pd)
    if trace is not None:
        from dualpath_cli.workload.trace_io import read_trace

        trajectories = list(read_trace(trace).trajectories)[:agents]
    else:
        trajectories = agentic_workload(agents, turns=turns)
    base = RuntimeOptions(prefill_nodes=spec.prefill_nodes, decode_nodes=spec.decode_nodes,
                          processes=True, snic_bw=parse_bandwidth(snic), block_tokens=16)
    total = sum(t.num_turns for t in trajectories) * len(names)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=stderr, transient=True,
                  disable=not stderr.is_terminal) as progress:
        task = progress.add_task("bench", total=total)

        def on_turn(name: str, rec: TurnRecord) -> None:
            progress.update(task, advance=1, description=f"{name}")

        report = run_bench(names, base, trajectories, store or default_store_root(),
                           aps=aps, on_turn=on_turn)
    if as_json:
        emit_json(report.to_dict())
    else:
        _render(report)
