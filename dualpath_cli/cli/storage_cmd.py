"""`dualpath storage`: bench, inspect, verify, gc and warm a KV block store.

Thin: parse, call dualpath_cli.storage, render, exit code. ``verify`` uses monitoring exit
codes: 0 clean, 2 corrupt blocks found (and quarantined).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar

import typer
from rich.table import Table

from dualpath_cli.cli.checks import EXIT_CRITICAL, EXIT_OK, CheckCommand, Unknown, emit_unknown
from dualpath_cli.cli.options import PortOption, TokenFileOption, UrlOption, json_option
from dualpath_cli.cli.output import emit_json, stderr, stdout
from dualpath_cli.errors import DualPathError, UsageError
from dualpath_cli.units import format_bytes, parse_bytes

if TYPE_CHECKING:
    from dualpath_cli.cli.source import ClusterRef
    from dualpath_cli.runtime.options import RuntimeOptions
    from dualpath_cli.storage import PosixStore
    from dualpath_cli.telemetry.warmup import Template

# storage/ (numpy) and rich.progress are imported inside the commands so that
# ``dualpath --help`` stays fast (tests/test_cli_import_graph.py).

#: storage.engines.ENGINES, kept here for the --engine help (a test checks they agree).
ENGINES: tuple[str, ...] = ("auto", "preadv", "io_uring")

app = typer.Typer(help="Inspect, verify, clean, benchmark and warm a KV block store.",
                  no_args_is_help=True)

_Root = Annotated[Path, typer.Argument(
    help="Store root directory (the storage.root of the config).")]
_Json = Annotated[bool, json_option("Print one JSON object instead of a table.")]


def _open(root: Path, **kwargs: object) -> PosixStore:
    """An existing store; what only reads it must not create directories in a wrong path."""
    from dualpath_cli.storage import PosixStore

    if not root.is_dir():
        raise UsageError(f"storage root {root}: not a directory")
    if not (root / "blocks").is_dir():
        raise UsageError(f"storage root {root}: not a dualpath store (no blocks/ directory)")
    return PosixStore(root, **kwargs)  # type: ignore[arg-type]


def _bench_dir(root: Path | None) -> Path | None:
    """``--root`` for bench files: an existing, writable directory (None: the temp dir)."""
    if root is None:
        return None
    if not root.is_dir():
        raise UsageError(f"--root {root}: not a directory")
    if not os.access(root, os.W_OK | os.X_OK):
        raise UsageError(f"--root {root}: not writable")
    return root


def _check_bench_sizes(sizes: list[int], total: int, depths: list[int], seconds: float,
                       where: Path | None) -> None:
    """Every sizing input of ``storage bench`` against the machine, before any file."""
    from dualpath_cli.limits import LimitError, check, check_count, check_seconds

    if not sizes:
        raise UsageError("--block-size: expected at least one size")
    for bs in sizes:
        check("block_bytes", bs, "--block-size")
    for qd in depths:
        check_count("queue_depth", qd, "--queue-depth")
    check_seconds(seconds, "--seconds")  # 0: one full pass per point
    need = sum(max(total, bs) for bs in sizes)  # one size's files at a time, but say all
    check("bench_bytes", need, "--size x block sizes")
    free = shutil.disk_usage(where or tempfile.gettempdir()).free
    if max(max(total, bs) for bs in sizes) > free:
        raise LimitError(f"--size {format_bytes(total)}: more than the "
                         f"{format_bytes(free)} free in {where or tempfile.gettempdir()}; "
                         "give a smaller --size or another --root")


def _int_list(text: str, what: str) -> list[int]:
    if len(text) > 4096 or not text.isascii():
        raise UsageError(f"{what} {text[:20]!r}...: expected integers separated by commas")
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"{what} {text!r}: expected integers separated by commas") from None
    if not values or any(v < 1 for v in values):
        raise UsageError(f"{what} {text!r}: expected positive integers")
    return values


@app.command()
def bench(
    root: Annotated[Path | None, typer.Option(
        help="Directory for the bench files (default: a temporary directory, removed "
        "after).")] = None,
    block_size: Annotated[str, typer.Option(
        help="Block file sizes, comma-separated.")] = "64KiB,1MiB,4MiB",
    queue_depth: Annotated[str, typer.Option(help="Reads in flight, comma-separated.")] = "1,8,32",
    size: Annotated[str, typer.Option(help="Bytes of block files per block size.")] = "256MiB",
    direct: Annotated[bool, typer.Option(
        "--direct", help="Read with O_DIRECT (page cache off).")] = False,
    engine: Annotated[str, typer.Option(help=f"Read engine: {', '.join(ENGINES)}.")] = "auto",
    seconds: Annotated[float, typer.Option(help="Minimum measuring time per point.")] = 0.5,
    json_out: _Json = False,
) -> None:
    """Loader throughput vs block size and queue depth (checksums verified on every read)."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from dualpath_cli.storage.benchmark import (
        DiskRequests,
        loader_gbps,
        make_dataset,
        warm_page_cache,
    )
    from dualpath_cli.termination import temp_dir

    sizes = [parse_bytes(v) for v in block_size.split(",") if v.strip()]
    depths = _int_list(queue_depth, "--queue-depth")
    total = parse_bytes(size)
    if engine not in ENGINES:
        raise UsageError(f"--engine {engine!r}: expected one of {', '.join(ENGINES)}")
    root = _bench_dir(root)
    _check_bench_sizes(sizes, total, depths, seconds, root)
    rows: list[dict[str, object]] = []
    with temp_dir(dir=root) as tmp, Progress(
            TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/"
                                                                      "{task.total}"),
            TimeElapsedColumn(), console=stderr, transient=True,
            disable=json_out) as progress:
        task = progress.add_task("storage bench", total=len(sizes) * len(depths))
        for bs in sizes:
            progress.update(task, description=f"writing {format_bytes(bs)} blocks")
            data = make_dataset(tmp / str(bs), bs, total)
            if not direct:
                warm_page_cache(data)
            disk = DiskRequests(data.root)
            for qd in depths:
                progress.update(task, description=f"{format_bytes(bs)} QD {qd}")
                before = disk.read()
                gbps, used = loader_gbps(data, qd, direct=direct, engine=engine,
                                         min_seconds=seconds)
                # O_DIRECT: the device's KiB per read request (a request smaller than the
                # block means split reads; docs/troubleshooting.md)
                kib = disk.kib_per_request(before) if direct else None
                rows.append({"mode": "direct" if direct else "page_cache", "block_size": bs,
                             "queue_depth": qd, "loader_gbps": round(gbps, 3),
                             "engine": used,
                             "request_kib": round(kib) if kib is not None else None})
                progress.advance(task)
    # the page-cache read path measured: a fallback to Python reads must be visible
    from dualpath_cli.storage.native import native_info

    native = native_info()
    if json_out:
        emit_json({"rows": rows, "page_cache_read_path": native.as_dict()})
        return
    table = Table(title="dualpath storage bench (GB/s = 1e9 bytes/s)")
    for col in ("mode", "block", "QD", "engine", "loader GB/s", "KiB/request"):
        table.add_column(col, justify="left" if col in ("mode", "block", "engine") else "right")
    for r in rows:
        table.add_row(str(r["mode"]), format_bytes(int(r["block_size"])),  # type: ignore[call-overload]
                      str(r["queue_depth"]), str(r["engine"]), f"{r['loader_gbps']:.2f}",
                      "-" if r["request_kib"] is None else str(r["request_kib"]))
    stdout.print(table)
    stdout.print(f"page-cache read path: {native.status}", highlight=False)
    if not native.available or not native.digests:
        stderr.print("warning: the native read path is not in use; page-cache reads and "
                     "checksums run in Python (slower)", highlight=False)


