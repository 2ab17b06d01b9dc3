"""``dualpath launch``, ``status`` and ``stop``: serve a cluster, find it, stop it.

Thin: the cluster is :class:`~dualpath_cli.services.live.LiveCluster`, the HTTP app is
:func:`dualpath_cli.api.app.create_app`, the state file is
:mod:`dualpath_cli.services.statefile`. Heavy imports (numpy, zmq, fastapi, uvicorn) stay
inside the command functions so ``dualpath --help`` stays fast.

Lifecycle of ``launch``: check the host (loopback unless ``--allow-remote``) and the port
(bound before any engine starts, so a second launch on one port fails in milliseconds), serve
HTTP (``/readyz`` is 503 until every engine said hello), start the engines, publish the state
file and print the ready line. On SIGINT/SIGTERM: stop admitting (new turns get HTTP 503 with
``Retry-After``), drain in-flight turns for up to ``--drain-timeout``, stop HTTP, close the
engines and the store, remove the state and token files, exit 0.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from dualpath_cli.cli.output import emit_json, stderr, stdout
from dualpath_cli.cli.source import NotRunning
from dualpath_cli.errors import DualPathError, UsageError
from dualpath_cli.services import statefile
from dualpath_cli.services.statefile import ClusterState
from dualpath_cli.units import parse_duration

if TYPE_CHECKING:
    from dualpath_cli.services.live import LiveCluster

__all__ = ["launch", "status", "stop", "register", "LaunchError", "EXIT_NONE",
           "EXIT_UNHEALTHY", "DEFAULT_PORT"]

DEFAULT_PORT = 8470
EXIT_UNHEALTHY = 2
EXIT_NONE = 3
#: Set in a ``--detach`` child: the fd to report "ready" or the failure on.
_NOTIFY_FD = "DUALPATH_LAUNCH_NOTIFY_FD"
#: Set in a ``--detach`` child: the wall-clock time the user's command started.
_T0 = "DUALPATH_LAUNCH_T0"
#: Bench default applied when nothing set it: a CPU turn lasts tens of milliseconds, so the
#: config default's 100 ms pull would dominate it (as for ``dualpath bench``).
_LAUNCH_DEFAULTS = {"scheduler.fetch_period": "5ms"}
#: With ``--engines emulated``: the emulated hardware's GPUs per node, and the paper's
#: 100 ms pull (1,152 engines fetching every 5 ms would be the scheduler's whole load).
_EMULATED_DEFAULTS = {"cluster.gpus_per_node": "8", "scheduler.fetch_period": "100ms"}


class LaunchError(DualPathError):
    """The cluster could not be launched (port taken, engines failed, ...)."""


def register(app: typer.Typer) -> None:
    """Add ``launch``, ``status`` and ``stop`` to the ``dualpath`` app."""
    app.command("launch")(launch)
    app.command("status")(status)
    app.command("stop")(stop)


def _duration(flag: str, text: str) -> float:
    from dualpath_cli.errors import UnitError

    try:
        return parse_duration(text)
    except UnitError as err:
        raise UsageError(f"{flag}: {err}") from None


# --- launch ------------------------------------------------------------------------------
def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (before any engine starts: fail fast)."""
    from dualpath_cli.api.listen import listen

    try:
        return listen(host, port)
    except socket.gaierror as err:
        raise UsageError(f"--host {host}: cannot resolve it ({err.strerror})") from None
    except OSError as err:
        if err.errno in (98, 48):  # EADDRINUSE on Linux, macOS
            raise LaunchError(f"port {port} on {host} is already in use (another dualpath "
                              "launch or another server); stop it or choose --port") from None
        raise LaunchError(f"cannot listen on {host}:{port}: {err.strerror}") from None


def _url(host: str, port: int) -> str:
    from dualpath_cli.api.listen import base_url

    return base_url(host, port)


def _home(path: Path | str) -> str:
    """``path`` with the home directory shown as ``~``."""
    text = str(path)
    home = str(Path.home())
    return "~" + text[len(home):] if text.startswith(home + os.sep) else text


