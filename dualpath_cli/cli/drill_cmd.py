"""``dualpath drill``: rehearse every incident under load; one scorecard. Thin: the rows and
the runner are services/drill*.py.

The cluster is found as every live command finds it (cli/source.py) and needs its token,
since the drill injects faults (audited, as ``dualpath faults`` does); with none running
(and no ``--url``/``--port``), the drill launches a fresh embedded one (and, for a leave, a
joined one beside it) and stops them after.
Exit codes: 0 every row passed, 2 a row failed or was skipped, 3 no verdict (no cluster,
no token, bad arguments, the cluster not OK to begin with).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar

import typer

from dualpath_cli.cli.checks import CheckCommand, Unknown, emit_unknown
from dualpath_cli.cli.options import JsonOption, PortOption, TokenFileOption, UrlOption
from dualpath_cli.errors import DualPathError

if TYPE_CHECKING:
    from rich.console import Console

    from dualpath_cli.cli import source
    from dualpath_cli.services.drill import Session
    from dualpath_cli.services.drill_score import RowResult

__all__ = ["drill", "register", "render_rows", "DrillSessions"]


class _DrillCommand(CheckCommand):
    """Click's usage errors are UNKNOWN (3); the ``--json`` object has no rows."""

    unknown_fields: ClassVar[dict[str, Any]] = {"rows": []}


def register(app: typer.Typer) -> None:
    """Add ``drill`` to the ``dualpath`` app."""
    app.command("drill", cls=_DrillCommand)(drill)


def drill(
    only: Annotated[list[str] | None, typer.Option(
        "--only", help="Run only this row (repeatable): snic_throttle, read_latency, "
        "read_errors, store_full, hot_blocks, hbm_frag, slow_compute, fabric_drop, "
        "corrupt_block, kill_decode, kill_prefill, node_leave.", show_default=False,
        metavar="NAME")] = None,
    repeat: Annotated[int, typer.Option("--repeat", min=1, max=20,
                                        help="Run every row this many times.")] = 1,
    url: UrlOption = None,
    port: PortOption = None,
    token_file: TokenFileOption = None,
    as_json: JsonOption = False,
) -> None:
    """Rehearse every incident under load: one scorecard. Exit 0 all passed, 2 not, 3 no verdict."""
    try:
        code = _drill(list(only or ()), repeat, url, port, token_file, as_json)
    except DualPathError as err:
        if as_json:
            emit_unknown(str(err), rows=[])
        raise Unknown(str(err)) from None
    raise typer.Exit(code)


def _drill(only: list[str], repeat: int, url: str | None, port: int | None,
           token_file: Any, as_json: bool) -> int:
    from dualpath_cli.cli import source
    from dualpath_cli.cli.output import stderr, stdout
    from dualpath_cli.services.drill import pick_rows, run_drill
    from dualpath_cli.services.drill_score import exit_code

    rows = pick_rows(only)
    ref = source.ClusterRef(url, port, token_file)
    target = source.running(ref)
    with DrillSessions(target, quiet=as_json) as sessions:
        done = run_drill(sessions.first(), rows, repeat=repeat,
                         relaunch=sessions.relaunch if target is None else None,
                         joined=sessions.joined if target is None else None,
                         on_row=None if as_json else lambda r: _progress(stderr, r))
    code = exit_code(done)
    if as_json:
        from dualpath_cli.cli.output import emit_json

        emit_json({"passed": sum(r.passed for r in done), "rows": [r.to_dict() for r in done],
                   "exit_code": code,
                   "cluster": "embedded" if target is None else target.url})
    else:
        render_rows(stdout, done)
    return code


def _stop(client: Any, cluster: Any) -> None:
    """Close a session's client, then stop the cluster the drill launched for it (if any)."""
    from dualpath_cli.services import drill_cluster

    if client is not None:
        client.close()
    if cluster is not None:
        drill_cluster.stop_embedded(cluster)


