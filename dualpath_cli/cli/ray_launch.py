"""``dualpath launch --backend ray``: the launcher drives, the scheduler serves in a Ray actor.

Why its own module: the launcher here is only the Ray driver. It connects, picks the
scheduler's Ray node, starts the scheduler's actor (:class:`SchedulerHost` inside
``services/ray_actors.py:SchedulerActor``: what ``launch --role scheduler`` serves, its HTTP
API included), places one node actor per dualpath node, and then publishes the state file,
prints the ready line and the actors' news, and on SIGINT/SIGTERM has the scheduler drain
and stops every actor. ``dualpath status``/``stop`` find it through the state file as they
find any launcher (its pid is the driver's; its URL is the scheduler actor's API).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import signal
import threading
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
    is_loopback,
    notify_failure,
    remove_file,
    remove_own_state,
    runtime_options,
    started_at,
    state_kept,
)
from dualpath_cli.cli.output import stderr
from dualpath_cli.errors import DualPathError
from dualpath_cli.services import statefile

if TYPE_CHECKING:
    from dualpath_cli.runtime.options import RuntimeOptions
    from dualpath_cli.services.ray_backend import RayBackend

__all__ = ["SchedulerHost", "serve_ray"]


class SchedulerHost:
    """``launch --role scheduler``'s serving side, built inside the scheduler's Ray actor.

    Args:
        opts: the launch's options (computed by the launcher: a bad config fails there).
        bind: the API's address on this node (loopback when the launch serves loopback).
        port: the API port (also names the state directory's checkpoint and key files).
        token: the cluster's token (the launcher wrote its file; the node actors hold it).
        allow_remote: as ``--allow-remote``.
        inject: ``--inject`` specs, set once every engine is ready.
        start_timeout: a restarted incarnation's wait for the engines to reconnect.
        restarted: Ray restarted the actor (the previous process died).
    """

    def __init__(self, opts: RuntimeOptions, bind: str, port: int, token: str,
                 allow_remote: bool, inject: list[str], start_timeout: float,
                 restarted: bool) -> None:
        from dualpath_cli.api.auth import TokenAuth
        from dualpath_cli.faultspec import parse_faults
        from dualpath_cli.plugins.manager import load_policies
        from dualpath_cli.runtime.gctune import pace_gc_for_scheduler
        from dualpath_cli.runtime.model.threads import limit_blas_threads
        from dualpath_cli.services.live import LiveCluster

        load_policies()  # a plugin's policy, as in the launcher
        if not is_loopback(bind):
            from dualpath_cli.transfer.zmq_fabric import BIND_HOST_ENV

            os.environ[BIND_HOST_ENV] = bind  # the control endpoint nodes send to
        self.port = port
        self.url = api_url(bind, port)
        self.checkpoint = statefile.checkpoint_path(port)
        self.faults = parse_faults(inject)
        self.server: HttpServer | None = None
        self.live: LiveCluster | None = None
        restoring = self.checkpoint.exists()  # a dead incarnation (or launcher) left it
        self.sock = bind_port(bind, port)
        try:
            warm = threading.Thread(target=import_http_stack, name="import-http",
                                    daemon=True)
            warm.start()
            if restoring and not opts.flops_rate:  # the dead incarnation's calibration
                from dualpath_cli.services.restart import calibrated_rate

                opts = dataclasses.replace(opts,
                                           flops_rate=calibrated_rate(self.checkpoint) or 0.0)
            opts = dataclasses.replace(opts, curve_key_file=statefile.curve_path(port))
            limit_blas_threads(1)
            pace_gc_for_scheduler()  # this process hosts the scheduler
            self.live = LiveCluster(opts, checkpoint=self.checkpoint)
            self.live.spawn()
            warm.join()
            from dualpath_cli.api.app import create_app

            app = create_app(self.live, TokenAuth(token), allow_remote=allow_remote)
            self.server = HttpServer(app, self.sock)
            self.server.start()
            durable = self.live.durable
            self.restored = durable.restored if durable is not None else None
            if restarted:  # the nodes' engines reconnect by themselves: serve once they did
                self.wait_ready(start_timeout)
        except BaseException:
            self.close()
            raise

    def info(self) -> dict[str, Any]:
        """The API's URL, what a restore brought back, the turns in flight."""
        live = self.live
        return {"url": self.url, "restored": self.restored,
                "in_flight": live.in_flight() if live is not None else 0,
                "state": live.state if live is not None else "stopped"}

    def wait_ready(self, timeout: float) -> None:
        """Every engine said hello (then ``--inject``'s faults go on, audited as launch)."""
        assert self.live is not None
        self.live.wait_ready(timeout)
        if self.faults:
            self.live.set_faults(self.faults, "launch")

    def drain(self, timeout: float) -> dict[str, Any]:
        """Stop admitting, wait for in-flight turns (up to ``timeout``), stop the API."""
        assert self.live is not None
        result = self.live.drain(timeout)
        if self.server is not None:
            self.server.stop()
            self.server = None
        return result.to_dict()

    def close(self) -> None:
        """Stop now (idempotent); the clean stop removes the checkpoint and the key file."""
        if self.live is not None:
            self.live.close()
        if self.server is not None:
            self.server.stop()
            self.server = None
        self.sock.close()
        remove_file(statefile.curve_path(self.port))


def _actor_env() -> dict[str, str]:
    """The launcher's ``XDG_*`` and ``DUALPATH_*`` variables for the scheduler's actor.

    Why: a Ray worker inherits its raylet's environment, not the driver's; with these the
    actor's state directory (checkpoint, key file) and limits are the launcher's.
    """
    skip = {NOTIFY_FD_ENV, T0_ENV, "DUALPATH_TOKEN", "DUALPATH_URL"}
    return {k: v for k, v in os.environ.items()
            if k.startswith(("XDG_", "DUALPATH_")) and k not in skip}


def serve_ray(host: str, port: int, allow_remote: bool, drain_timeout: float,
              start_timeout: float, opts_args: tuple[Any, ...], as_json: bool,
              inject: list[str], address: str | None,
              labels: dict[str, dict[str, str]]) -> int:
    """The foreground launcher of ``--backend ray`` (also what a ``--detach`` child runs)."""
    t0 = started_at()
    stop_event = threading.Event()

    def on_signal(_signum: int, _frame: object) -> None:
        if stop_event.is_set():
            stderr.print("already stopping (draining is bounded by --drain-timeout)")
        stop_event.set()

    from dualpath_cli.services.ray_backend import RayBackend

    previous: dict[int, Any] = {}
    try:
        claim_port(port)
        backend = RayBackend(address, port, loopback=is_loopback(host), labels=labels)
        try:
            backend.connect()  # an unreachable cluster fails before anything starts
        except BaseException:
            backend.close()
            raise
        # after ray.init: a Ray driver's own SIGTERM handler exits at once (code 15)
        previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        return _drive(backend, host, port, allow_remote, drain_timeout, start_timeout,
                      opts_args, as_json, inject, t0, stop_event)
    except BaseException as err:  # a --detach parent prints this line (no-op otherwise)
        notify_failure(err)
        raise
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _drive(backend: RayBackend, host: str, port: int, allow_remote: bool,
           drain_timeout: float, start_timeout: float, opts_args: tuple[Any, ...],
           as_json: bool, inject: list[str], t0: float, stop_event: threading.Event) -> int:
    from dualpath_cli.api.auth import TokenAuth

    token = statefile.token_path(port)
    restoring = statefile.checkpoint_path(port).exists()  # a killed launch's scheduler
    try:
        opts = runtime_options(*opts_args)
        node = backend.scheduler_node()
        backend.check_nodes(opts)  # before any actor starts (Ray would wait for ever)
        driver = backend.driver_node()
        # the API binds --host on the launcher's node (or loopback anywhere: the check above
        # put it on this machine), else the scheduler's node's own address
        same = driver is not None and driver["NodeID"] == node["NodeID"]
        bind = host if same or is_loopback(host) else node["NodeManagerAddress"]
        # a restart keeps the token its nodes and clients hold (claim_port kept the file)
        auth = (TokenAuth.load_or_generate(token) if restoring
                else TokenAuth.generate(token))
        factory = functools.partial(SchedulerHost, opts, bind, port, auth.token,
                                    allow_remote, list(inject), start_timeout)
        sched = backend.start_scheduler(factory, _actor_env(), node, start_timeout)
        url = sched["url"]
        backend.place(opts, url, auth.token, start_timeout)
        sched = backend.scheduler_ready(start_timeout)
        announce_ready(opts, url, bind, port, token, t0, backend.describe(), list(inject),
                        sched.get("restored"), as_json, ray=backend.placed,
                        ray_scheduler=sched,
                        ray_driver_node=driver["NodeID"] if driver is not None else None)
        poll = backend.watch()
        while not stop_event.wait(0.5):
            news = poll()  # the scheduler's actor restarted (or died: RayBackendError)
            if news:
                stderr.print(news, highlight=False, soft_wrap=True)
        in_flight = backend.refresh().get("in_flight", 0)
        stderr.print(f"stopping: draining {in_flight} turns (at most {drain_timeout:g} s)",
                     highlight=False)
        result = backend.drain(drain_timeout)
        finish_state(port, result)
        msg = f"drained {result['drained']} turns in {result['seconds']:.1f} s"
        if result.get("abandoned"):
            msg += f" ({result['abandoned']} cut off by --drain-timeout, answered 503)"
        stderr.print(f"{msg}; stopped", highlight=False)
        return 0
    except DualPathError:
        raise
    except Exception as err:  # noqa: BLE001 - Ray's own errors as one line
        first = (str(err).strip().splitlines() or [""])[0]
        raise LaunchError(f"--backend ray: {type(err).__name__}: {first}") from None
    finally:
        backend.close()
        remove_file(token)
        if not state_kept(port):
            remove_own_state(port)