def _process_age() -> float | None:
    """Seconds since this process started, to 10 ms (Linux; ``None`` elsewhere).

    Not psutil's create_time: it adds the boot time, which Linux gives in whole seconds, so
    a ready time could be off by up to a second.
    """
    try:
        with open("/proc/self/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime") as fh:
            uptime = float(fh.read().split()[0])
        return uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _started_at() -> float:
    """Wall-clock start of the user's command (a detached child inherits its parent's)."""
    inherited = os.environ.get(_T0)
    if inherited:
        return float(inherited)
    age = _process_age()
    if age is not None:
        return time.time() - age
    start = statefile.process_start_time(os.getpid())
    return start if start is not None else time.time()


def _engines_text(live: LiveCluster) -> str:
    o = live.opts
    if not o.local_engines:
        return "scheduler only (nodes join with --join)"
    n_pre = o.prefill_nodes * o.gpus_per_node
    n_dec = o.decode_nodes * o.gpus_per_node
    return f"{o.prefill_nodes}P{o.decode_nodes}D ({n_pre} prefill, {n_dec} decode engines)"


def _options(preset: str | None, config: Path | None, overrides: list[str], pd: str | None,
             policy: str | None, store: Path | None, engines: str = "real",
             emulated_hosts: int = 4, role: str = "all",
             heartbeat_timeout: float | None = None) -> Any:
    from dualpath_cli.cli.bench_cmd import store_root
    from dualpath_cli.config import load_config
    from dualpath_cli.config.model import parse_pd
    from dualpath_cli.core.policies import get_policy
    from dualpath_cli.plugins.manager import load_policies
    from dualpath_cli.runtime.options import options_from_config

    load_policies()  # a plugin's policy is selectable by --policy and scheduler.read_side
    if policy is not None:
        try:
            policy = get_policy(policy).name
        except UsageError as err:
            raise UsageError(f"--policy: {err}") from None
    if engines not in ("real", "emulated"):
        raise UsageError(f"--engines {engines!r}: expected real or emulated")
    sets = list(overrides)
    if pd is not None:
        sets.append(f"cluster.pd={parse_pd(pd)}")
    loaded = load_config(preset=preset, config_file=config, overrides=sets)
    defaults = dict(_LAUNCH_DEFAULTS)
    if engines == "emulated":  # the emulated hardware (hopper) has 8 GPUs per node
        defaults.update(_EMULATED_DEFAULTS)
    extra = [f"{k}={v}" for k, v in defaults.items()
             if loaded.source(k).kind in ("default", "profile")]
    if extra:
        loaded = load_config(preset=preset, config_file=config, overrides=[*extra, *sets])
    root = (store or store_root(loaded)).expanduser()
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UsageError(f"--store {root}: cannot create it ({err.strerror})") from None
    more: dict[str, Any] = {"processes": True, "store_dir": root}
    if policy is not None:
        more["policy"] = policy
    if engines == "emulated":
        more.update(engines="emulated", emulated_hosts=emulated_hosts, heartbeat_s=0.5)
    if role == "scheduler":  # nodes join it (--join); a dead node's turns move within ~1 s
        more["local_engines"] = False
    if heartbeat_timeout is not None:
        more["heartbeat_timeout"] = heartbeat_timeout
    opts = options_from_config(loaded, **more)
    for replica in opts.replica_dirs:  # storage.replica_roots / --replica-root
        if replica.resolve() == root.resolve():
            raise UsageError(f"storage.replica_roots: {replica} is the store root itself")
        try:
            replica.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise UsageError(f"storage.replica_roots: {replica}: cannot create it "
                             f"({err.strerror})") from None
    return opts


class _Server:
    """uvicorn on a pre-bound socket, in a thread (signals stay with the main thread)."""

    def __init__(self, app: Any, sock: socket.socket) -> None:
        import uvicorn

        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on",
                                timeout_graceful_shutdown=5)
        self.server = uvicorn.Server(config)
        self.sock = sock
        self.thread = threading.Thread(target=self._run, name="http", daemon=True)
        self.error: BaseException | None = None

    def _run(self) -> None:
        try:
            self.server.run(sockets=[self.sock])
        except BaseException as err:  # SystemExit from a failed startup included
            self.error = err

    def start(self, timeout: float = 30.0) -> None:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise LaunchError(f"the HTTP server did not start ({self.error!r})")
            self.thread.join(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10.0)
        if self.thread.is_alive():
            self.server.force_exit = True
            self.thread.join(5.0)
        self.sock.close()


