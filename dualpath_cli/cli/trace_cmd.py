"""`dualpath trace`: generate Table 2-calibrated agent traces and summarise trace files.

``gen`` draws a synthetic trace (workload/build.py) and writes it atomically; ``stats`` reads a
dualpath or Mooncake trace and prints its means. The format is in docs/trace-format.md.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from dualpath_cli.cli.options import JsonOption
from dualpath_cli.cli.output import emit_json, stderr, stdout
from dualpath_cli.cli.output_target import output_path, write_stdout_lines
from dualpath_cli.errors import UsageError
from dualpath_cli.units import format_tokens, parse_tokens

if TYPE_CHECKING:
    from rich.console import Console

    from dualpath_cli.workload.stats import TraceStats
    from dualpath_cli.workload.table2 import Table2Row
    from dualpath_cli.workload.trace_io import TraceFormat

# workload/ (numpy) is imported inside the commands so that ``dualpath --help`` stays fast.

__all__ = ["app"]

app = typer.Typer(help="Generate and inspect agent traces (Table 2 calibrated, or Mooncake).",
                  no_args_is_help=True)

_FORMATS: tuple[TraceFormat, ...] = ("dualpath", "mooncake")
#: workload.build.DEFAULT_BASE_AGENTS, kept here for the option default (a test checks).
DEFAULT_BASE_AGENTS = 500
_COLUMNS = ("turns", "append", "gen", "total", "context")


@app.command("gen")
def gen(
    output: Annotated[str, typer.Option("-o", "--output", help="Trace file to write (JSONL; "
                                        "'-' for stdout).")],
    max_len: Annotated[str, typer.Option(
        "--max-len", help="Cap on every trajectory's total tokens; 32K, 48K and 64K are the "
        "paper's Table 2 rows (K = 1000).")] = "64K",
    agents: Annotated[int, typer.Option("--agents", help="Number of agents (trajectories).")] = 500,
    seed: Annotated[int, typer.Option(
        "--seed", help="Random seed; equal seeds give equal traces.")] = 0,
    base_agents: Annotated[int, typer.Option(
        "--base-agents", help="Base trajectories; more agents replay them behind a synthetic "
        "first round (g = 1), as in the paper.")] = DEFAULT_BASE_AGENTS,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing file.")] = False,
    as_json: JsonOption = False,
) -> None:
    """Write a synthetic agent trace calibrated to the paper's Table 2."""
    from dualpath_cli.atomicio import write_target
    from dualpath_cli.limits import check, check_count
    from dualpath_cli.workload.build import synthetic_trace
    from dualpath_cli.workload.stats import trace_stats
    from dualpath_cli.workload.table2 import targets_for
    from dualpath_cli.workload.trace_format import encode_lines
    from dualpath_cli.workload.trace_io import write_trace

    path = output_path(output, as_json=as_json)
    if path is not None:
        try:  # before the trace is drawn: a bad target costs nothing
            written = write_target(path)
        except OSError as err:
            raise UsageError(f"{output}: cannot write: {err.strerror}") from None
        if written.exists() and not force:
            raise UsageError(f"{output}: already exists; use --force to overwrite")
    check_count("trace_agents", agents, "--agents")
    check_count("trace_agents", base_agents, "--base-agents")
    length = parse_tokens(max_len)
    check("tokens", length, "--max-len")
    if length < 1:
        raise UsageError(f"--max-len {max_len!r}: must be at least 1 token")
    trace = synthetic_trace(length, agents, seed, base_agents=base_agents)
    stats = trace_stats(trace.trajectories)
    if path is None:
        write_stdout_lines(encode_lines(trace))
    else:
        write_trace(path, trace)
    target = targets_for(length)
    if as_json:
        emit_json({"path": str(output), "format": "dualpath", "max_len": length,
                   "seed": seed, "augmented": trace.header.generator["augmented"],
                   "stats": stats.to_dict(), "targets": target.to_dict()})
        return
    stderr.print(f"wrote {'the trace to stdout' if path is None else output}", highlight=False)
    _render_dualpath(stats, length, target, title=f"{output}: {agents} agents, max_len "
                     f"{format_tokens(length)}, seed {seed}",
                     console=stderr if path is None else stdout)


