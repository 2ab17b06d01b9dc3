"""``dualpath explain REQUEST_ID``: one request's story, from a live cluster or a recording.

The story itself is built by diagnose/explain.py (the API's ``GET /api/v1/requests/{id}``
serves the same story, which the client reads as a ``RequestStory``); this module only finds
the source and renders. Heavy modules (the HTTP client, the recording reader) load inside the
command, so ``dualpath --help`` does not pay for them (tests/test_cli_import_graph.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from dualpath_cli.cli.options import JsonOption, PortOption, TokenFileOption, UrlOption

if TYPE_CHECKING:
    from dualpath_cli.cli.source import ClusterRef
    from dualpath_cli.telemetry.stories import RequestStory

__all__ = ["explain", "register"]


def register(app: typer.Typer) -> None:
    """Add ``explain`` to the ``dualpath`` app."""
    app.command("explain")(explain)


def _story(request_id: str, ref: ClusterRef, from_file: Path | None) -> RequestStory:
    if from_file is not None:
        from dualpath_cli.cli.output import warn
        from dualpath_cli.diagnose.explain import story_from_recording
        from dualpath_cli.services.recording import read_recording

        # the story the cluster served when the request finished (whole), else the
        # decision part; samples are not needed for either
        rec = read_recording(from_file, max_samples=2, on_cut=warn)
        return story_from_recording(rec, request_id)
    from dualpath_cli.cli import source

    with source.connect(ref, timeout=10.0) as client:
        return client.request(request_id)


def explain(
    request_id: Annotated[str, typer.Argument(help=(
        "The request id: rid in the decision log, dualpath monitor and recordings (the "
        "x-request-id header of an OpenAI answer), the answer's chatcmpl-/cmpl- id, or the "
        "x-request-id the client sent."))],
    url: UrlOption = None,
    port: PortOption = None,
    token_file: TokenFileOption = None,
    from_file: Annotated[Path | None, typer.Option("--from", help="Explain from a recording "
                                                   "(dualpath record) instead.")] = None,
    as_json: JsonOption = False,
) -> None:
    """Why one request went where it went: PE and DE with their classes and the thresholds,
    the read side and the queues that chose it, blocks hit per tier and missed per reason,
    bytes per NIC, per-layer slack, and its TTFT as queueing + loading + transfer + prefill."""
    from dualpath_cli.cli.output import emit_json, fail, stdout
    from dualpath_cli.cli.source import ClusterRef
    from dualpath_cli.errors import DualPathError

    try:
        story = _story(request_id, ClusterRef(url, port, token_file), from_file)
    except DualPathError as err:
        fail(str(err))
        raise typer.Exit(err.exit_code) from None
    if as_json:
        emit_json(story)
        return
    from dualpath_cli.diagnose.explain import render_story

    for line in render_story(story):
        stdout.print(line, highlight=False, soft_wrap=True, markup=False)
