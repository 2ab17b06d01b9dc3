"""``dualpath bench --url`` (or ``--port``): the main job against a launched cluster, through
its API.

Thin: find the cluster and its token (cli/source.py, as every live command does), call
:func:`~dualpath_cli.services.remote_runner.run_bench_remote`, render the in-process bench's
table (the columns that apply over HTTP) or its JSON.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from dualpath_cli.cli.output import emit_json, stderr, stdout
from dualpath_cli.errors import DualPathError, UsageError
from dualpath_cli.services.bench import SLO, BenchReport
from dualpath_cli.services.runner import TurnRecord
from dualpath_cli.units import format_bytes
from dualpath_cli.workload.trajectory import Trajectory

if TYPE_CHECKING:
    from dualpath_cli.cli.source import ClusterRef

__all__ = ["bench_url"]


def _ms(value: float) -> str:
    return "n/a" if value != value else f"{value * 1e3:.0f}"


def _render(report: BenchReport, online: bool) -> None:
    s = report.setup
    table = Table(title=f"dualpath bench --url {s['url']}: {s['pd']}, {s['agents']} agents, "
                        f"{s['turns']} turns, model {s['model']}, {s['mode']}")
    cols = ["policy", "JCT", "TTFT p50/p99 ms", "TPOT p50/p99 ms"]
    cols += (["SLO"] if online else []) + ["cached tokens", "SNIC bytes per node",
                                           "SNIC Max/Avg", "errors"]
    for col in cols:
        table.add_column(col)
    for p in report.policies:
        nodes = " ".join(f"{n}:{format_bytes(b)}" for n, b in sorted(p.snic_read_bytes.items()))
        row = [p.policy, f"{p.jct_s:.2f} s", f"{_ms(p.ttft_p50_s)}/{_ms(p.ttft_p99_s)}",
               f"{p.tpot_p50_s * 1e3:.1f}/{p.tpot_p99_s * 1e3:.1f}"]
        row += (["met" if p.slo_met else "MISSED"] if online else [])
        row += [f"{p.cached_tokens:,} of {s['prompt_tokens']:,}", nodes or "n/a",
                "n/a" if p.snic_max_avg != p.snic_max_avg else f"{p.snic_max_avg:.2f}",
                str(len(p.errors))]
        table.add_row(*row)
    stdout.print(table)
    for p in report.policies:
        for err in p.errors[:5]:
            stderr.print(f"[yellow]turn failed:[/] {err}", highlight=False)
    if online:
        slo = s["slo"]
        stdout.print(f"SLO (p99): TTFT <= {slo['ttft_s']:.2f} s, TPOT <= "
                     f"{slo['tpot_s'] * 1e3:.1f} ms (the paper's 4 s / 50 ms x {slo['scale']})")


def bench_url(ref: ClusterRef, trajectories: Sequence[Trajectory], *, aps: float | None,
              slo_scale: float, as_json: bool, refused: Sequence[str] = (),
              block_tokens: int = 512) -> None:
    """Drive the cluster ``ref`` names with ``trajectories`` and print the report.

    ``refused``: options given that only an in-process bench can honour (named in the
    error); ``block_tokens``: tokens one id of the trajectories' block chains covers. Exits through
    :class:`DualPathError` when no turn succeeded.
    """
    from dualpath_cli.cli.source import resolve
    from dualpath_cli.services.remote_runner import run_bench_remote

    if refused:
        raise UsageError(f"{', '.join(refused)}: not with {ref.named} (a launched cluster "
                         "runs its own configuration and policy)")
    if ref.url is not None and not ref.url.startswith(("http://", "https://")):
        raise UsageError(f"--url {ref.url!r}: expected http://HOST:PORT")
    target = resolve(ref)  # no token: a loopback cluster serves without one
    url = target.url
    total = sum(t.num_turns for t in trajectories)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=stderr, transient=True,
                  disable=not stderr.is_terminal) as progress:
        task = progress.add_task("bench --url", total=total)

        def on_turn(rec: TurnRecord) -> None:
            progress.update(task, advance=1)

        report = run_bench_remote(url, trajectories, token=target.token, aps=aps,
                                  slo=SLO(scale=slo_scale), on_turn=on_turn,
                                  block_tokens=block_tokens)
    if as_json:
        emit_json(report.to_dict())
    else:
        _render(report, online=aps is not None)
    row = report.policies[0]
    if row.turns == 0 and row.errors:
        raise DualPathError(f"no turn succeeded against {url}: {row.errors[0]}")
