"""What every launcher shares: the local one (cli/local_launch.py), ``--backend ray``'s
driver and its scheduler actor (cli/ray_launch.py).

The runtime options a launch computes from the config and the flags, the port claimed and
bound before any engine starts, the HTTP server on that socket, the ready line and the state
file, the ``--detach`` parent's notification, and the clean-up of a launcher's files. Heavy
imports (uvicorn, fastapi, the runtime) stay inside the functions.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from dualpath_cli.cli.output import emit_json, stderr, stdout
from dualpath_cli.errors import DualPathError, UsageError
from dualpath_cli.services import statefile
from dualpath_cli.services.statefile import ClusterState

__all__ = ["LaunchError", "NOTIFY_FD_ENV", "T0_ENV", "LAUNCH_DEFAULTS", "EMULATED_DEFAULTS",
           "flag_duration", "is_loopback", "bind_port", "api_url", "home", "started_at",
           "runtime_options", "HttpServer", "announce_ready", "notify_failure",
           "import_http_stack", "claim_port", "remove_file", "finish_state", "state_kept",
           "remove_own_state"]

#: Set in a ``--detach`` child: the fd to report "ready" or the failure on.
NOTIFY_FD_ENV = "DUALPATH_LAUNCH_NOTIFY_FD"
#: Set in a ``--detach`` child: the wall-clock time the user's command started.
T0_ENV = "DUALPATH_LAUNCH_T0"
#: Bench default applied when nothing set it: a CPU turn lasts tens of milliseconds, so the
#: config default's 100 ms pull would dominate it (as for ``dualpath bench``).
LAUNCH_DEFAULTS = {"scheduler.fetch_period": "5ms"}
#: With ``--engines emulated``: the emulated hardware's GPUs per node, and the paper's
#: 100 ms pull (1,152 engines fetching every 5 ms would be the scheduler's whole load).
EMULATED_DEFAULTS = {"cluster.gpus_per_node": "8", "scheduler.fetch_period": "100ms"}


class LaunchError(DualPathError):
    """The cluster could not be launched (port taken, engines failed, ...)."""


def flag_duration(flag: str, text: str) -> float:
    """``text`` in seconds (units.py forms); a bad one is a usage error naming ``flag``."""
    from dualpath_cli.errors import UnitError
    from dualpath_cli.units import parse_duration

    try:
        return parse_duration(text)
    except UnitError as err:
        raise UsageError(f"{flag}: {err}") from None


def is_loopback(host: str) -> bool:
    """Whether ``host`` is this machine only (``localhost`` or a loopback address)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind_port(host: str, port: int) -> socket.socket:
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


def api_url(host: str, port: int) -> str:
    """The API's base URL for a server bound to ``host:port``."""
    from dualpath_cli.api.listen import base_url

    return base_url(host, port)


def home(path: Path | str) -> str:
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


def started_at() -> float:
    """Wall-clock start of the user's command (a detached child inherits its parent's)."""
    inherited = os.environ.get(T0_ENV)
    if inherited:
        return float(inherited)
    age = _process_age()
    if age is not None:
        return time.time() - age
    start = statefile.process_start_time(os.getpid())
    return start if start is not None else time.time()



def runtime_options(preset: str | None, config: Path | None, overrides: list[str],
                    pd: str | None, policy: str | None, store: Path | None,
                    engines: str = "real", emulated_hosts: int = 4, role: str = "all",
                    heartbeat_timeout: float | None = None) -> Any:
    """The launch's runtime options: the config, the launch defaults where nothing set those
    keys, and the flags; the store and replica directories created (a usage error if not)."""
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
    defaults = dict(LAUNCH_DEFAULTS)
    if engines == "emulated":  # the emulated hardware (hopper) has 8 GPUs per node
        defaults.update(EMULATED_DEFAULTS)
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


class HttpServer:
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
        except BaseException as err:  # noqa: BLE001 - start() reports it (SystemExit too)
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
    fd = os.environ.pop(NOTIFY_FD_ENV, None)
    if fd is None:
        return
    try:
        with os.fdopen(int(fd), "w") as pipe:
            pipe.write(json.dumps(message) + "\n")
    except OSError:
        pass


def announce_ready(opts: Any, url: str, host: str, port: int, token: Path, t0: float,
                    engines: str, faults: list[str], restored: dict[str, Any] | None,
                    as_json: bool, **extra: Any) -> None:
    """The cluster serves: write its state file, tell a ``--detach`` parent, print the ready
    line (or ``--json``'s object, with ``extra`` fields)."""
    ready_s = time.time() - t0
    state = ClusterState(pid=os.getpid(), url=url, host=host, port=port,
                         started_at=time.time(), token_file=str(token),
                         pid_start=statefile.process_start_time(os.getpid()),
                         pid_start_since_boot=statefile.process_start_since_boot(os.getpid()),
                         ready_s=round(ready_s, 3),
                         pd=f"{opts.prefill_nodes}P{opts.decode_nodes}D",
                         store=str(opts.store_dir),
                         log_file=os.environ.get("DUALPATH_LAUNCH_LOG"))
    statefile.write_state(state)
    line = f"ready in {ready_s:.1f} s: {engines}, API {url}, token in {home(token)}"
    if faults:
        line += "; faults injected: " + " ".join(faults)
    if restored is not None:
        line += (f"; restored from {home(statefile.checkpoint_path(port))}: "
                 f"{restored['flights']} turns ({restored['requeued']} re-queued), "
                 f"{restored['engines']} engines")
    payload = {**state.to_dict(), "ready_s": round(ready_s, 3), "line": line,
               "restored": restored, **extra}
    if as_json:
        emit_json(payload)
    else:
        stdout.print(line, highlight=False, soft_wrap=True)
    # the log (a --detach child's stdout is a file, block-buffered) holds the ready line
    # before the parent is told: it says "ready" and may send the operator to the log
    sys.stdout.flush()
    _notify({"ok": True, "line": line, "state": payload})


def notify_failure(err: BaseException) -> None:
    """Tell a waiting ``--detach`` parent why the start failed, in one line with its code."""
    _notify({"ok": False, "error": str(err) if isinstance(err, DualPathError)
             else f"{type(err).__name__}: {err}",
             "code": getattr(err, "exit_code", 1)})  # ours and click's errors carry one



def remove_own_state(port: int) -> None:
    """Remove the state file of ``port`` if this process wrote it."""
    state = statefile.read_state(statefile.state_path(port))
    if state is not None and state.pid == os.getpid():
        statefile.remove_state(port, token=False)


def import_http_stack() -> None:
    """Import FastAPI, uvicorn and the app (errors surface again at the real import)."""
    try:
        import uvicorn  # noqa: F401

        import dualpath_cli.api.app  # noqa: F401
    except Exception:  # noqa: BLE001 - reported by the main thread's own import
        pass


def claim_port(port: int) -> None:
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


def remove_file(path: Path) -> None:
    """Remove ``path``; already gone is fine."""
    try:
        path.unlink()
    except FileNotFoundError:
        pass


def finish_state(port: int, drain: dict[str, Any]) -> None:
    """Leave the drain result for a waiting ``dualpath stop`` (which removes the file)."""
    state = statefile.read_state(statefile.state_path(port))
    if state is None or state.pid != os.getpid():
        return
    if state.stop_requested:
        state.stopped = True
        state.drain = drain
        statefile.write_state(state)


def state_kept(port: int) -> bool:
    """Whether this launcher's state file stays for ``dualpath stop`` to read."""
    state = statefile.read_state(statefile.state_path(port))
    return state is not None and state.pid == os.getpid() and state.stopped


