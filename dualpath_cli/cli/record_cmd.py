"""``dualpath record``: write a window of a live cluster to one file (a recording).

A recording holds the ClusterView every ``--interval``, the ``/metrics`` extras, the turns in
flight then, the decision log, the served turns as a trace, the stories of the requests
that finished (what ``dualpath explain`` tells; services/recording.py) and the audit log's
entries in reach of the window (diagnose names a change by its audit entry); every command
that takes ``--url`` also takes ``--from`` such a file, so last night's incident can be
diagnosed in the morning.

The file is written as the window goes (services/recording_stream.py): Ctrl-C or SIGTERM
finishes it (exit 130 / 143, "interrupted after N samples"), and a killed recorder's file
reads up to its last flush, a few seconds before it died.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from dualpath_cli.cli.options import PortOption, TokenFileOption, UrlOption, json_option
from dualpath_cli.cli.output_target import output_path, writes_stdout
from dualpath_cli.errors import DualPathError, UsageError

if TYPE_CHECKING:
    from dualpath_cli.api.protocol import ClusterClient
    from dualpath_cli.telemetry.recording import RecordedAudit

__all__ = ["record", "audit_in_reach"]


def audit_in_reach(client: ClusterClient, first: float, last: float) -> RecordedAudit | None:
    """The cluster's audit log (``/api/v1/status``, read after the window) from the reach of
    a change before ``first`` (diagnose's rule: one window length, at least
    ``CHANGE_REACH_MIN_S``) to ``last``, with alpha's seconds of reading per token.
    ``None`` when the status cannot be read (the recording is kept, without the line)."""
    from dualpath_cli.diagnose.workflows.snic_imbalance import change_reach_s
    from dualpath_cli.telemetry.recording import RecordedAudit

    try:
        status = client.status()
    except DualPathError:
        return None
    reach = change_reach_s(last - first)
    return RecordedAudit(tuple(a for a in status.audit if first - reach <= a.at <= last),
                         status.thresholds.alpha_s_per_token)


def record(
    window: Annotated[str, typer.Option("--window", "-w", help="How long to record, e.g. 30s, "
                                        "10m.")] = "30s",
    output: Annotated[Path, typer.Option("--output", "-o", help="The recording: .jsonl, "
                                         ".jsonl.gz, or .jsonl.zst (needs zstandard); "
                                         "written as it goes, flushed every 2 s; '-': "
                                         "plain JSONL on stdout.")] = Path(
        "recording.jsonl.gz"),
    interval: Annotated[str, typer.Option("--interval", "-i", help="Time between samples "
                                          "(at least 250ms).")] = "1s",
    url: UrlOption = None,
    port: PortOption = None,
    token_file: TokenFileOption = None,
    as_json: Annotated[bool, json_option("Print one JSON object with the "
                                          "counts.")] = False,
) -> None:
    """Record views, decisions and served turns of a live cluster over a window."""
    from dualpath_cli.cli import source
    from dualpath_cli.cli.output import emit_json, stderr, stdout
    from dualpath_cli.cli.sampling import parse_interval
    from dualpath_cli.services.recording import collect, write_recording
    from dualpath_cli.services.recording_stream import zstd_module
    from dualpath_cli.telemetry.view import Decision
    from dualpath_cli.units import parse_duration

    window_s = parse_duration(window)
    interval_s = parse_interval(interval)
    if window_s < interval_s:
        raise UsageError(f"--window {window} is shorter than --interval {interval}")
    path = output_path(output, as_json=as_json)
    if path is not None and not path.parent.is_dir():
        raise UsageError(f"{path.parent}: no such directory for the recording")
    if path is not None and path.name.lower().endswith(".zst"):
        zstd_module()  # refused before the window is spent, not after
    decisions: list[Decision] = []
    stories: dict[int, dict[str, Any]] = {}
    t0 = time.monotonic()
    with source.connect(source.ClusterRef(url, port, token_file),
                        timeout=max(5.0, interval_s * 4)) as client:
        target = client.url
        client.healthz()  # unreachable: one line and exit 3 before a file is started
        if not as_json:
            stderr.print(f"recording {target} for {window} into {output} ...",
                         highlight=False)
        header = {"source": target, "interval_s": interval_s, "window_s": window_s,
                  "created": time.time()}
        counts: dict[str, int] = {}
        try:
            write_recording(sys.stdout.buffer if path is None else path, header,
                            collect(client, window_s, interval_s, decisions_out=decisions,
                                    stories_out=stories, inflight=True),
                            decisions, stories.values(),
                            lambda first, last: audit_in_reach(client, first, last),
                            counts=counts)
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM (termination.py): the file is whole
            stderr.print(f"interrupted after {counts.get('samples', 0)} samples; "
                         f"{output} is complete up to then", highlight=False)
            if as_json:  # the one object, with what the file holds
                emit_json(_summary(output, counts, t0, interrupted=True))
            raise
    summary = _summary(output, counts, t0)
    if as_json:
        emit_json(summary)
    else:
        where = "stdout" if path is None else f"{output} ({summary['bytes']} bytes)"
        say = stderr if path is None else stdout  # the recording owns stdout with -o -
        say.print(f"recorded {counts['samples']} samples, {counts['decisions']} decisions, "
                  f"{max(0, counts['trace'] - 1)} agents' turns, {counts['outcomes']} "
                  f"finished requests' stories in {summary['seconds']} s -> {where}",
                  highlight=False, soft_wrap=True)


def _summary(output: Path, counts: dict[str, int], t0: float,
             interrupted: bool = False) -> dict[str, Any]:
    """``record --json``'s object: the file, what it holds, how long it took."""
    return {"output": str(output), **counts, "seconds": round(time.monotonic() - t0, 2),
            "bytes": None if writes_stdout(output) else output.stat().st_size,
            "interrupted": interrupted}