@app.command()
def inspect(root: _Root, top: Annotated[int, typer.Option(
                                    help="Hottest blocks to list.")] = 10,
            json_out: _Json = False) -> None:
    """Blocks, bytes, namespaces and the hottest blocks of a store."""
    from dualpath_cli.storage.inspect import inspect_store

    report = inspect_store(_open(root), top)
    if json_out:
        emit_json(report)
        return
    stdout.print(f"root {report.root}: {report.blocks} blocks, {format_bytes(report.bytes)}"
                 + (f" of {format_bytes(report.capacity_bytes)}" if report.capacity_bytes
                    else "") + f", {report.quarantined} quarantined", highlight=False)
    table = Table(title="namespaces")
    table.add_column("namespace")
    table.add_column("blocks", justify="right")
    table.add_column("bytes", justify="right")
    for ns in report.namespaces:
        table.add_row(ns.namespace, str(ns.blocks), format_bytes(ns.bytes))
    stdout.print(table)
    if report.hottest:
        hot = Table(title="hottest blocks")
        hot.add_column("key")
        hot.add_column("reads", justify="right")
        for key, reads in report.hottest:
            hot.add_row(key, str(reads))
        stdout.print(hot)
    if report.unreadable_headers:
        stderr.print(f"{report.unreadable_headers} blocks have unreadable headers; "
                     "run `dualpath storage verify`", highlight=False)


