"""`dualpath tune`: compute the scheduler thresholds from hardware facts, and set them.

Two rules exist and both are supported (see core/thresholds.py):

* the seed's bandwidth-delay rule, alpha = storage-NIC bandwidth x latency, in bytes;
* the paper's window rule, alpha = tokens the node's storage NICs read in a window (3 s) and
  beta = prompt tokens one GPU prefills in a window (5 s), at a reference turn of --append
  new tokens after --context cached (core's ``prompt_tokens_per_s``, as config uses).

``tune set`` writes alpha, beta, the compute quota or z into a config file or changes them on
the running cluster (cli/tune_set.py); ``show``, ``rollback``, ``auto`` and ``suggest`` act on
the running cluster (cli/tune_live.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from dualpath_cli.cli import tune_live
from dualpath_cli.cli.options import JsonOption
from dualpath_cli.cli.output import emit_json, stdout
from dualpath_cli.cli.tune_set import set_thresholds
from dualpath_cli.core.profiles import (
    get_hardware_profile,
    get_model_profile,
)
from dualpath_cli.core.thresholds import (
    alpha_bytes_from_bdp,
    bytes_to_tokens,
    tokens_processable,
    tokens_readable,
)
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

if TYPE_CHECKING:
    pass

# config/ (yaml) and the simulator (numpy) are imported inside the commands so that
# ``dualpath --help`` stays fast (tests/test_cli_import_graph.py).

__all__ = ["app", "SEED_ALPHA_NOTE"]

app = typer.Typer(help="Compute the scheduler thresholds from hardware facts, and set them.",
                  no_args_is_help=True)

#: The paper's storage NIC (one 400 Gbps NIC per node), used when no bandwidth is given.
DEFAULT_SNIC = "400Gbps"

SEED_ALPHA_NOTE = ("the seed quotes alpha = 8KB for a 400Gbps storage NIC and 50us latency, "
                   "but its own rule gives 400Gbps x 50us = 2.5MB; 8KB would need a latency "
                   "of about 160ns")


def _snic(snic: str | None, hardware: str | None) -> tuple[float, str]:
    """Node storage bandwidth in bytes/s and where it came from."""
    if snic is not None:
        rate = parse_bandwidth(snic)
        if rate <= 0:  # alpha = rate x latency: a zero rate gives a zero threshold
            raise UsageError(f"--snic {snic!r}: must be greater than zero")
        return rate, "--snic"
    if hardware is not None:
        profile = get_hardware_profile(hardware)
        return profile.snic_bandwidth * profile.snics_per_node, f"hardware {profile.name}"
    return parse_bandwidth(DEFAULT_SNIC), f"default {DEFAULT_SNIC}"


def _bytes_per_token(value: str | None, model: str | None) -> tuple[int | None, str | None]:
    if value is not None:
        amount = parse_bytes(value)
        if amount <= 0:
            raise UsageError(f"invalid --bytes-per-token {value!r}: must be greater than zero")
        return amount, "--bytes-per-token"
    if model is not None:
        return get_model_profile(model).kv_bytes_per_token, f"model {model}"
    return None, None


def _render(title: str, rows: list[tuple[str, str]], notes: list[str]) -> None:
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column("quantity", style="bold")
    table.add_column("value")
    for name, value in rows:
        table.add_row(name, value)
    stdout.print(table)
    for note in notes:
        stdout.print(f"note: {note}", highlight=False, soft_wrap=True)


@app.command("alpha")
def alpha(
    latency: Annotated[str | None, typer.Option(
        "--latency", help="Expected latency, e.g. 50us: selects the seed's bandwidth-delay rule "
        "(alpha in bytes).")] = None,
    window: Annotated[str | None, typer.Option(
        "--window", help="Reading window, e.g. 3s: selects the paper's rule (alpha in tokens the "
        "storage NICs read in that time).")] = None,
    snic: Annotated[str | None, typer.Option(
        "--snic", help="Storage-NIC bandwidth of one node, e.g. 400Gbps (default: from "
        "--hardware, else 400Gbps).")] = None,
    bytes_per_token: Annotated[str | None, typer.Option(
        "--bytes-per-token", help="KV bytes per token over all layers, e.g. 48068.")] = None,
    model: Annotated[str | None, typer.Option(
        "--model", help="Model profile giving KV bytes per token (e.g. ds660b).")] = None,
    hardware: Annotated[str | None, typer.Option(
        "--hardware", help="Hardware profile giving the storage-NIC bandwidth.")] = None,
    as_json: JsonOption = False,
) -> None:
    """Alpha, the short-read-queue threshold, by the seed's rule or the paper's."""
    if (latency is None) == (window is None):
        raise UsageError("tune alpha: give exactly one of --latency (the seed's bandwidth-delay "
                         "rule, bytes) or --window (the paper's rule, tokens)")
    bandwidth, bandwidth_source = _snic(snic, hardware)
    bpt, bpt_source = _bytes_per_token(bytes_per_token, model)
    if latency is not None:
        _alpha_bdp(bandwidth, bandwidth_source, parse_duration(latency), bpt, bpt_source,
                   as_json)
    else:
        assert window is not None
        if bpt is None:
            raise UsageError("tune alpha --window: give --bytes-per-token or --model to turn "
                             "bytes read into tokens")
        _alpha_window(bandwidth, bandwidth_source, parse_duration(window), bpt,
                      bpt_source or "", as_json)


def _alpha_bdp(bandwidth: float, bandwidth_source: str, latency: float, bpt: int | None,
               bpt_source: str | None, as_json: bool) -> None:
    amount = round(alpha_bytes_from_bdp(bandwidth, latency))
    tokens = bytes_to_tokens(amount, bpt) if bpt is not None else None
    inputs: dict[str, Any] = {"snic_bytes_per_s": bandwidth, "snic_source": bandwidth_source,
                              "latency_s": latency}
    if bpt is not None:
        inputs["bytes_per_token"] = bpt
    if as_json:
        payload: dict[str, Any] = {"rule": "bandwidth-delay", "alpha_bytes": amount}
        if tokens is not None:
            payload["alpha_tokens"] = tokens
        payload["inputs"] = inputs
        payload["note"] = SEED_ALPHA_NOTE
        emit_json(payload)
        return
    rows = [
        ("rule", "seed: alpha = storage-NIC bandwidth x latency (bandwidth-delay product)"),
        ("storage NIC", f"{format_bandwidth(bandwidth, bits=True)} = "
                        f"{format_bandwidth(bandwidth)} ({bandwidth_source})"),
        ("latency", format_duration(latency)),
        ("alpha", f"{format_bandwidth(bandwidth)} x {format_duration(latency)} = "
                  f"{format_bytes(amount, binary=False)} ({amount:,} bytes)"),
    ]
    if tokens is not None and bpt is not None:
        rows.append(("alpha in tokens", f"{amount:,} B / {bpt:,} B per token = {tokens:,} "
                                        f"tokens ({bpt_source})"))
    _render("tune alpha", rows, [SEED_ALPHA_NOTE])


def _alpha_window(bandwidth: float, bandwidth_source: str, window: float, bpt: int,
                  bpt_source: str, as_json: bool) -> None:
    tokens = tokens_readable(bandwidth, bpt, window)
    if as_json:
        emit_json({"rule": "window", "alpha_tokens": tokens, "inputs": {
            "snic_bytes_per_s": bandwidth, "snic_source": bandwidth_source, "window_s": window,
            "bytes_per_token": bpt, "bytes_per_token_source": bpt_source}})
        return
    per_s = bandwidth / bpt
    _render("tune alpha", [
        ("rule", "paper: alpha = tokens the node's storage NICs read in the window"),
        ("storage NIC", f"{format_bandwidth(bandwidth, bits=True)} = "
                        f"{format_bandwidth(bandwidth)} ({bandwidth_source})"),
        ("KV per token", f"{bpt:,} bytes ({bpt_source})"),
        ("read rate", f"{format_bandwidth(bandwidth)} / {bpt:,} B = "
                      f"{format_tokens(per_s)} tokens/s"),
        ("window", format_duration(window)),
        ("alpha", f"{format_tokens(per_s)} tokens/s x {format_duration(window)} = "
                  f"{tokens:,} tokens ({format_tokens(tokens)})"),
    ], [])


@app.command("beta")
def beta(
    window: Annotated[str, typer.Option(
        "--window", help="GPU work window (the paper uses 5s).")] = "5s",
    tokens_per_s: Annotated[str | None, typer.Option(
        "--tokens-per-s", help="Prefill throughput of one GPU in tokens/s, e.g. 12K.")] = None,
    model: Annotated[str | None, typer.Option(
        "--model", help="Model profile (e.g. ds660b) to derive tokens/s from FLOPs.")] = None,
    hardware: Annotated[str, typer.Option(
        "--hardware", help="Hardware profile giving the GPU's achieved FLOP/s.")] = "hopper",
    context: Annotated[str, typer.Option(
        "--context", help="Cached context of the reference turn, for the FLOP model.")] = "32K",
    append: Annotated[str, typer.Option(
        "--append", help="New tokens of the reference turn (the paper's mean append on the 64K "
        "trace is 429).")] = "429",
    as_json: JsonOption = False,
) -> None:
    """Beta, the unfinished-token limit: tokens one GPU processes in the window."""
    seconds = parse_duration(window)
    inputs: dict[str, Any] = {"window_s": seconds}
    if tokens_per_s is not None:
        if model is not None:
            raise UsageError("tune beta: give --tokens-per-s or --model, not both")
        rate = float(parse_tokens(tokens_per_s))
        inputs.update({"tokens_per_s": rate, "source": "--tokens-per-s"})
        derivation = f"{format_tokens(rate)} tokens/s (given)"
    elif model is not None:
        profile, node = get_model_profile(model), get_hardware_profile(hardware)
        cached, new = parse_tokens(context), parse_tokens(append)
        if new < 1:
            raise UsageError(f"invalid --append {append!r}: must be at least 1 token")
        rate = node.prompt_tokens_per_s(profile, cached, new)
        inputs.update({"tokens_per_s": rate, "source": "profile", "model": profile.name,
                       "hardware": node.name, "context_tokens": cached,
                       "append_tokens": new})
        derivation = (f"({format_tokens(cached)} cached + {format_tokens(new)} new) prompt "
                      f"tokens / {node.prefill_s(profile, cached, new) * 1e3:.4g} ms to "
                      f"prefill the {format_tokens(new)} new ({profile.name}, {node.name} GPU "
                      f"{node.gpu_flops / 1e12:.4g} TFLOP/s achieved) = "
                      f"{format_tokens(rate)} prompt tokens/s")
    else:
        raise UsageError("tune beta: give --tokens-per-s, or --model (with --hardware, "
                         "--context and --append) to derive it from the FLOP model")
    tokens = tokens_processable(rate, seconds)
    if as_json:
        emit_json({"rule": "window", "beta_tokens": tokens, "inputs": inputs})
        return
    _render("tune beta", [
        ("rule", "paper: beta = tokens one GPU processes in the window"),
        ("throughput", derivation),
        ("window", format_duration(seconds)),
        ("beta", f"{format_tokens(rate)} tokens/s x {format_duration(seconds)} = "
                 f"{tokens:,} tokens ({format_tokens(tokens)})"),
    ], [])


# the other commands, in the order ``tune --help`` lists them
app.command("set")(set_thresholds)
app.command("show")(tune_live.show)
app.command("rollback")(tune_live.rollback)
app.command("auto")(tune_live.auto)
app.command("suggest")(tune_live.suggest)
