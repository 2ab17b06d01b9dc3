"""``dualpath top`` (also ``dualpath-monitor --tui``): the Textual live cockpit.

Reads a live cluster through the API client (``--url``/``--port``/``--token-file``, as
every live command finds it: cli/source.py) or replays a recording (``--from``).
Textual and the client load inside the command, so ``dualpath --help`` never imports them
(tests/test_cli_import_graph.py).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from dualpath_cli.cli.options import PortOption, TokenFileOption, UrlOption
from dualpath_cli.errors import UsageError

if TYPE_CHECKING:
    from dualpath_cli.api.protocol import ClusterClient
    from dualpath_cli.cli.source import ClusterRef
    from dualpath_cli.tui.app import TopApp
    from dualpath_cli.tui.source import Source

__all__ = ["top", "run_top", "build_app", "make_source", "SCREEN_NAMES"]

#: What a replay decodes at most: samples, and samples x engines (evenly spaced, the first
#: and the last always; services/recording.py). An hour at 1 s of a 1P2D plays whole; 10
#: minutes of 1,152 engines play every 4th sample, so opening it takes seconds, not minutes.
MAX_SAMPLES = 3600
MAX_ENGINE_SAMPLES = 200_000
#: What ``--screen`` accepts (the keys 1-5 in this order).
SCREEN_NAMES = ("cluster", "nic", "layers", "requests", "alerts")


def connect(ref: ClusterRef) -> tuple[ClusterClient, str, str | None]:
    """``(client, url, token id)`` of the cluster to watch (the seam tests replace)."""
    from dualpath_cli.api.auth import token_id
    from dualpath_cli.api.client import DualPathClient
    from dualpath_cli.cli.source import resolve

    target = resolve(ref)
    token = target.token
    return (DualPathClient(target.url, token, timeout=5.0), target.url,
            token_id(token) if token else None)


def make_source(ref: ClusterRef, from_file: Path | None) -> Source:
    """A replay of ``from_file``, or a live source (the first connection is made here, so
    a missing cluster is one line and exit 3 before the screen opens)."""
    if from_file is not None:
        if ref.named:
            raise UsageError(f"--from and {ref.named} exclude each other")
        from dualpath_cli.cli.output import warn
        from dualpath_cli.services.recording import read_recording
        from dualpath_cli.tui.source import ReplaySource

        rec = read_recording(from_file, max_samples=MAX_SAMPLES,
                             max_engine_samples=MAX_ENGINE_SAMPLES, on_cut=warn)
        stride = int(rec.header.get("sample_stride", 1) or 1)
        label = str(from_file) + (f" (every {stride} samples)" if stride > 1 else "")
        return ReplaySource(rec, label)
    from dualpath_cli.tui.source import LiveSource

    client, target, tok = connect(ref)
    first = [client]

    def reconnect() -> ClusterClient:
        if first:
            return first.pop()
        return connect(ref)[0]

    return LiveSource(reconnect, target, tok)


def build_app(source: Source, interval_s: float, ascii_only: bool, theme: str,
              screen: str) -> TopApp:
    """The app over ``source``, handed the tuning twin's predictor."""
    from dualpath_cli.services.twin import cockpit_predictor
    from dualpath_cli.tui.app import TopApp

    return TopApp(source, interval_s=interval_s, ascii_only=ascii_only, theme=theme,
                  predictor=cockpit_predictor(), start=screen)


def run_top(ref: ClusterRef, from_file: Path | None = None, interval: str = "1s",
            ascii_only: bool = False, theme: str = "dark", screen: str = "cluster") -> None:
    """Check the arguments, open the source, run the cockpit until ``q``."""
    from dualpath_cli.cli.sampling import parse_interval
    from dualpath_cli.errors import pick

    interval_s = parse_interval(interval)
    if theme not in ("dark", "light"):
        raise UsageError(f"--theme {theme!r}: choose dark or light")
    screen = pick({n: n for n in SCREEN_NAMES}, screen, "screen", UsageError)
    if not sys.stdout.isatty():
        raise UsageError("dualpath top needs a terminal (for a plain table use "
                         "dualpath-monitor, for JSON dualpath-monitor --json)")
    if os.environ.get("TERM") in ("dumb",):
        ascii_only = True
    source = make_source(ref, from_file)
    app = build_app(source, interval_s, ascii_only, theme, screen)
    try:
        app.run()
    finally:
        source.close()


def top(
    url: UrlOption = None,
    port: PortOption = None,
    token_file: TokenFileOption = None,
    from_file: Annotated[Path | None, typer.Option("--from", help="Replay a recording "
                                                   "(dualpath record) with a time "
                                                   "scrubber.")] = None,
    interval: Annotated[str, typer.Option("--interval", "-i", help="Refresh interval, e.g. "
                                          "500ms, 1s, 5s (at least 250ms).")] = "1s",
    ascii_only: Annotated[bool, typer.Option("--ascii", help="ASCII borders, bars and "
                                             "sparklines (also with TERM=dumb).")] = False,
    theme: Annotated[str, typer.Option("--theme", help="dark or light (d toggles).")] = "dark",
    screen: Annotated[str, typer.Option("--screen", help="Open on: " + ", ".join(SCREEN_NAMES)
                                        + ".")] = "cluster",
) -> None:
    """A live cockpit for the cluster (or a recording): engines, NICs, layers, decisions,
    alerts, tuning. NO_COLOR is honoured; ? shows the keys, q quits."""
    from dualpath_cli.cli.source import ClusterRef

    run_top(ClusterRef(url, port, token_file), from_file, interval, ascii_only, theme, screen)