class _VerifyCommand(CheckCommand):
    unknown_fields: ClassVar[dict[str, Any]] = {"checked": 0, "ok": 0, "corrupt": []}


@app.command(cls=_VerifyCommand)
def verify(root: _Root, json_out: _Json = False) -> None:
    """Check every block's checksums; corrupt blocks are quarantined. Exit 0 clean, 2 not.

    Exit 3 (UNKNOWN) when it cannot look: no store at ROOT, or one it cannot read."""
    from dualpath_cli.storage.inspect import verify_store

    try:
        report = verify_store(_open(root))
    except (DualPathError, OSError) as err:  # it cannot look: UNKNOWN, not "corrupt"
        message = str(err) if isinstance(err, DualPathError) else f"storage root {root}: {err}"
        if json_out:
            emit_unknown(message, root=str(root), **_VerifyCommand.unknown_fields)
        raise Unknown(message) from None
    if json_out:
        emit_json({**report.to_dict(), "severity": "CRITICAL" if report.corrupt else "OK",
                   "exit_code": EXIT_CRITICAL if report.corrupt else EXIT_OK})
    else:
        for bad in report.corrupt:
            stdout.print(f"CORRUPT {bad['key']} ({bad['reason']}): {bad['detail']}",
                         highlight=False)
        stdout.print(f"checked {report.checked} blocks: {report.ok} ok, "
                     f"{len(report.corrupt)} corrupt (quarantined)", highlight=False)
    if report.corrupt:
        raise typer.Exit(EXIT_CRITICAL)


@app.command()
def gc(
    root: _Root,
    capacity: Annotated[str | None, typer.Option(
        help="Evict least-recently-used blocks down to this size (e.g. 500GiB).")] = None,
    purge_quarantine: Annotated[bool, typer.Option(
        "--purge-quarantine", help="Also delete quarantined blocks.")] = False,
    json_out: _Json = False,
) -> None:
    """Remove stale temp files, enforce a capacity, optionally empty the quarantine."""
    limit = parse_bytes(capacity) if capacity is not None else None
    report = _open(root).gc(limit, purge_quarantine)
    if json_out:
        emit_json({"evicted_blocks": report.evicted_blocks,
                   "evicted_bytes": report.evicted_bytes, "temp_files": report.temp_files,
                   "quarantine_files": report.quarantine_files})
        return
    stdout.print(f"evicted {report.evicted_blocks} blocks ({format_bytes(report.evicted_bytes)}"
                 f"), removed {report.temp_files} temp files and {report.quarantine_files} "
                 "quarantined blocks", highlight=False)


