"""``dualpath faults list | inject SPEC... | clear [ID | --all]``: rehearse on a live cluster.

Why: ``launch --inject`` makes a part misbehave only from the start; an operator rehearsing a
diagnose workflow injects, watches and clears faults on the running cluster. The SPECs are
``launch --inject``'s (faultspec.py); the cluster is found as every live command finds it
(cli/source.py), and injecting or clearing goes through the API, which checks the token and
audits the change (action ``faults``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any

import typer

from dualpath_cli.cli.options import JsonOption, PortOption, TokenFileOption, UrlOption
from dualpath_cli.cli.output import emit_json, stdout
from dualpath_cli.errors import UsageError

if TYPE_CHECKING:
    from dualpath_cli.api.protocol import ClusterClient
    from dualpath_cli.faultspec import Fault
    from dualpath_cli.telemetry.status import Status
    from dualpath_cli.telemetry.view import AuditEntry

__all__ = ["app", "fault_line", "list_faults", "inject", "clear"]

app = typer.Typer(help="List, inject and clear faults on the running cluster (audited).",
                  no_args_is_help=True)

_TIMEOUT_S = 10.0


def node_names(st: Status) -> dict[int, str]:
    """Node index -> the operator's name (``D1``), from the status's membership record."""
    return {n.node: n.name for n in st.membership.nodes} if st.membership else {}


def fault_line(f: Fault, names: Mapping[int, str] | None = None) -> str:
    """``fault #3 snic_throttle node D1 fraction 0.25 (since 03:10:02 UTC)``: one line a
    fault, its node under the operator's name where ``names`` has it (as monitor shows it)."""
    since = (f" (since {time.strftime('%H:%M:%S', time.gmtime(f.since))} UTC)" if f.since
             else "")
    words = f.describe()
    key, value = f.target
    if key == "node" and names and isinstance(value, int) and value in names:
        words = words.replace(f"node {value}", f"node {names[value]}", 1)
    return f"fault #{f.id} {words}{since}"


def _client(url: str | None, port: int | None, token_file: Any) -> ClusterClient:
    from dualpath_cli.cli import source

    return source.connect(source.ClusterRef(url, port, token_file), timeout=_TIMEOUT_S)


def _print_faults(faults: tuple[Fault, ...] | list[Fault],
                  names: Mapping[int, str] | None = None) -> None:
    if not faults:
        stdout.print("no faults in force", highlight=False)
    for f in faults:
        stdout.print(fault_line(f, names), highlight=False, soft_wrap=True)


def _changed(entry: AuditEntry, as_json: bool, names: Mapping[int, str] | None = None) -> None:
    """Report an audited change: the faults in force after it."""
    from dualpath_cli.faultspec import Fault

    now = [Fault.from_dict(d) for d in entry.new.get("faults", [])]
    if as_json:
        emit_json({"audit": entry.seq, "by": entry.token_id,
                   "before": entry.old.get("faults", []), "faults": entry.new.get("faults", [])})
        return
    stdout.print(f"audit #{entry.seq}: {len(now)} fault(s) in force", highlight=False)
    for f in now:
        stdout.print(fault_line(f, names), highlight=False, soft_wrap=True)


@app.command("list")
def list_faults(
    url: UrlOption = None,
    port: PortOption = None,
    token_file: TokenFileOption = None,
    as_json: JsonOption = False,
) -> None:
    """The injected faults in force, one line each (id, kind, target, since when)."""
    with _client(url, port, token_file) as client:
        st = client.status()
    if as_json:
        emit_json({"faults": [f.to_dict() for f in st.faults]})
        return
    _print_faults(st.faults, node_names(st))


@app.command()
def inject(
    specs: Annotated[list[str], typer.Argument(
        help="Faults as launch --inject takes them: KIND:key=value,... e.g. "
        "snic_throttle:node=1,fraction=0.25 (kinds: snic_throttle, read_latency, "
        "read_errors, store_full, hot_blocks, hbm_frag, slow_compute, fabric_drop).",
        show_default=False, metavar="SPEC")],
    url: UrlOption = None,
    port: PortOption = None,
    token_file: TokenFileOption = None,
    as_json: JsonOption = False,
) -> None:
    """Inject faults on the parts they target (token needed; audited).

    A fault of the same kind on the same target replaces the one in force (a new id)."""
    from dualpath_cli.faultspec import parse_faults

    parse_faults(specs)  # a bad SPEC fails here, in one line, before the cluster is asked
    with _client(url, port, token_file) as client:
        entry = client.set_faults(specs)
        names = node_names(client.status()) if not as_json else {}
    _changed(entry, as_json, names)


@app.command()
def clear(
    fault_id: Annotated[int | None, typer.Argument(
        help="The id of the fault to clear (faults list shows it).", min=1, metavar="ID",
        show_default=False)] = None,
    clear_all: Annotated[bool, typer.Option("--all", help="Clear every fault in force.")]
    = False,
    url: UrlOption = None,
    port: PortOption = None,
    token_file: TokenFileOption = None,
    as_json: JsonOption = False,
) -> None:
    """Undo one fault by its id, or every fault with --all (token needed; audited)."""
    if (fault_id is None) == (not clear_all):
        raise UsageError("faults clear: give one fault ID or --all (not both)")
    with _client(url, port, token_file) as client:
        entry = client.clear_faults() if clear_all else client.clear_fault(int(fault_id or 0))
    _changed(entry, as_json)
