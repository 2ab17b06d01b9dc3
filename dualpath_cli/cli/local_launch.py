"""The local launcher: ``launch`` serving in this process (also what a ``--detach`` child
runs), the ``--detach`` parent that waits for it, and a node joining a scheduler
(``launch --role prefill|decode --join``).

Lifecycle of the foreground launcher: claim and bind the port (before any engine starts, so a
second launch on one port fails in milliseconds), serve HTTP (``/readyz`` is 503 until every
engine said hello), start the engines, publish the state file and print the ready line. On
SIGINT/SIGTERM: stop admitting (new turns get HTTP 503 with ``Retry-After``), drain in-flight
turns for up to ``--drain-timeout``, stop HTTP, close the engines and the store, remove the
state and token files.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dualpath_cli.cli.launcher import (
    NOTIFY_FD_ENV,
    T0_ENV,
    HttpServer,
    LaunchError,
    announce_ready,
    api_url,
    bind_port,
    claim_port,
    finish_state,
    import_http_stack,
    notify_failure,
    remove_file,
    remove_own_state,
    runtime_options,
    started_at,
    state_kept,
)
from dualpath_cli.cli.output import emit_json, stderr, stdout
from dualpath_cli.errors import DualPathError, UsageError
from dualpath_cli.services import statefile

if TYPE_CHECKING:
    from dualpath_cli.services.live import LiveCluster

__all__ = ["serve", "detach", "serve_node"]

def engines_text(live: LiveCluster) -> str:
    o = live.opts
    if not o.local_engines:
        return "scheduler only (nodes join with --join)"
    n_pre = o.prefill_nodes * o.gpus_per_node
    n_dec = o.decode_nodes * o.gpus_per_node
    return f"{o.prefill_nodes}P{o.decode_nodes}D ({n_pre} prefill, {n_dec} decode engines)"



def serve(host: str, port: int, allow_remote: bool, drain_timeout: float,
           start_timeout: float, opts_args: tuple[Any, ...], as_json: bool,
           faults: list[Any] | None = None) -> int:
    """The foreground launcher (also what a ``--detach`` child runs)."""
    t0 = started_at()
    stop_event = threading.Event()
    signals: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        signals.append(signum)
        if stop_event.is_set():
            stderr.print("already stopping (draining is bounded by --drain-timeout)")
        stop_event.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        return _serve_inner(host, port, allow_remote, drain_timeout, start_timeout, opts_args,
                            as_json, t0, stop_event, faults or [])
    except BaseException as err:  # a --detach parent prints this line (no-op otherwise)
        notify_failure(err)
        raise
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _serve_inner(host: str, port: int, allow_remote: bool, drain_timeout: float,
                 start_timeout: float, opts_args: tuple[Any, ...], as_json: bool, t0: float,
                 stop_event: threading.Event, faults: list[Any]) -> int:
    claim_port(port)
    sock = bind_port(host, port)
    server: HttpServer | None = None
    live: LiveCluster | None = None
    token = statefile.token_path(port)
    checkpoint = statefile.checkpoint_path(port)  # (services/restart.py: heavy imports)
    restoring = checkpoint.exists()  # a launcher on this port died (kill -9): take it over
    try:
        # the HTTP stack imports (GIL-bound) on a thread while this one reads the config and
        # calibrates (BLAS, GIL released); both are on the way to ready
        warm = threading.Thread(target=import_http_stack, name="import-http", daemon=True)
        warm.start()
        opts = runtime_options(*opts_args)
        if restoring and not opts.flops_rate:  # the killed launcher's calibration
            from dataclasses import replace

            from dualpath_cli.services.restart import calibrated_rate

            opts = replace(opts, flops_rate=calibrated_rate(checkpoint) or 0.0)
        opts = dataclasses.replace(opts, curve_key_file=statefile.curve_path(port))
        from dualpath_cli.runtime.gctune import pace_gc_for_scheduler
        from dualpath_cli.runtime.model.threads import limit_blas_threads

        # one BLAS thread, as in every engine: the predictor's calibration (below) then
        # measures the rate a prefill engine computes at, and does not fight the engines
        limit_blas_threads(1)
        pace_gc_for_scheduler()  # this process hosts the scheduler: it allocates per turn
        from dualpath_cli.services.live import LiveCluster

        live = LiveCluster(opts, checkpoint=checkpoint)
        live.spawn()  # the engines import and connect while the HTTP side comes up
        warm.join()
        from dualpath_cli.api.app import create_app
        from dualpath_cli.api.auth import TokenAuth

        # a restart keeps the token its nodes and clients hold (claim_port kept the file)
        auth = (TokenAuth.load_or_generate(token) if restoring
                else TokenAuth.generate(token))
        app = create_app(live, auth, allow_remote=allow_remote)
        server = HttpServer(app, sock)
        server.start()
        live.wait_ready(start_timeout)
        if faults:  # --inject: on before the cluster is announced ready (audited as launch)
            live.set_faults(faults, "launch")
        announce_ready(opts, api_url(host, port), host, port, token, t0, engines_text(live),
                        [f.spec() for f in faults],
                        live.durable.restored if live.durable is not None else None,
                        as_json)
        while not stop_event.wait(0.5):
            if not server.thread.is_alive():
                raise LaunchError(f"the HTTP server stopped unexpectedly ({server.error!r})")
        in_flight = live.in_flight()
        stderr.print(f"stopping: draining {in_flight} turns (at most "
                     f"{drain_timeout:g} s)", highlight=False)
        result = live.drain(drain_timeout)
        server.stop()
        server = None
        finish_state(port, result.to_dict())
        msg = f"drained {result.drained} turns in {result.seconds:.1f} s"
        if result.abandoned:
            msg += f" ({result.abandoned} cut off by --drain-timeout, answered 503)"
        stderr.print(f"{msg}; stopped", highlight=False)
        return 0
    finally:
        if live is not None:
            live.close()
        if server is not None:
            server.stop()
        sock.close()
        remove_file(token)
        remove_file(statefile.curve_path(port))
        if not state_kept(port):
            remove_own_state(port)



def detach(argv: list[str], port: int, as_json: bool, timeout: float) -> int:
    """Re-run ``launch`` in the background; wait until it is ready or failed."""
    log = statefile.log_path(port)
    read_fd, write_fd = os.pipe()
    env = dict(os.environ)
    env[NOTIFY_FD_ENV] = str(write_fd)
    env[T0_ENV] = repr(started_at())
    env["DUALPATH_LAUNCH_LOG"] = str(log)
    with open(log, "wb") as out, open(os.devnull, "rb") as devnull:
        child = subprocess.Popen([sys.executable, "-m", "dualpath_cli.cli.app", "launch",
                                  *argv], stdin=devnull, stdout=out, stderr=subprocess.STDOUT,
                                 env=env, pass_fds=(write_fd,), start_new_session=True)
    os.close(write_fd)
    deadline = time.monotonic() + timeout
    data = b""
    with os.fdopen(read_fd, "rb") as pipe:
        import selectors

        sel = selectors.DefaultSelector()
        sel.register(pipe, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if sel.select(timeout=0.2):
                chunk = os.read(pipe.fileno(), 65536)
                if not chunk:
                    break
                data += chunk
            elif child.poll() is not None:
                break
        sel.close()
    try:
        message = json.loads(data.decode() or "null")
    except ValueError:
        message = None
    if isinstance(message, dict) and message.get("ok"):
        if as_json:
            emit_json(message["state"])
        else:
            stdout.print(message["line"], highlight=False, soft_wrap=True)
        return 0
    if isinstance(message, dict):
        raise _Failed(str(message.get("error")), int(message.get("code", 1)))
    if child.poll() is None:
        child.terminate()
        raise LaunchError(f"the detached launcher was not ready within {timeout:g} s; "
                          f"see {log}")
    raise LaunchError(f"the detached launcher exited with code {child.returncode} before it "
                      f"was ready; see {log}")


class _Failed(DualPathError):
    """A detached child's failure, with its exit code."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.exit_code = code