@app.command()
def warm(
    root: Annotated[Path | None, typer.Argument(
        help="Store directory to warm offline; without it, the running cluster's engines are "
        "warmed through the API.")] = None,
    *,  # --templates is required: keyword-only, so it may follow root's default
    templates: Annotated[Path, typer.Option(
        "--templates", help="Templates file (YAML or JSON; docs/warmup.md): named prompts by "
        "tokens, text or shared.")],
    rate: Annotated[str | None, typer.Option(
        "--rate", help="The warm-up's cap per node: a share of its storage NIC or a bandwidth "
        "(200MB/s, 1Gbps). (default: 10%)")] = None,
    role: Annotated[str, typer.Option(
        "--role", help="Engines to warm (live): all, prefill or decode.")] = "all",
    cache: Annotated[str | None, typer.Option(
        "--cache", help="Offline: the DRAM cache to fill (the plan is cut to it) (default: the "
        "whole plan).")] = None,
    wait: Annotated[bool, typer.Option(
        "--wait", help="Live: wait until the engines are done, showing progress.")] = False,
    timeout: Annotated[str, typer.Option(
        "--timeout", help="Live, with --wait: give up after this long.")] = "10m",
    url: UrlOption = None,
    port: PortOption = None,
    token_file: TokenFileOption = None,
    preset: Annotated[str | None, typer.Option(
        "--preset", help="Offline: config preset (model and block size of the keys, the NIC of "
        "--rate %).")] = None,
    config: Annotated[Path | None, typer.Option(
        "-c", "--config", help="Offline: config file.")] = None,
    overrides: Annotated[list[str] | None, typer.Option(
        "--set", help="Offline: override one config key.")] = None,
    json_out: _Json = False,
) -> None:
    """Warm the loaders' DRAM caches with the KV of common prompt prefixes (cold start).

    Progressive and rate-limited: one small chunk of reads at a time at prefetch priority,
    under --rate, so serving keeps the rest of the storage NIC. Live, the engines report
    progress in GET /api/v1/storage/warm and /metrics (dualpath_storage_warm_bytes_total,
    dualpath_storage_warm_blocks_remaining; dualpath-monitor --metric warm). Offline, the
    templates' stored blocks are read and verified through a loader at the cap.
    """
    from dualpath_cli.services.warm import load_templates

    if role not in ("all", "prefill", "decode"):
        raise UsageError(f"--role {role!r}: expected all, prefill or decode")
    if root is None:
        given = {"--cache": cache, "--preset": preset, "--config": config,
                 "--set": overrides}
        used = [k for k, v in given.items() if v]
        if used:
            raise UsageError(f"{used[0]} applies to an offline warm-up (give a store "
                             "directory); a live one uses the cluster's own settings")
        from dualpath_cli.cli.source import ClusterRef

        _warm_live(templates, rate, role, wait, timeout, ClusterRef(url, port, token_file),
                   json_out)
        return
    store = _open(root)
    from dualpath_cli.config import load_config
    from dualpath_cli.core.reference_model import model_config
    from dualpath_cli.runtime.options import options_from_config

    opts = options_from_config(load_config(preset=preset, config_file=config,
                                           overrides=overrides or []))
    items = load_templates(templates, model_config(opts.model).vocab_size)
    _warm_offline(store, items, opts, rate, cache, json_out)


