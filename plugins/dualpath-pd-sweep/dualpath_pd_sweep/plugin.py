"""The plugin entry point: ``dualpath sweep pd`` (commands hook) and the ``de-first`` read-path
policy (policies hook).

Only typer and the hook marker are imported at module level: ``dualpath --help`` loads every
plugin to list its commands, so the sweep, the policy and rich come in when used."""

from __future__ import annotations

from typing import Any

import typer

from dualpath_cli.plugins import PolicySpec, hookimpl

__all__ = ["sweep_app", "dualpath_register_commands", "dualpath_register_policies"]

sweep_app = typer.Typer(help="Sweep deployments (plugin dualpath-pd-sweep).", no_args_is_help=True)


@sweep_app.command("pd")
def pd(
    nodes: int = typer.Option(..., "--nodes", help="Total node budget to split into xPyD."),
    gpus_per_node: int | None = typer.Option(
        None, "--gpus-per-node", help="GPUs per node, g (default: from --hardware)."),
    snics_per_node: int | None = typer.Option(
        None, "--snics-per-node", help="Storage NICs per node (default: from --hardware)."),
    nic_bandwidth: str | None = typer.Option(
        None, "--nic-bandwidth", help="Compute-NIC bandwidth per GPU, B (also the storage-NIC "
        "bandwidth) (default: from --hardware)."),
    dram_bandwidth: str | None = typer.Option(
        None, "--dram-bandwidth", help="DRAM bandwidth per node, M (default: from --hardware)."),
    hardware: str = typer.Option(
        "hopper", "--hardware", help="Hardware profile supplying every fact not given."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Every xPyD split of --nodes: inside the bottleneck-free range or not, busiest link."""
    from rich.table import Table

    from dualpath_cli.cli.output import emit_json, stdout
    from dualpath_cli.core.capacity import storage_ratio
    from dualpath_cli.core.profiles import HARDWARE_PROFILES
    from dualpath_cli.errors import UsageError
    from dualpath_cli.units import format_bandwidth, parse_bandwidth
    from dualpath_pd_sweep.sweep import sweep_pd

    if hardware not in HARDWARE_PROFILES:
        raise UsageError(f"unknown hardware profile {hardware!r}: choose one of "
                         f"{', '.join(HARDWARE_PROFILES)}")
    node = HARDWARE_PROFILES[hardware]
    g = gpus_per_node if gpus_per_node is not None else node.gpus_per_node
    snics = snics_per_node if snics_per_node is not None else node.snics_per_node
    cnic = parse_bandwidth(nic_bandwidth) if nic_bandwidth is not None else node.cnic_bandwidth
    snic = cnic if nic_bandwidth is not None else node.snic_bandwidth
    dram = (parse_bandwidth(dram_bandwidth) if dram_bandwidth is not None
            else node.dram_bandwidth)
    bounds, rows = sweep_pd(nodes, g, storage_ratio(snics, snic, cnic), cnic, dram)
    if as_json:
        emit_json({"nodes": nodes, "min_ratio": bounds.min_ratio,
                   "max_ratio": bounds.max_ratio, "rows": [row.to_dict() for row in rows]})
        return
    table = Table(title=f"{nodes} nodes of g={g}, B={format_bandwidth(cnic, bits=True)}, "
                  f"M={format_bandwidth(dram)}: bottleneck-free for "
                  f"{bounds.min_ratio:.4g} <= P/D <= {bounds.max_ratio:.4g}",
                  title_justify="left")
    for column in ("deployment", "P/D", "bottleneck-free", "busiest link", "its use"):
        table.add_column(column)
    for row in rows:
        table.add_row(row.pd, f"{row.ratio:.3g}", "yes" if row.inside else "no",
                      row.busiest_link, f"{row.busiest_utilization:.0%}")
    stdout.print(table)


@hookimpl
def dualpath_register_commands(app: Any) -> None:
    """Add the ``sweep`` group to the dualpath command line."""
    app.add_typer(sweep_app, name="sweep")


@hookimpl
def dualpath_register_policies() -> list[PolicySpec]:
    """The ``de-first`` read-path policy (selectable by ``--policy de-first``)."""
    from dualpath_pd_sweep.policy import DE_FIRST

    return [PolicySpec(DE_FIRST.name, "read-path", lambda: DE_FIRST, DE_FIRST.description)]
