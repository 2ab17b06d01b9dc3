"""``dualpath status`` and ``dualpath stop``: find the launched cluster, report on it, stop it.

Both find the cluster as every live command does (cli/source.py: ``--url``, ``--port``,
``DUALPATH_URL``, the state file); ``stop`` signals the launcher named in the state file and
waits for its drain (the launcher leaves the drain's result in the file for it).
"""

from __future__ import annotations

import os
import signal
import time
from typing import TYPE_CHECKING, Annotated, Any, ClassVar

import typer

from dualpath_cli.cli.checks import CheckCommand, Unknown, emit_unknown
from dualpath_cli.cli.launcher import LaunchError, flag_duration
from dualpath_cli.cli.options import (
    JsonOption,
    PortOption,
    TokenFileOption,
    UrlOption,
    url_option,
)
from dualpath_cli.cli.output import emit_json, stdout
from dualpath_cli.cli.source import AmbiguousCluster, ClusterRef, NotRunning
from dualpath_cli.errors import DualPathError
from dualpath_cli.services import statefile

if TYPE_CHECKING:
    from dualpath_cli.api.client import Status

__all__ = ["status", "stop", "register", "EXIT_NONE", "EXIT_UNHEALTHY", "EXIT_CUT"]

EXIT_UNHEALTHY = 2
EXIT_NONE = 3
#: ``stop``: the cluster stopped, but its drain timeout cut turns off (they were answered 503).
EXIT_CUT = 1


class _StatusCommand(CheckCommand):
    """Click's usage errors are UNKNOWN (3), with the ``--json`` object."""

    unknown_fields: ClassVar[dict[str, Any]] = {"running": False, "state": "unknown"}


def register(app: typer.Typer) -> None:
    """Add ``status`` to the ``dualpath`` app (a check-style command: cli/checks.py)."""
    app.command("status", cls=_StatusCommand)(status)


def _summary(st: Status, url: str, pid: int | None) -> dict[str, Any]:
    """The fields of the status line from a typed ``/api/v1/status``."""
    from dualpath_cli.cli.threshold_text import alpha_text, beta_text

    th = st.thresholds
    members = st.membership
    if st.ready is not None:  # the server's one readiness, as /readyz answers it
        ok = st.ready
    else:  # an older server
        ok = st.state == "ready" and 0 < st.engines_total == st.engines_healthy
    alpha_s = th.alpha_s
    sched = dict(st.scheduling or {})  # None: a null from the server
    return {
        "running": ok, "state": st.state, "pd": st.pd, "policy": st.policy,
        # what serves now beside what was configured, and the roles with no serving engine
        "serving": members.serving if members is not None else None,
        "missing": [{"role": g.role, "since": g.since, "why": g.why}
                    for g in members.missing] if members is not None else [],
        "missing_line": members.missing_line() if members is not None else "",
        # nodes leaving one by one (the whole cluster stopping is its state, not a node's)
        "draining": [n.name for n in members.nodes if n.state == "draining"]
        if members is not None and st.state != "draining" else [],
        # nodes stopped on purpose that did not join again (their role still served or not)
        "left": [n.name for n in members.leaving() if n.state == "left"]
        if members is not None else [],
        "not_ready": st.not_ready,
        "engines": st.engines_total, "healthy": st.engines_healthy,
        "queue": st.queue.get("fifo"), "in_flight": st.queue.get("in_flight"),
        # alpha as the config gives it (seconds of reading), its tokens beside
        "alpha": alpha_text(th.alpha_tokens, alpha_s),
        "alpha_tokens": th.alpha_tokens, "alpha_s": alpha_s,
        "alpha_source": th.source.get("alpha"),
        "beta": beta_text(th.beta_tokens), "beta_source": th.source.get("beta"),
        "ready_s": st.ready_s, "uptime_s": st.uptime_s, "url": url, "pid": pid,
        "hierarchical": sched.get("hierarchical"), "sub_schedulers": sched.get("sub_schedulers"),
        "nodes_per_group": sched.get("nodes_per_group"),
        # injected faults in force: the parts running degraded on purpose
        "faults": [f.to_dict() for f in st.faults],
        # nodes whose store failed reads, held corrupt blocks or refused writes since start
        "storage": [n.to_dict() for n in st.storage],
    }