@app.command("stats")
def stats(
    path: Annotated[Path, typer.Argument(help="Trace file (dualpath JSONL or Mooncake JSONL).")],
    fmt: Annotated[str | None, typer.Option(
        "--format", help="dualpath or mooncake (default: detected from the first line).")] = None,
    as_json: JsonOption = False,
) -> None:
    """Table 2 means of a dualpath trace, or request statistics of a Mooncake trace."""
    from dualpath_cli.workload.mooncake import mooncake_stats
    from dualpath_cli.workload.stats import trace_stats
    from dualpath_cli.workload.table2 import TABLE2
    from dualpath_cli.workload.trace_io import detect_format, read_mooncake, read_trace

    kind = _format(fmt) if fmt is not None else detect_format(path)
    if kind == "mooncake":
        from dualpath_cli.workload.mooncake_link import hit_split

        requests = read_mooncake(path)
        summary = mooncake_stats(requests)
        hit, cross = hit_split(requests)
        share = cross / hit if hit else 0.0
        if as_json:
            emit_json({"path": str(path), "format": kind, **summary.to_dict(),
                       "cross_conversation_hit_tokens": cross,
                       "cross_conversation_hit_share": share})
            return
        table = _table(f"{path}: Mooncake trace", with_target=False)
        table.add_row("requests", f"{summary.requests:,}")
        table.add_row("mean input length", f"{summary.mean_input_length:,.1f}")
        table.add_row("mean output length", f"{summary.mean_output_length:,.1f}")
        table.add_row("prefix-hit ratio (unbounded cache)", f"{summary.prefix_hit_ratio:.2%}")
        table.add_row("hits across conversations", f"{share:.2%}")
        table.add_row("unique 512-token blocks", f"{summary.unique_blocks:,}")
        table.add_row("duration", f"{summary.duration_s:,.1f} s")
        stdout.print(table)
        return
    trace = read_trace(path)
    if not trace.trajectories:
        raise UsageError(f"{path}: the trace has a header but no trajectories")
    result = trace_stats(trace.trajectories, trace.header.block_tokens,
                         trace.header.outputs_stored)
    max_len = trace.header.max_len
    if as_json:
        emit_json({"path": str(path), "format": kind, "max_len": max_len,
                   **result.to_dict()})
        return
    row = next((r for r in TABLE2 if r.max_len == max_len), None)
    _render_dualpath(result, max_len, row, title=f"{path}: max_len {format_tokens(max_len)}")


@app.command("convert")
def convert(
    path: Annotated[Path, typer.Argument(
        help="A Mooncake request log (JSONL) or a recording (dualpath record).")],
    output: Annotated[str, typer.Option("-o", "--output", help="dualpath trace to write "
                                        "('-' for stdout).")],
    as_json: JsonOption = False,
) -> None:
    """Turn a Mooncake request log or a recording into a dualpath trace.

    A Mooncake request continues the conversation whose last request's whole full-block
    prefix it starts with (shared leading hash ids) and whose input it extends; the rule
    and the counts are printed. A recording gives its served turns (every prompt and
    generated length, per agent) and each agent's first arrival (start_s), as the twin
    replays them. `sim` and `bench --trace` also take either file directly.
    """
    from dualpath_cli.services.recording_trace import is_recording

    if is_recording(path):
        _convert_recording(path, output, as_json)
        return
    from dualpath_cli.workload.mooncake_link import LINK_RULE, link_requests
    from dualpath_cli.workload.trace_format import encode_lines
    from dualpath_cli.workload.trace_io import detect_format, read_mooncake, write_trace

    target = output_path(output, as_json=as_json)
    if detect_format(path) != "mooncake":
        raise UsageError(f"{path}: not a Mooncake request log or a recording (a dualpath "
                         "trace needs no conversion)")
    trace, counts = link_requests(read_mooncake(path), path.name)
    if target is None:
        write_stdout_lines(encode_lines(trace))
    else:
        write_trace(target, trace)
    if as_json:
        emit_json({"path": str(path), "output": str(output), "from": "mooncake",
                   "rule": LINK_RULE, **counts.to_dict()})
        return
    say = stderr if target is None else stdout  # the data owns stdout with -o -
    say.print(f"{counts.requests:,} requests -> {counts.trajectories:,} trajectories "
                 f"({counts.linked:,} requests linked as later turns, "
                 f"{counts.single_turn:,} single-turn, longest {counts.max_turns} turns, "
                 f"max_len {counts.max_len:,}) -> {output}", highlight=False, soft_wrap=True)
    if counts.shared_prefix_trajectories:
        say.print(f"{counts.shared_prefix_trajectories:,} trajectories open with a prefix "
                     f"another one shares ({counts.shared_prefix_tokens:,} tokens in all)",
                     highlight=False, soft_wrap=True)
    stderr.print(f"rule: {LINK_RULE}", highlight=False, soft_wrap=True)
    if counts.clamped_appends or counts.zero_outputs:
        stderr.print(f"note: {counts.clamped_appends} turns appended less than the previous "
                     f"answer (counted as 1 token), {counts.zero_outputs} requests had "
                     "output_length 0 (counted as 1)", highlight=False, soft_wrap=True)