def _notify(message: dict[str, Any]) -> None:
    """Tell a waiting ``--detach`` parent how the start went (no-op otherwise)."""
    fd = os.environ.pop(_NOTIFY_FD, None)
    if fd is None:
        return
    try:
        with os.fdopen(int(fd), "w") as pipe:
            pipe.write(json.dumps(message) + "\n")
    except OSError:
        pass


def _announce_ready(opts: Any, url: str, host: str, port: int, token: Path, t0: float,
                    engines: str, faults: list[str], restored: dict[str, Any] | None,
                    as_json: bool, **extra: Any) -> None:
    """The cluster serves: write its state file, tell a ``--detach`` parent, print the ready
    line (or ``--json``'s object, with ``extra`` fields)."""
    ready_s = time.time() - t0
    state = ClusterState(pid=os.getpid(), url=url, host=host, port=port,
                         started_at=time.time(), token_file=str(token),
                         pid_start=statefile.process_start_time(os.getpid()),
                         ready_s=round(ready_s, 3),
                         pd=f"{opts.prefill_nodes}P{opts.decode_nodes}D",
                         store=str(opts.store_dir),
                         log_file=os.environ.get("DUALPATH_LAUNCH_LOG"))
    statefile.write_state(state)
    line = f"ready in {ready_s:.1f} s: {engines}, API {url}, token in {_home(token)}"
    if faults:
        line += "; faults injected: " + " ".join(faults)
    if restored is not None:
        line += (f"; restored from {_home(statefile.checkpoint_path(port))}: "
                 f"{restored['flights']} turns ({restored['requeued']} re-queued), "
                 f"{restored['engines']} engines")
    payload = {**state.to_dict(), "ready_s": round(ready_s, 3), "line": line,
               "restored": restored, **extra}
    _notify({"ok": True, "line": line, "state": payload})
    if as_json:
        emit_json(payload)
    else:
        stdout.print(line, highlight=False, soft_wrap=True)


def _notify_failure(err: BaseException) -> None:
    """Tell a waiting ``--detach`` parent why the start failed, in one line with its code."""
    _notify({"ok": False, "error": str(err) if isinstance(err, DualPathError)
             else f"{type(err).__name__}: {err}", "code": getattr(err, "exit_code", 1)})