def _token_problem(err: Exception) -> str:
    """One line for a status the API refused (401: no token sent, 403: not its token)."""
    what = ("the cluster's token was not sent" if getattr(err, "status", None) == 401
            else "the token sent is not the cluster's")
    return (f"cannot read the status: {what} ({err}); pass --token-file, set "
            "DUALPATH_TOKEN or launch from this host (its state file names the token file)")


def status(
    as_json: JsonOption = False,
    url: UrlOption = None,
    port: PortOption = None,
    token_file: TokenFileOption = None,
) -> None:
    """One line about the launched cluster. Exit 0 running, 2 unhealthy, 3 none found.

    Also 3 when several run here and neither --url nor --port names one, or when the
    cluster refuses the token (401/403). Under the line,
    one line per injected fault in force (dualpath faults), and one per node whose store
    failed reads, held corrupt blocks or refused writes since start."""
    from dualpath_cli.api.client import DualPathClient
    from dualpath_cli.api.errors import ApiError, Forbidden, Unauthorized, Unreachable
    from dualpath_cli.cli.source import resolve

    try:
        found = resolve(ClusterRef(url, port, token_file))
        target, state = found.url, found.state
        with DualPathClient(target, found.token, timeout=5.0) as client:
            st = client.status()
    except (NotRunning, Unreachable) as err:
        if as_json:
            emit_unknown(str(err), running=False, state="none", reason=str(err))
        else:
            stdout.print(f"none  {err}", highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_NONE) from None
    except (Unauthorized, Forbidden) as err:  # the token is the problem: state unknown
        why = _token_problem(err)
        if as_json:
            emit_unknown(why, **_StatusCommand.unknown_fields, reason=why)
        raise Unknown(why) from None
    except ApiError as err:  # it answers, but not with a status
        if as_json:
            emit_json({"running": False, "state": "unhealthy", "reason": str(err)})
        else:
            stdout.print(f"unhealthy  {err}", highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_UNHEALTHY) from None
    except DualPathError as err:  # two clusters, no token file...: it cannot look, UNKNOWN
        if as_json:
            emit_unknown(str(err), **_StatusCommand.unknown_fields, reason=str(err))
        raise Unknown(str(err)) from None
    s = _summary(st, target, state.pid if state else None)
    if as_json:
        emit_json(s)
    else:
        word = "running" if s["running"] else ("starting" if s["state"] == "starting"
                                                else "unhealthy")
        shape = (f"{s['serving']} (of {s['pd']})" if s["serving"] not in (None, s["pd"])
                 else str(s["pd"]))
        parts = [word, shape]
        if s["missing_line"] and s["state"] == "ready":
            parts.append(s["missing_line"])
        parts += [f"{s['healthy']}/{s['engines']} engines healthy",
                 f"queue {s['queue'] if s['queue'] is not None else 'n/a'}"]
        for key in ("alpha", "beta"):
            source = s[key + "_source"]
            parts.append(f"{key} {s[key]}" + (f" ({source})" if source else ""))
        if s["hierarchical"]:
            parts.append(f"hierarchy {s['sub_schedulers']} sub-schedulers")
        if (s["nodes_per_group"] or 1) > 1:
            parts.append(f"groups of {s['nodes_per_group']} nodes")
        if s["state"] not in ("ready", "starting"):
            parts.append(f"state {s['state']}")
        stdout.print("  ".join(parts), highlight=False, soft_wrap=True)
        for name in s["draining"]:
            stdout.print(f"node {name} draining: leaving, it finishes its turns and takes "
                         "no new ones", highlight=False, soft_wrap=True)
        for name in s["left"]:
            stdout.print(f"node {name} left: stopped on purpose; it serves again once it "
                         "joins again (dualpath launch --join)", highlight=False, soft_wrap=True)
        _print_faults(st)
        for n in st.storage:
            stdout.print(n.line(), highlight=False, soft_wrap=True)
    raise typer.Exit(0 if s["running"] else EXIT_UNHEALTHY)


