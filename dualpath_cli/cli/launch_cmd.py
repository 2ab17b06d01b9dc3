"""``dualpath launch``: check the flags, then serve here, in the background or on Ray.

Thin: the local launcher is cli/local_launch.py (a node joining a scheduler too), the Ray
driver cli/ray_launch.py, what both share cli/launcher.py; ``status`` and ``stop`` are
cli/status_cmd.py. Heavy imports (numpy, zmq, fastapi, uvicorn) stay inside the functions so
``dualpath --help`` stays fast.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Annotated

import typer

from dualpath_cli.cli import local_launch
from dualpath_cli.cli.launcher import bind_port, claim_port, flag_duration, is_loopback
from dualpath_cli.cli.options import TokenFileOption, json_option
from dualpath_cli.errors import UsageError

__all__ = ["launch", "DEFAULT_PORT"]

DEFAULT_PORT = 8470


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
                                               "dualpath/store under $XDG_DATA_HOME).")] = None,
    replica_root: Annotated[list[Path] | None, typer.Option(
        "--replica-root", help="A store root for copies of hot blocks (repeatable; another "
        "3FS directory or NFS export; sets the config key storage.replica_roots too).")] = None,
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
    as_json: Annotated[bool, json_option("Print the ready state as one JSON "
                                          "object.")] = False,
    inject: Annotated[list[str] | None, typer.Option(
        "--inject", help="Inject a fault (repeatable; rehearsal and diagnose tests): "
        "KIND:KEY=VALUE,... as in the examples above.")] = None,
    role: Annotated[str, typer.Option("--role", help="all (one host: scheduler and "
                                      "engines), scheduler (nodes join it), or prefill/"
                                      "decode (this node joins --join).")] = "all",
    node: Annotated[str | None, typer.Option("--node", help="This node's name (with --role "
                                             "prefill|decode; default: the host name).")] = (
        None),
    join: Annotated[str | None, typer.Option("--join", help="HOST:PORT of the scheduler's "
                                             "API to join.")] = None,
    token_file: TokenFileOption = None,
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
                                         "the label --ray-prefill-label or --ray-decode-label "
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

    Faults for --inject, e.g.:

    * snic_throttle:node=1,fraction=0.25
    * read_latency:node=1,latency=20ms
    * read_errors:node=1,rate=0.1
    * hot_blocks:node=0,count=4,rate=20
    * hbm_frag:engine=2,stride=4
    * slow_compute:engine=1,factor=4
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
            from dualpath_cli.services.ray_labels import parse_label

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
        local_launch.serve_node(role, node or socket.gethostname(), join, token_file, gpus,
                                store, host, flag_duration("--start-timeout", start_timeout),
                                as_json)
        raise typer.Exit(0)
    if join is not None:
        raise UsageError("--join is for --role prefill or decode (a node joining a "
                         "scheduler)")
    if not is_loopback(host) and not allow_remote:
        raise UsageError(f"--host {host} is not a loopback address; add --allow-remote to "
                         "serve other machines (every endpoint then needs the token)")
    drain_s = flag_duration("--drain-timeout", drain_timeout)
    start_s = flag_duration("--start-timeout", start_timeout)
    hb_timeout = (flag_duration("--heartbeat-timeout", heartbeat_timeout)
                  if heartbeat_timeout is not None else 1.0 if role == "scheduler" else None)
    if role == "scheduler" and not is_loopback(host):
        from dualpath_cli.transfer.zmq_fabric import BIND_HOST_ENV

        os.environ[BIND_HOST_ENV] = host  # the control endpoint nodes send to
    from dualpath_cli.faultspec import parse_faults

    faults = parse_faults(inject or [])  # a bad SPEC fails here, before anything starts
    if detach:
        claim_port(port)
        bind_port(host, port).close()  # fail fast here rather than in the background
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
        code = local_launch.detach(argv, port, as_json, timeout=start_s + 60.0)
        raise typer.Exit(code)
    opts_args = (preset, config, list(overrides or []), pd, policy, store, engines,
                 emulated_hosts, role, hb_timeout)
    if backend == "ray":  # the scheduler runs as a Ray actor too (cli/ray_launch.py)
        from dualpath_cli.cli.ray_launch import serve_ray

        code = serve_ray(host, port, allow_remote, drain_s, start_s, opts_args, as_json,
                         list(inject or []), address, ray_labels)
        raise typer.Exit(code)
    code = local_launch.serve(host, port, allow_remote, drain_s, start_s, opts_args, as_json,
                              faults)
    raise typer.Exit(code)


