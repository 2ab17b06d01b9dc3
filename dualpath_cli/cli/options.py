"""The options every command that talks to a cluster shares, defined once.

``--url``, ``--port``, ``--token-file`` and ``--json`` mean the same in every command (how
cli/source.py finds the cluster and its token, and one JSON object instead of a table); a
command whose ``--url`` or ``--json`` says something more keeps the flag and passes its own
help. A command that talks to a cluster takes ``UrlOption``, ``PortOption`` and
``TokenFileOption`` and hands them to cli/source.py as one ``ClusterRef``;
tests/test_cli_help_markup.py checks that every such command lists them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

__all__ = ["URL_HELP", "PORT_HELP", "url_option", "port_option", "json_option", "UrlOption",
           "PortOption", "TokenFileOption", "JsonOption"]

#: ``--url``'s help where it names the cluster to ask (cli/source.py's rules).
URL_HELP = ("The cluster's API (default: --port's cluster, else DUALPATH_URL, else the "
            "running cluster's state file).")


def url_option(help: str = URL_HELP) -> Any:
    """``--url``: the cluster's API, with a command's own ``help`` where it says more."""
    return typer.Option("--url", help=help)


#: ``--port``'s help where it picks one of the clusters launched on this host.
PORT_HELP = "The cluster launched on this host on this port (when several run)."


def port_option(help: str = PORT_HELP) -> Any:
    """``--port``: a cluster launched on this host, with a command's own ``help``."""
    return typer.Option("--port", help=help)


def json_option(help: str = "Print one JSON object.") -> Any:
    """``--json``: machine-readable output, with a command's own ``help`` where it differs."""
    return typer.Option("--json", help=help)


UrlOption = Annotated[str | None, url_option()]
PortOption = Annotated[int | None, port_option()]
TokenFileOption = Annotated[Path | None, typer.Option(
    "--token-file", help="A file with the cluster's token (default: DUALPATH_TOKEN, else "
    "the token file of the cluster's state file).")]
JsonOption = Annotated[bool, json_option()]