class DrillSessions:
    """The cluster under drill: the running one (``target``), or with none a fresh embedded
    one, relaunched when a row left it broken, and (for a leave) a joined one beside it,
    all stopped at the end."""

    def __init__(self, target: source.Target | None, quiet: bool) -> None:
        self.target = target
        self.quiet = quiet
        self.embedded: Any = None
        self.client: Any = None
        self.joined_cluster: Any = None
        self.joined_client: Any = None

    def __enter__(self) -> DrillSessions:
        return self

    def __exit__(self, *exc: object) -> None:
        self._close()
        self._close_joined()

    def _close(self) -> None:
        client, self.client, cluster, self.embedded = self.client, None, self.embedded, None
        _stop(client, cluster)

    def _close_joined(self) -> None:
        client, self.joined_client = self.joined_client, None
        cluster, self.joined_cluster = self.joined_cluster, None
        _stop(client, cluster)

    def first(self) -> Session:
        if self.target is not None:
            session = self._session(self.target, None)
            self.client = session.client
            return session
        return self.relaunch()

    def relaunch(self) -> Session:
        from dualpath_cli.cli.output import stderr
        from dualpath_cli.services import drill_cluster

        self._close()
        if not self.quiet:
            stderr.print("drill: launching a fresh embedded cluster", highlight=False)
        self.embedded = drill_cluster.launch_embedded()
        session = self._launched(self.embedded)
        self.client = session.client
        return session

    def joined(self) -> Session:
        """The drill's own joined cluster (a scheduler and nodes P0, D0, D1 on loopback),
        for a leave: the embedded default has no node with a launcher of its own."""
        from dualpath_cli.cli.output import stderr
        from dualpath_cli.services import drill_cluster

        self._close_joined()
        if not self.quiet:
            stderr.print("drill: launching a joined cluster (scheduler, P0, D0, D1) for "
                         "the leave", highlight=False)
        self.joined_cluster = drill_cluster.launch_joined()
        session = self._launched(self.joined_cluster)
        self.joined_client = session.client
        return session

    def _launched(self, e: Any) -> Session:
        from dualpath_cli.cli import source

        return self._session(source.resolve(source.ClusterRef(e.url, None, e.token_file)),
                             e.store, e.workdir)

    def _session(self, target: source.Target, store: Path | None,
                 scratch: Path | None = None) -> Session:
        from dualpath_cli.api.client import DualPathClient
        from dualpath_cli.services.drill import Session

        token = target.require_token("drill")
        state = target.state
        if store is None and state is not None and state.store:
            store = Path(state.store)
        client = DualPathClient(target.url, token, timeout=10.0)
        return Session(client, target.url, token, state is not None, store, scratch)


def _progress(console: Console, r: RowResult) -> None:
    word = "skipped" if r.skipped else ("passed" if r.passed else "FAILED")
    console.print(f"drill: {r.fault} {word}", highlight=False)


def render_rows(console: Console, rows: list[RowResult]) -> None:
    """The scorecard, then why each row that did not pass did not, then ``N/M passed``."""
    from rich.table import Table

    from dualpath_cli.services.drill_score import scorecard

    cells = scorecard(rows)
    table = Table(box=None, pad_edge=False, header_style="bold")
    for col in (cells[0].keys() if cells else ()):
        table.add_column(col, overflow="fold")
    for c in cells:
        table.add_row(*c.values())
    console.print(table)
    for r in rows:
        if r.passed:
            continue
        why = r.skipped or r.error or "; ".join(_failures(r))
        console.print(f"{r.fault}: {why}", highlight=False, soft_wrap=True)
    console.print(f"{sum(r.passed for r in rows)}/{len(rows)} passed", highlight=False)


def _failures(r: RowResult) -> list[str]:
    out = []
    for what, at in (("status", r.status_s), ("diagnose", r.diagnose_s),
                     ("metrics", r.metrics_s)):
        if at is None:
            out.append(f"{what} never reported it")
        elif at > r.deadline_s:
            out.append(f"{what} reported it after {at:.1f} s (deadline {r.deadline_s:g} s)")
    if r.diagnose_s is not None and r.grade != r.want:
        out.append(f"graded {r.grade}, want {r.want}")
    if r.fix and r.fix_helped is False:
        out.append(f"fix {r.fix} did not lower the grade")
    if not r.cleared:
        out.append("not back to OK after the fault was cleared")
    if r.turns_lost:
        out.append(f"{r.turns_lost} turns lost")
    if not r.tokens_identical:
        out.append("tokens differ from the reference run")
    return out + r.notes