def _print_faults(st: Status) -> None:
    """A line per injected fault in force (the degraded parts), under the status line."""
    from dualpath_cli.cli.faults_cmd import fault_line, node_names

    names = node_names(st)
    for f in st.faults:
        stdout.print(fault_line(f, names), highlight=False, soft_wrap=True)


# --- stop ----------------------------------------------------------------------------------
def stop(
    timeout: Annotated[str, typer.Option("--timeout", help="Wait this long for the launcher "
                                         "to drain and exit.")] = "60s",
    force: Annotated[bool, typer.Option("--force", help="After the timeout, SIGKILL the "
                                        "launcher and its engines.")] = False,
    url: Annotated[str | None, url_option(
        "The API of the cluster launched on this host to stop (its state file names the "
        "launcher's pid; default: --port's, else DUALPATH_URL, else the running one).")] = None,
    port: PortOption = None,
    as_json: JsonOption = False,
) -> None:
    """Stop the launched cluster: SIGTERM, wait for its drain, report. Exit 3 if none runs.

    Also 3 when several run here and neither --url nor --port names one; 1 when the drain
    timeout cut turns off (they are counted). It signals the
    launcher's pid, so it stops a cluster launched on this host only, and needs no token."""
    import psutil

    from dualpath_cli.cli.source import locate

    wait_s = flag_duration("--timeout", timeout)
    try:
        where, state = locate(ClusterRef(url, port))
        if state is None:
            raise NotRunning(f"no cluster launched on this host serves {where} (no live "
                             f"state file in {statefile.state_dir()} names it)")
    except (NotRunning, AmbiguousCluster) as err:
        if as_json:
            emit_json({"stopped": False, "reason": str(err)})
        if isinstance(err, AmbiguousCluster):
            raise
        if not as_json:
            stdout.print(f"none  {err}", highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_NONE) from None
    try:
        proc = psutil.Process(state.pid)
        family = [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        family = []
    state.stop_requested = True
    statefile.write_state(state)
    t0 = time.monotonic()
    try:
        os.kill(state.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    deadline = t0 + wait_s
    while state.alive() and time.monotonic() < deadline:
        time.sleep(0.05)  # polling a foreign pid (not our child: nothing to wait on)
    result: dict[str, Any] = {"pid": state.pid, "port": state.port, "forced": False}
    if state.alive():
        if not force:
            raise LaunchError(f"the launcher (pid {state.pid}) is still running after "
                              f"{wait_s:g} s; wait, or run 'dualpath stop --force'")
        for p in family:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        deadline = time.monotonic() + 10
        while any(statefile.pid_alive(p.pid) for p in family) and time.monotonic() < deadline:
            time.sleep(0.05)
        statefile.remove_state(state.port)
        result.update(forced=True, killed=len(family), seconds=time.monotonic() - t0)
        msg = (f"killed the launcher (pid {state.pid}) and {len(family) - 1} child processes "
               f"after {wait_s:g} s; stopped")
    else:
        final = statefile.read_state(state.path)
        statefile.remove_state(state.port)
        drain = final.drain if final is not None and final.stopped else {}
        result.update(drain=drain, seconds=round(time.monotonic() - t0, 3))
        if drain:
            msg = f"drained {drain['drained']} turns in {drain['seconds']:.1f} s"
            if drain.get("abandoned"):
                msg += f"; {drain['abandoned']} turns cut off by the drain timeout"
            msg += "; stopped"
        else:
            msg = "stopped"
    if as_json:
        emit_json({"stopped": True, **result})
    else:
        stdout.print(msg, highlight=False, soft_wrap=True)
    if result.get("drain", {}).get("abandoned"):
        raise typer.Exit(EXIT_CUT)  # stopped, but turns were answered 503: a WARNING