def _convert_recording(path: Path, output: str, as_json: bool) -> None:
    """``trace convert`` of a recording: its served turns with their arrivals."""
    from dualpath_cli.cli.output import warn
    from dualpath_cli.services.recording_trace import read_recording_trace
    from dualpath_cli.workload.trace_format import encode_lines
    from dualpath_cli.workload.trace_io import write_trace

    target = output_path(output, as_json=as_json)
    trace = read_recording_trace(path, on_cut=warn)
    if target is None:
        write_stdout_lines(encode_lines(trace))
    else:
        write_trace(target, trace)
    trajs = trace.trajectories
    counts = {"trajectories": len(trajs), "turns": sum(t.num_turns for t in trajs),
              "max_turns": max((t.num_turns for t in trajs), default=0),
              "max_len": trace.header.max_len,
              "with_arrivals": sum(t.start_s is not None for t in trajs),
              "last_arrival_s": max((t.start_s or 0.0 for t in trajs), default=0.0),
              "shared_prefix_trajectories": sum(bool(t.shared) for t in trajs)}
    if as_json:
        emit_json({"path": str(path), "output": str(output), "from": "recording",
                   "gen": trace.header.generator.get("gen"), **counts})
        return
    say = stderr if target is None else stdout  # the data owns stdout with -o -
    say.print(f"recording -> {counts['trajectories']:,} trajectories "
                 f"({counts['turns']:,} turns, longest {counts['max_turns']} turns, max_len "
                 f"{counts['max_len']:,}; arrivals over {counts['last_arrival_s']:.3g} s for "
                 f"{counts['with_arrivals']:,}) -> {output}", highlight=False, soft_wrap=True)
    if counts["shared_prefix_trajectories"]:
        say.print(f"{counts['shared_prefix_trajectories']:,} trajectories open with a "
                     "prefix another conversation shares", highlight=False, soft_wrap=True)
    stderr.print(f"generated lengths: {trace.header.generator.get('gen')}; not carried: "
                 "token ids, block hashes, the cluster's own hits, time between turns "
                 "(docs/trace-format.md)", highlight=False, soft_wrap=True)


def _format(value: str) -> TraceFormat:
    for kind in _FORMATS:
        if value.lower() == kind:
            return kind
    raise UsageError(f"invalid --format {value!r}: expected one of {', '.join(_FORMATS)}")


def _table(title: str, *, with_target: bool) -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column("metric", style="bold")
    table.add_column("value", justify="right")
    if with_target:
        table.add_column("Table 2", justify="right")
        table.add_column("diff", justify="right")
    return table


def _render_dualpath(result: TraceStats, max_len: int, target: Table2Row | None, *,
                     title: str, console: Console = stdout) -> None:
    from dualpath_cli.workload.table2 import TABLE2

    exact = target is not None and any(r.max_len == max_len for r in TABLE2)
    table = _table(title, with_target=target is not None)
    if target is not None and not exact:
        table.columns[2].header = "target (interp.)"
    values: dict[str, Any] = result.to_dict()
    table.add_row("agents", f"{result.agents:,}", *(["", ""] if target is not None else []))
    for key in _COLUMNS:
        cells = [f"{values[key]:,.1f}"]
        if target is not None:
            want = getattr(target, key)
            cells += [f"{want:,.0f}", f"{values[key] / want - 1:+.1%}"]
        table.add_row(key, *cells)
    extra = ["", ""] if target is not None else []
    table.add_row("max total", f"{result.max_total:,} (cap {max_len:,})", *extra)
    table.add_row("turn/size correlation", _number(result.turn_size_corr), *extra)
    table.add_row("dispersion Turns(A+G)/Total", f"{result.dispersion:.3f}", *extra)
    table.add_row("replay hit ratio", f"{result.hit_ratio:.2%}", *extra)
    table.add_row("hits across conversations", f"{result.cross_conversation_hit_share:.2%}",
                  *extra)
    console.print(table)


def _number(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:+.3f}"