def _warm_offline(store: PosixStore, items: list[Template], opts: RuntimeOptions,
                  rate: str | None, cache: str | None, json_out: bool) -> None:
    from dualpath_cli.core.layout import BlockShape, Namespace
    from dualpath_cli.core.reference_model import model_config
    from dualpath_cli.services.warm import parse_rate, plan_warm, warm_store
    from dualpath_cli.storage.header import file_nbytes
    from dualpath_cli.units import format_bandwidth

    cfg = model_config(opts.model)
    shape = BlockShape(cfg.n_layers, opts.block_tokens, cfg.kv_bytes_per_token_layer)
    ns = Namespace(opts.model, "layer_major", shape, opts.codec)
    block = file_nbytes(shape.full_nbytes)
    cap = parse_rate(rate, float(opts.snic_bw or 0.0))
    plan = plan_warm(items, ns, store.contains, block,
                     parse_bytes(cache) if cache is not None else None)
    for note in plan.notes:
        stderr.print(f"note: {note}", highlight=False, soft_wrap=True)
    result = warm_store(store, plan, cap, plan.nbytes or block)
    achieved = result.bytes / result.elapsed_s if result.elapsed_s > 0 else 0.0
    if json_out:
        emit_json({"mode": "offline", "plan": plan.to_dict(), "rate_bps": cap,
                   "result": result.to_dict(), "achieved_bps": achieved})
        return
    table = Table(title=f"warm-up of {store.root}: {len(plan.keys)} blocks "
                  f"({format_bytes(plan.nbytes)}) at most {format_bandwidth(cap)}",
                  title_justify="left")
    for col in ("template", "tokens", "blocks", "stored", "shared"):
        table.add_column(col, justify="left" if col == "template" else "right")
    for t in plan.templates:
        table.add_row(t.name, f"{t.tokens:,}", str(t.blocks), str(t.stored), str(t.shared))
    stdout.print(table)
    stdout.print(f"{result.read} blocks read ({format_bytes(result.bytes)}), {result.cached} "
                 f"already cached, {result.missing} missing, in {result.elapsed_s:.2f} s "
                 f"({format_bandwidth(achieved)}, cap {format_bandwidth(cap)})",
                 highlight=False, soft_wrap=True)


def _warm_live(path: Path, rate: str | None, role: str, wait: bool, timeout: str,
               ref: ClusterRef, json_out: bool) -> None:
    import time

    from dualpath_cli.cli.source import connect, resolve
    from dualpath_cli.services.warm import load_templates
    from dualpath_cli.telemetry.warmup import WarmPlanSummary, WarmProgress
    from dualpath_cli.units import format_bandwidth, parse_duration

    limit = parse_duration(timeout)
    items = load_templates(path)  # refused here, in one line, before the cluster is asked
    resolve(ref).require_token("storage warm")
    with connect(ref, timeout=30.0) as client:
        started = client.warm(items, rate=rate, role=role)
        plan = started.plan or WarmPlanSummary()
        if not json_out:
            for note in plan.notes:
                stderr.print(f"note: {note}", highlight=False, soft_wrap=True)
            stderr.print(f"warming {plan.blocks} blocks ({format_bytes(plan.bytes)}) on "
                         f"{len(started.engines or ())} engines at most "
                         f"{format_bandwidth(started.rate_bps or 0.0)} per node",
                         highlight=False, soft_wrap=True)
        status = started
        if wait:
            deadline = time.monotonic() + limit
            while True:
                status = client.warm_status()
                progress = status.progress or WarmProgress()
                if progress.done:
                    break
                if time.monotonic() >= deadline:
                    raise UsageError(f"the warm-up is still running after {timeout} "
                                     f"({progress.blocks_remaining} blocks to go); "
                                     "GET /api/v1/storage/warm follows it")
                if not json_out:
                    stderr.print(f"  {progress.blocks_remaining} blocks to go, "
                                 f"{format_bytes(progress.bytes)} read", highlight=False)
                _pause(0.5)
    if json_out:
        emit_json({"mode": "live", **started.to_dict(),
                   **({"status": status} if wait else {})})
    elif wait:
        progress = status.progress or WarmProgress()
        stdout.print(f"warm-up done: {format_bytes(progress.bytes)} read into the "
                     "engines' DRAM caches", highlight=False)


def _pause(seconds: float) -> None:
    """Pause between progress polls (an interruptible wait, not a busy loop)."""
    import threading

    threading.Event().wait(seconds)
