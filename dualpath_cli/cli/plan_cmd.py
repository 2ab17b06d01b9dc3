"""`dualpath plan`: capacity planning from the paper's bottleneck-free analysis.

``pd-ratio`` evaluates equation (9) for a node type (and a concrete xPyD with ``--pd``);
``working-set`` estimates the KV bytes alive at once. The maths lives in core/capacity.py.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Annotated, Any

import typer
from rich.table import Table

from dualpath_cli.cli.options import JsonOption
from dualpath_cli.cli.output import emit_json, stdout
from dualpath_cli.core.capacity import (
    PDRange,
    link_loads,
    pd_ratio_range,
    storage_ratio,
    working_set_bytes,
    working_set_tokens,
)
from dualpath_cli.core.profiles import get_hardware_profile, get_model_profile
from dualpath_cli.errors import UsageError
from dualpath_cli.units import (
    format_bandwidth,
    format_bytes,
    format_duration,
    format_tokens,
    parse_bandwidth,
    parse_bytes,
    parse_duration,
    parse_tokens,
)

__all__ = ["app", "ratio_text"]

app = typer.Typer(help="Plan deployments: bottleneck-free P/D ratios and KV working sets.",
                  no_args_is_help=True)


def ratio_text(value: float) -> str:
    """A ratio as a short fraction when it is one (1/7, 7/2), else 3 significant digits."""
    if value == float("inf"):
        return "inf"
    fraction = Fraction(value).limit_denominator(64)
    if abs(float(fraction) - value) <= 1e-9 * max(1.0, abs(value)):
        return str(fraction)
    return f"{value:.3g}"


def _bandwidth(value: str | None, fallback: float) -> float:
    return parse_bandwidth(value) if value is not None else fallback


@app.command("pd-ratio")
def pd_ratio(
    gpus_per_node: Annotated[int | None, typer.Option(
        "--gpus-per-node", help="GPUs per node, g (default: from --hardware).")] = None,
    snics_per_node: Annotated[int | None, typer.Option(
        "--snics-per-node", help="Storage NICs per node (default: from --hardware).")] = None,
    nic_bandwidth: Annotated[str | None, typer.Option(
        "--nic-bandwidth", help="Compute-NIC bandwidth per GPU, B, e.g. 400Gbps; also the "
        "storage-NIC bandwidth unless --snic-bandwidth is given (default: from "
        "--hardware).")] = None,
    snic_bandwidth: Annotated[str | None, typer.Option(
        "--snic-bandwidth", help="Bandwidth of one storage NIC (default: --nic-bandwidth, else "
        "from --hardware).")] = None,
    dram_bandwidth: Annotated[str | None, typer.Option(
        "--dram-bandwidth", help="DRAM bandwidth per node, M, e.g. 500GB/s (default: from "
        "--hardware).")] = None,
    hardware: Annotated[str, typer.Option(
        "--hardware", help="Hardware profile supplying every fact not given.")] = "hopper",
    pd: Annotated[str | None, typer.Option(
        "--pd", help="A deployment such as 2P4D: report whether it is inside the range and its "
        "per-link loads.")] = None,
    as_json: JsonOption = False,
) -> None:
    """The bottleneck-free P/D range (the paper's equation 9) for one node type."""
    from dualpath_cli.config.model import parse_pd  # config/ loads yaml: only when needed

    node = get_hardware_profile(hardware)
    g = gpus_per_node if gpus_per_node is not None else node.gpus_per_node
    snics = snics_per_node if snics_per_node is not None else node.snics_per_node
    cnic = _bandwidth(nic_bandwidth, node.cnic_bandwidth)
    snic = (parse_bandwidth(snic_bandwidth) if snic_bandwidth is not None
            else cnic if nic_bandwidth is not None else node.snic_bandwidth)
    dram = _bandwidth(dram_bandwidth, node.dram_bandwidth)
    s = storage_ratio(snics, snic, cnic)
    bounds = pd_ratio_range(g, s, cnic, dram)
    payload: dict[str, Any] = bounds.to_dict()
    payload["inputs"].update({"snics_per_node": snics, "snic_bytes_per_s": snic,
                              "hardware": node.name})
    spec = parse_pd(pd) if pd is not None else None
    if spec is not None:
        links = link_loads(spec.prefill_nodes, spec.decode_nodes, g, s, cnic, dram)
        payload.update({"pd": str(spec), "ratio": spec.ratio,
                        "inside": bounds.contains(spec.ratio),
                        "links": [link.to_dict() for link in links]})
    if as_json:
        emit_json(payload)
        return
    _render_range(bounds)
    if spec is not None:
        _render_links(payload)


def _render_range(bounds: PDRange) -> None:
    stdout.print(f"g = {bounds.gpus_per_node} GPUs/node, s = {bounds.storage_ratio:.4g}, "
                 f"B = {format_bandwidth(bounds.cnic_bandwidth, bits=True)}, "
                 f"Bs = {format_bandwidth(bounds.cnic_bandwidth * bounds.storage_ratio)}, "
                 f"M = {format_bandwidth(bounds.dram_bandwidth)}", highlight=False)
    table = Table(title="equation (9): s/(g-s) <= P/D <= min{(g-2s)/s, (g-s)/(2s), "
                  "(M/(Bs)-3)/2}", title_justify="left")
    for column in ("side", "link", "constraints", "formula", "P/D bound"):
        table.add_column(column)
    lower = bounds.lower
    table.add_row("lower", lower.name, lower.constraints, lower.formula, ratio_text(lower.value))
    for bound in bounds.upper:
        mark = " (binding)" if bound is bounds.binding_upper else ""
        table.add_row("upper", bound.name, bound.constraints, bound.formula,
                      ratio_text(bound.value) + mark)
    stdout.print(table)
    if bounds.feasible:
        stdout.print(f"bottleneck-free range: {ratio_text(bounds.min_ratio)} "
                     f"({bounds.min_ratio:.4g}) <= P/D <= {ratio_text(bounds.max_ratio)} "
                     f"({bounds.max_ratio:.4g})", highlight=False)
    else:
        stdout.print("no P/D ratio is bottleneck-free for this node type", highlight=False)
    stdout.print(f"check (1), PE CNIC read 2s <= g (the paper writes s <= g): "
                 f"{'ok' if bounds.pe_cnic_read_ok else 'VIOLATED'}", highlight=False)
    stdout.print(f"check PE DRAM 2sB <= M: {'ok' if bounds.pe_dram_ok else 'VIOLATED'}",
                 highlight=False)


def _render_links(payload: dict[str, Any]) -> None:
    table = Table(title=f"{payload['pd']} (P/D = {ratio_text(payload['ratio'])}): per-link "
                  "load with every storage NIC saturated", title_justify="left")
    for column in ("link", "constraints", "labels", "load", "capacity", "use", "ok"):
        table.add_column(column)
    for link in payload["links"]:
        table.add_row(link["name"], link["constraints"], link["labels"],
                      format_bandwidth(link["load_bytes_per_s"]),
                      format_bandwidth(link["capacity_bytes_per_s"]),
                      f"{link['utilization']:.0%}", "yes" if link["ok"] else "NO")
    stdout.print(table)
    verdict = "inside" if payload["inside"] else "OUTSIDE"
    stdout.print(f"{payload['pd']} is {verdict} the bottleneck-free range", highlight=False)


@app.command("working-set")
def working_set(
    aps: Annotated[float, typer.Option(
        "--aps", help="New agent trajectories per second (lambda).")],
    jct: Annotated[str, typer.Option("--jct", help="Mean job completion time, e.g. 3000s or 50m.")],
    total_len: Annotated[str, typer.Option(
        "--total-len", help="Mean final context length of a trajectory, e.g. 56K.")],
    bytes_per_token: Annotated[str | None, typer.Option(
        "--bytes-per-token", help="KV bytes per token over all layers, e.g. 48068.")] = None,
    model: Annotated[str | None, typer.Option(
        "--model", help="Model profile giving KV bytes per token (e.g. ds660b).")] = None,
    as_json: JsonOption = False,
) -> None:
    """The KV working set: aps x JCT x total length / 2, in tokens and bytes."""
    if (bytes_per_token is None) == (model is None):
        raise UsageError("plan working-set: give exactly one of --bytes-per-token or --model")
    if bytes_per_token is not None:
        bpt, source = parse_bytes(bytes_per_token), "--bytes-per-token"
    else:
        assert model is not None
        bpt, source = get_model_profile(model).kv_bytes_per_token, f"model {model}"
    seconds, length = parse_duration(jct), parse_tokens(total_len)
    tokens = working_set_tokens(aps, seconds, length)
    amount = working_set_bytes(aps, seconds, length, bpt)
    if as_json:
        emit_json({"working_set_bytes": amount, "working_set_tokens": tokens,
                   "live_trajectories": aps * seconds,
                   "inputs": {"aps": aps, "jct_s": seconds, "total_len_tokens": length,
                              "bytes_per_token": bpt, "bytes_per_token_source": source}})
        return
    table = Table(title="KV working set = aps x JCT x total length / 2", show_header=False,
                  title_justify="left")
    table.add_column("quantity", style="bold")
    table.add_column("value")
    table.add_row("live trajectories", f"{aps:g}/s x {format_duration(seconds)} = "
                                       f"{aps * seconds:,.4g} (Little's law)")
    table.add_row("mean live length", f"{format_tokens(length)} / 2 = "
                                      f"{format_tokens(length / 2)} tokens")
    table.add_row("tokens", f"{tokens:,.0f} ({format_tokens(tokens)})")
    table.add_row("KV per token", f"{bpt:,} bytes ({source})")
    table.add_row("working set", f"{format_bytes(amount, binary=False)} "
                                 f"({format_bytes(amount)}, {amount:,.0f} bytes)")
    stdout.print(table)