def _local_token(url: str) -> str | None:
    """The token of a scheduler launched on this host by this user at ``url``'s port, from
    its state file (as ``dualpath status`` finds it); None when there is none to read."""
    import urllib.parse

    parsed = urllib.parse.urlsplit(url)
    local = {"localhost", "127.0.0.1", "::1", socket.gethostname(),
             socket.getfqdn()}
    if parsed.port is None or (parsed.hostname or "") not in local:
        return None
    for state in statefile.live_states(parsed.port)[0]:
        try:
            text = Path(state.token_file or "").read_text().strip()
        except OSError:
            continue
        if text:
            return text
    return None


def token_for_join(token_file: Path | None, url: str = "") -> str:
    """The cluster's token for ``--join``: ``--token-file``, else ``DUALPATH_TOKEN``, else
    (a scheduler on this host) its state file's token."""
    if token_file is not None:
        from dualpath_cli.cli.source import read_token_file

        return read_token_file(token_file)
    env = os.environ.get("DUALPATH_TOKEN", "").strip()
    if env:
        return env
    local = _local_token(url) if url else None
    if local is None:
        raise UsageError("joining needs the cluster's token: --token-file FILE (the "
                         "scheduler's token file) or DUALPATH_TOKEN (a scheduler launched "
                         "on this host is found by its port)")
    stderr.print("token: the scheduler's state file on this host", highlight=False)
    return local


def serve_node(role: str, name: str, join: str, token_file: Path | None, gpus: int,
                store: Path | None, host: str, start_s: float, as_json: bool) -> None:
    """``launch --role prefill|decode --join``: this node's engines until SIGINT/SIGTERM."""
    from dualpath_cli.services.node import NodeAgent, join_url

    url = join_url(join)
    agent = NodeAgent(url, token_for_join(token_file, url), name, role, gpus,
                      store.expanduser() if store is not None else None, host,
                      on_event=lambda line: stderr.print(line, highlight=False,
                                                         soft_wrap=True))
    stop_event = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop_event.set())
                for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        joined_s = agent.join(start_s)
        plan = agent.plan
        assert plan is not None
        line = (f"joined {url} as node {name!r} (node {plan.node}): {gpus} {role} engines "
                f"{plan.engine_ids[0]}-{plan.engine_ids[-1]} serving in {joined_s:.2f} s")
        if as_json:
            emit_json({"node": name, "index": plan.node, "role": role,
                       "engines": plan.engine_ids, "join_s": round(joined_s, 3), "url": url})
        else:
            stdout.print(line, highlight=False, soft_wrap=True)
        why = agent.serve(stop_event)
        stderr.print(f"node {name!r}: {why}; leaving", highlight=False)
    finally:
        agent.close(leave=True)
        for s, handler in previous.items():
            signal.signal(s, handler)