def _serve(host: str, port: int, allow_remote: bool, drain_timeout: float,
           start_timeout: float, opts_args: tuple[Any, ...], as_json: bool,
           faults: list[Any] | None = None) -> int:
    """The foreground launcher (also what a ``--detach`` child runs)."""
    t0 = _started_at()
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
        _notify_failure(err)
        raise
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _serve_inner(host: str, port: int, allow_remote: bool, drain_timeout: float,
                 start_timeout: float, opts_args: tuple[Any, ...], as_json: bool, t0: float,
                 stop_event: threading.Event, faults: list[Any]) -> int:
    _claim_port(port)
    sock = _bind(host, port)
    server: _Server | None = None
    live: LiveCluster | None = None
    token = statefile.token_path(port)
    checkpoint = statefile.checkpoint_path(port)  # (services/restart.py: heavy imports)
    restoring = checkpoint.exists()  # a launcher on this port died (kill -9): take it over
    try:
        # the HTTP stack imports (GIL-bound) on a thread while this one reads the config and
        # calibrates (BLAS, GIL released); both are on the way to ready
        warm = threading.Thread(target=_import_http_stack, name="import-http", daemon=True)
        warm.start()
        opts = _options(*opts_args)
        if restoring and not opts.flops_rate:  # the killed launcher's calibration
            from dataclasses import replace

            from dualpath_cli.services.restart import calibrated_rate

            opts = replace(opts, flops_rate=calibrated_rate(checkpoint) or 0.0)
        opts = dataclasses.replace(opts, curve_key_file=statefile.curve_path(port))
        from dualpath_cli.runtime.model.threads import limit_blas_threads

        # one BLAS thread, as in every engine: the predictor's calibration (below) then
        # measures the rate a prefill engine computes at, and does not fight the engines
        limit_blas_threads(1)
        from dualpath_cli.services.live import LiveCluster

        live = LiveCluster(opts, checkpoint=checkpoint)
        live.spawn()  # the engines import and connect while the HTTP side comes up
        warm.join()
        from dualpath_cli.api.app import create_app
        from dualpath_cli.api.auth import TokenAuth

        # a restart keeps the token its nodes and clients hold (_claim_port kept the file)
        auth = (TokenAuth.load_or_generate(token) if restoring
                else TokenAuth.generate(token))
        app = create_app(live, auth, allow_remote=allow_remote)
        server = _Server(app, sock)
        server.start()
        live.wait_ready(start_timeout)
        if faults:  # --inject: on before the cluster is announced ready (audited as launch)
            live.set_faults(faults, "launch")
        _announce_ready(opts, _url(host, port), host, port, token, t0, _engines_text(live),
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
        _finish_state(port, result.to_dict())
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
        _remove(token)
        _remove(statefile.curve_path(port))
        if not _state_kept(port):
            _remove_own_state(port)


def _remove_own_state(port: int) -> None:
    """Remove the state file of ``port`` if this process wrote it."""
    state = statefile.read_state(statefile.state_path(port))
    if state is not None and state.pid == os.getpid():
        statefile.remove_state(port, token=False)


def _import_http_stack() -> None:
    """Import FastAPI, uvicorn and the app (errors surface again at the real import)."""
    try:
        import uvicorn  # noqa: F401

        import dualpath_cli.api.app  # noqa: F401
    except Exception:  # noqa: BLE001 - reported by the main thread's own import
        pass


def _claim_port(port: int) -> None:
    """Refuse a port whose state file names a live launcher; clean a stale one.

    A stale launcher that left a scheduler checkpoint (it was killed) keeps its token file:
    the restarted one takes its place, and its nodes and clients hold that token.
    """
    token = statefile.token_path(port)
    kept: bytes | None = None
    if statefile.checkpoint_path(port).exists():
        try:
            kept = token.read_bytes()
        except OSError:
            kept = None
    live, stale = statefile.live_states(port)
    if kept is not None and not live and not token.exists():
        from dualpath_cli.atomicio import atomic_write_bytes

        atomic_write_bytes(token, kept, mode=0o600)
    for state in stale:
        stderr.print(f"removed a stale state file of port {port} (pid {state.pid} is gone)",
                     highlight=False)
    if live:
        s = live[0]
        raise LaunchError(f"a cluster is already running on port {port} (pid {s.pid}, "
                          f"{s.url}); stop it with 'dualpath stop' or choose --port")


def _remove(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass


def _finish_state(port: int, drain: dict[str, Any]) -> None:
    """Leave the drain result for a waiting ``dualpath stop`` (which removes the file)."""
    state = statefile.read_state(statefile.state_path(port))
    if state is None or state.pid != os.getpid():
        return
    if state.stop_requested:
        state.stopped = True
        state.drain = drain
        statefile.write_state(state)


def _state_kept(port: int) -> bool:
    """Whether this launcher's state file stays for ``dualpath stop`` to read."""
    state = statefile.read_state(statefile.state_path(port))
    return state is not None and state.pid == os.getpid() and state.stopped


def _detach(argv: list[str], port: int, as_json: bool, timeout: float) -> int:
    """Re-run ``launch`` in the background; wait until it is ready or failed."""
    log = statefile.log_path(port)
    read_fd, write_fd = os.pipe()
    env = dict(os.environ)
    env[_NOTIFY_FD] = str(write_fd)
    env[_T0] = repr(_started_at())
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


def launch(
    host: Annotated[str, typer.Option("--host", help="Address to serve the API on "
                                      "(loopback unless --allow-remote).")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=1, max=65535, help="API port.")] = (
        DEFAULT_PORT),
    allow_remote: Annotated[bool, typer.Option("--allow-remote", help="Allow a non-loopback "
                                               "--host (every endpoint then needs the "
                                               "token).")] = False,
    detach: Annotated[bool, typer.Option("--detach", help="Run in the background (log in "
                                         "the state directory); return once ready.")] = False,
    drain_timeout: Annotated[str, typer.Option("--drain-timeout", help="On stop, wait this "
                                               "long for in-flight turns.")] = "30s",
    start_timeout: Annotated[str, typer.Option("--start-timeout", help="Give up when the "
                                               "engines are not all up by then.")] = "120s",
    store: Annotated[Path | None, typer.Option("--store", help="Store directory (default: "
                                               "$XDG_DATA_HOME/dualpath/store).")] = None,
    replica_root: Annotated[list[Path] | None, typer.Option(
        "--replica-root", help="A store root for copies of hot blocks (repeatable; another "
        "3FS directory or NFS export; sets storage.replica_roots).")] = None,
    pd: Annotated[str | None, typer.Option("--pd", help="Prefill/decode nodes, e.g. 1P2D "
                                           "(default: cluster.pd).")] = None,
    policy: Annotated[str | None, typer.Option("--policy", help="Runtime policy (default: "
                                               "dualpath).")] = None,
    preset: Annotated[str | None, typer.Option("--preset", help="Config preset to start "
                                               "from.")] = None,
    config: Annotated[Path | None, typer.Option("--config", "-c", help="Config file.")] = None,
    overrides: Annotated[list[str] | None, typer.Option(
        "--set", help="Override one config key, e.g. --set scheduler.alpha=2s.")] = None,
    curve: Annotated[str | None, typer.Option(
        "--curve", help="ZeroMQ CURVE between nodes: auto (on off loopback), on or off "
        "(config cluster.curve).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the ready state as one JSON "
                                          "object.")] = False,
    inject: Annotated[list[str] | None, typer.Option(
        "--inject", help="Inject a fault (repeatable; rehearsal and diagnose tests), e.g. "
        "snic_throttle:node=1,fraction=0.25, read_latency:node=1,latency=20ms, "
        "read_errors:node=1,rate=0.1, hot_blocks:node=0,count=4,rate=20, "
        "hbm_frag:engine=2,stride=4, slow_compute:engine=1,factor=4.")] = None,
    role: Annotated[str, typer.Option("--role", help="all (one host: scheduler and "
                                      "engines), scheduler (nodes join it), or prefill/"
                                      "decode (this node joins --join).")] = "all",
    node: Annotated[str | None, typer.Option("--node", help="This node's name (with --role "
                                             "prefill|decode; default: the host name).")] = (
        None),
    join: Annotated[str | None, typer.Option("--join", help="HOST:PORT of the scheduler's "
                                             "API to join.")] = None,
    token_file: Annotated[Path | None, typer.Option("--token-file", help="The cluster's "
                                                    "token (default: DUALPATH_TOKEN).")] = None,
    gpus: Annotated[int, typer.Option("--gpus", min=1, max=64, help="Engines this node "
                                      "runs.")] = 1,
    heartbeat_timeout: Annotated[str | None, typer.Option(
        "--heartbeat-timeout", help="Silence before an engine is declared dead (default 5s; "
        "1s with --role scheduler).")] = None,
    engines: Annotated[str, typer.Option("--engines", help="real (the reference model) or "
                                         "emulated (the real protocol over real sockets, "
                                         "timing from the cost model: control-plane scale "
                                         "tests, e.g. --pd 48P96D).")] = "real",
    emulated_hosts: Annotated[int, typer.Option("--emulated-hosts", min=1, help="Processes "
                                                "the emulated engines run in.")] = 4,
    backend: Annotated[str, typer.Option("--backend", help="local (this host's processes) "
                                         "or ray (the scheduler and each node's engines are "
                                         "Ray actors; a node's on a Ray node with the "
                                         "dualpath_prefill or dualpath_decode resource, or "
                                         "the label --ray-prefill-label/--ray-decode-label "
                                         "names; needs Ray: dualpath's ray extra)."
                                         )] = "local",
    address: Annotated[str | None, typer.Option("--address", help="With --backend ray: the "
                                                "Ray cluster, auto, HOST:PORT of its GCS or "
                                                "ray://HOST:PORT (Ray Client; default: "
                                                "RAY_ADDRESS, else auto).")] = None,
    ray_scheduler_label: Annotated[str | None, typer.Option(
        "--ray-scheduler-label", help="With --backend ray: run the scheduler's actor on a "
        "Ray node with this label, KEY=VALUE[,...] (default: the launcher's node).")] = None,
    ray_prefill_label: Annotated[str | None, typer.Option(
        "--ray-prefill-label", help="With --backend ray: place prefill nodes' actors on Ray "
        "nodes with this label, e.g. dualpath.role=prefill (ray start --labels), instead "
        "of by the dualpath_prefill resource.")] = None,
    ray_decode_label: Annotated[str | None, typer.Option(
        "--ray-decode-label", help="With --backend ray: place decode nodes' actors on Ray "
        "nodes with this label, instead of by the dualpath_decode resource.")] = None,
) -> None:
    """Serve the configured cluster (default: embedded 1P2D) until SIGINT/SIGTERM.

    The state file (pid, URL, token file) goes to $XDG_RUNTIME_DIR/dualpath/, else
    $XDG_STATE_HOME/dualpath/ or ~/.local/state/dualpath/; 'dualpath status' and
    'dualpath stop' find the cluster through it.
    """
    if curve is not None:  # as the config key, so --detach passes it on with --set
        if curve not in ("auto", "on", "off"):
            raise UsageError(f"--curve {curve!r}: expected auto, on or off")
        overrides = [*(overrides or []), f"cluster.curve={curve}"]
    if role not in ("all", "scheduler", "prefill", "decode"):
        raise UsageError(f"--role {role!r}: expected all, scheduler, prefill or decode")
    if replica_root:  # as the config key, so --detach passes it on with the other --set
        overrides = [*(overrides or []), "storage.replica_roots=" + ",".join(
            str(Path(r).expanduser().resolve()) for r in replica_root)]
    if backend not in ("local", "ray"):
        raise UsageError(f"--backend {backend!r}: expected local or ray")
    ray_labels: dict[str, dict[str, str]] = {}
    for role_, flag, text in (("scheduler", "--ray-scheduler-label", ray_scheduler_label),
                              ("prefill", "--ray-prefill-label", ray_prefill_label),
                              ("decode", "--ray-decode-label", ray_decode_label)):
        if text is not None:
            if backend != "ray":
                raise UsageError(f"{flag} is for --backend ray (where the actors run)")
            from dualpath_cli.services.ray_backend import parse_label

            ray_labels[role_] = parse_label(flag, text)
    if backend == "ray":
        if role not in ("all", "scheduler") or engines != "real" or join is not None:
            raise UsageError("--backend ray: this process schedules and the engines run as "
                             "Ray actors (no --role prefill|decode, --join or --engines "
                             "emulated)")
        role = "scheduler"  # the nodes join it, as Ray actors (services/ray_backend.py)
    elif address is not None:
        raise UsageError("--address is for --backend ray (the Ray cluster to launch on)")
    if role in ("prefill", "decode"):
        if join is None:
            raise UsageError(f"--role {role} needs --join HOST:PORT (the scheduler's API)")
        if detach:  # it was ignored: a script's `launch --role decode --detach` never returned
            raise UsageError(f"--detach is for the scheduler (--role all|scheduler); a "
                             f"--role {role} node runs in the foreground until SIGTERM (run "
                             "it under systemd, or with & and nohup)")
        _serve_node(role, node or socket.gethostname(), join, token_file, gpus, store, host,
                    _duration("--start-timeout", start_timeout), as_json)
        raise typer.Exit(0)
    if join is not None:
        raise UsageError("--join is for --role prefill or decode (a node joining a "
                         "scheduler)")
    if not _is_loopback(host) and not allow_remote:
        raise UsageError(f"--host {host} is not a loopback address; add --allow-remote to "
                         "serve other machines (every endpoint then needs the token)")
    drain_s = _duration("--drain-timeout", drain_timeout)
    start_s = _duration("--start-timeout", start_timeout)
    hb_timeout = (_duration("--heartbeat-timeout", heartbeat_timeout)
                  if heartbeat_timeout is not None else 1.0 if role == "scheduler" else None)
    if role == "scheduler" and not _is_loopback(host):
        from dualpath_cli.transfer.zmq_fabric import BIND_HOST_ENV

        os.environ[BIND_HOST_ENV] = host  # the control endpoint nodes send to
    from dualpath_cli.faultspec import parse_faults

    faults = parse_faults(inject or [])  # a bad SPEC fails here, before anything starts
    if detach:
        _claim_port(port)
        _bind(host, port).close()  # fail fast here rather than in the background
        argv = ["--host", host, "--port", str(port), "--drain-timeout", drain_timeout,
                "--start-timeout", start_timeout]
        argv += ["--allow-remote"] if allow_remote else []
        for flag, value in (("--store", store), ("--pd", pd), ("--policy", policy),
                            ("--preset", preset), ("--config", config)):
            if value is not None:
                argv += [flag, str(Path(value).resolve()) if isinstance(value, Path)
                         else value]
        for item in overrides or []:
            argv += ["--set", item]
        argv += ["--engines", engines, "--emulated-hosts", str(emulated_hosts),
                 "--role", role, "--backend", backend]
        argv += ["--address", address] if address is not None else []
        for flag, text in (("--ray-scheduler-label", ray_scheduler_label),
                           ("--ray-prefill-label", ray_prefill_label),
                           ("--ray-decode-label", ray_decode_label)):
            argv += [flag, text] if text is not None else []
        if heartbeat_timeout is not None:
            argv += ["--heartbeat-timeout", heartbeat_timeout]
        for spec in inject or []:
            argv += ["--inject", spec]
        code = _detach(argv, port, as_json, timeout=start_s + 60.0)
        raise typer.Exit(code)
    opts_args = (preset, config, list(overrides or []), pd, policy, store, engines,
                 emulated_hosts, role, hb_timeout)
    if backend == "ray":  # the scheduler runs as a Ray actor too (cli/ray_launch.py)
        from dualpath_cli.cli.ray_launch import serve_ray

        code = serve_ray(host, port, allow_remote, drain_s, start_s, opts_args, as_json,
                         list(inject or []), address, ray_labels)
        raise typer.Exit(code)
    code = _serve(host, port, allow_remote, drain_s, start_s, opts_args, as_json, faults)
    raise typer.Exit(code)


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


def _token_for_join(token_file: Path | None, url: str = "") -> str:
    """The cluster's token for ``--join``: ``--token-file``, else ``DUALPATH_TOKEN``, else
    (a scheduler on this host) its state file's token."""
    if token_file is not None:
        try:
            text = token_file.expanduser().read_text().strip()
        except OSError as err:
            raise UsageError(f"--token-file {token_file}: cannot read it "
                             f"({err.strerror})") from None
        if not text:
            raise UsageError(f"--token-file {token_file}: it is empty")
        return text
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


def _serve_node(role: str, name: str, join: str, token_file: Path | None, gpus: int,
                store: Path | None, host: str, start_s: float, as_json: bool) -> None:
    """``launch --role prefill|decode --join``: this node's engines until SIGINT/SIGTERM."""
    from dualpath_cli.services.node import NodeAgent, join_url

    url = join_url(join)
    agent = NodeAgent(url, _token_for_join(token_file, url), name, role, gpus,
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


# --- status --------------------------------------------------------------------------------
def _target(url: str | None, port: int | None) -> tuple[str, str | None, ClusterState | None]:
    """``(url, token, state)`` of the cluster to ask (cli/source.py); NotRunning when none."""
    from dualpath_cli.cli.source import resolve

    t = resolve(url, port)
    return t.url, t.token, t.state


def _summary(st: Any, url: str, pid: int | None) -> dict[str, Any]:
    """The fields of the status line from a typed ``/api/v1/status``."""
    from dualpath_cli.units import format_duration_rounded, format_tokens

    th = st.thresholds
    ok = st.state == "ready" and 0 < st.engines_total == st.engines_healthy
    alpha_s = getattr(th, "alpha_s", None)
    sched = dict(getattr(st, "scheduling", None) or {})
    return {
        "running": ok, "state": st.state, "pd": st.pd, "policy": st.policy,
        "engines": st.engines_total, "healthy": st.engines_healthy,
        "queue": st.queue.get("fifo"), "in_flight": st.queue.get("in_flight"),
        # alpha as the config gives it (seconds of reading), its tokens beside
        "alpha": (format_duration_rounded(alpha_s) if alpha_s is not None
                  else f"{format_tokens(th.alpha_tokens)} tok"),
        "alpha_tokens": th.alpha_tokens, "alpha_s": alpha_s,
        "alpha_source": th.source.get("alpha"),
        "beta": f"{format_tokens(th.beta_tokens)} tok", "beta_source": th.source.get("beta"),
        "ready_s": st.ready_s, "uptime_s": st.uptime_s, "url": url, "pid": pid,
        "hierarchical": sched.get("hierarchical"), "sub_schedulers": sched.get("sub_schedulers"),
        "nodes_per_group": sched.get("nodes_per_group"),
    }


def status(
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    url: Annotated[str | None, typer.Option("--url", help="Ask this API instead of the state "
                                            "file's (also DUALPATH_URL; its token from "
                                            "DUALPATH_TOKEN when no state file names "
                                            "it).")] = None,
    port: Annotated[int | None, typer.Option("--port", help="The cluster on this port (when "
                                             "several run).")] = None,
) -> None:
    """One line about the launched cluster. Exit 0 running, 2 unhealthy, 3 none found."""
    from dualpath_cli.api.client import DualPathClient
    from dualpath_cli.api.errors import ApiError, Unreachable

    try:
        target, token, state = _target(url, port)
        with DualPathClient(target, token, timeout=5.0) as client:
            st = client.status()
    except (NotRunning, Unreachable) as err:
        if as_json:
            emit_json({"running": False, "state": "none", "reason": str(err)})
        else:
            stdout.print(f"none  {err}", highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_NONE) from None
    except ApiError as err:  # it answers, but not with a status
        if as_json:
            emit_json({"running": False, "state": "unhealthy", "reason": str(err)})
        else:
            stdout.print(f"unhealthy  {err}", highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_UNHEALTHY) from None
    s = _summary(st, target, state.pid if state else None)
    if as_json:
        emit_json(s)
    else:
        word = "running" if s["running"] else ("starting" if s["state"] == "starting"
                                                else "unhealthy")
        parts = [word, str(s["pd"]), f"{s['healthy']}/{s['engines']} engines healthy",
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
    raise typer.Exit(0 if s["running"] else EXIT_UNHEALTHY)


# --- stop ----------------------------------------------------------------------------------
def stop(
    timeout: Annotated[str, typer.Option("--timeout", help="Wait this long for the launcher "
                                         "to drain and exit.")] = "60s",
    force: Annotated[bool, typer.Option("--force", help="After the timeout, SIGKILL the "
                                        "launcher and its engines.")] = False,
    port: Annotated[int | None, typer.Option("--port", help="The cluster on this port (when "
                                             "several run).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Stop the launched cluster: SIGTERM, wait for its drain, report. Exit 3 if none runs."""
    import psutil

    wait_s = _duration("--timeout", timeout)
    live, stale = statefile.live_states(port)
    if not live:
        gone = f"; removed a stale state file (pid {stale[0].pid} is gone)" if stale else ""
        msg = f"no cluster running (no live state file in {statefile.state_dir()}{gone})"
        if as_json:
            emit_json({"stopped": False, "reason": msg})
        else:
            stdout.print(f"none  {msg}", highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_NONE)
    if len(live) > 1:
        ports = ", ".join(str(s.port) for s in live)
        raise UsageError(f"{len(live)} clusters are running (ports {ports}); choose one with "
                         "--port")
    state = live[0]
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
    while statefile.pid_alive(state.pid, state.pid_start) and time.monotonic() < deadline:
        time.sleep(0.05)  # polling a foreign pid (not our child: nothing to wait on)
    result: dict[str, Any] = {"pid": state.pid, "port": state.port, "forced": False}
    if statefile.pid_alive(state.pid, state.pid_start):
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
            msg = f"drained {drain['drained']} turns in {drain['seconds']:.1f} s; stopped"
            if drain.get("abandoned"):
                msg += f" ({drain['abandoned']} cut off by the drain timeout)"
        else:
            msg = "stopped"
    if as_json:
        emit_json({"stopped": True, **result})
    else:
        stdout.print(msg, highlight=False, soft_wrap=True)
