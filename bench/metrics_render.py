"""How long one scrape renders: /metrics (Prometheus text) and /api/v1/metrics (JSON).

Usage: ``python bench/metrics_render.py [--json] [--repeat 30] [--prefill-nodes 48]
[--decode-nodes 96] [--gpus 8] [--layers 4] [--no-boost]``.

The cluster is synthetic and fully populated (:func:`dualpath_cli.api.render_bench.
synthetic_view`): the paper's largest deployment, 48P96D with 8 GPUs per node, i.e. 1,152
engines, 4 layers each (the embedded runtime's reference model). ``/metrics`` is timed as a
scrape renders it: the view's gauges, every engine's registry snapshot merged by node (the
storage loader's counters, gauges and latency histograms; FLOP/s; attention bubbles), host
facts sampled by psutil and a GPU report. ``/api/v1/metrics`` is the view encoded as JSON.
Both are the functions the API calls. Engine registries reach ``/metrics`` as the frames
their heartbeats carry (dualpath_cli/telemetry/frames.py: a layout and a list of values,
msgpack'd as on the wire); the median of ``--repeat`` scrapes after one warm-up scrape is
reported, each scrape with new values in every frame and the layouts the exporter
remembered from the scrape before (a live cluster's engines, nodes and layers do not
change). The first scrape (``metrics_render_cold_ms_1152``) and the same page merged from
snapshot rows (``metrics_render_rows_ms_1152``, the form before frames) are shown beside.

Goal (issue 12): each <= 50 ms. ``--json`` prints one object with ``metrics_render_ms_1152``
(the whole page) and ``api_metrics_render_ms_1152`` (the suffix is the engine count),
``metrics_view_render_ms_1152`` (the view's families alone, no engine registry snapshots),
body sizes, ``registry_rows`` and the CPU other processes used meanwhile
(``foreign_cpu_cores``: the machine is shared).
"""

from __future__ import annotations

import argparse
import json
import sys

from dualpath_cli.api.render_bench import measure_renders, synthetic_view
from dualpath_cli.telemetry.hostload import FOREIGN_WARN_CORES, ForeignCpu, cpu_priority

GOAL_MS = 50.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--prefill-nodes", type=int, default=48)
    ap.add_argument("--decode-nodes", type=int, default=96)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--no-boost", action="store_true",
                    help="do not raise this session's CPU priority while measuring")
    args = ap.parse_args()
    if args.repeat < 1 or min(args.prefill_nodes, args.decode_nodes, args.gpus,
                              args.layers) < 1:
        print("bench/metrics_render.py: --repeat, node, GPU and layer counts must be >= 1",
              file=sys.stderr)
        return 2
    view = synthetic_view(args.prefill_nodes, args.decode_nodes, args.gpus, args.layers)
    with cpu_priority(not args.no_boost) as boosted:
        meter = ForeignCpu()
        meter.start()
        out = measure_renders(view, args.repeat)
        foreign = meter.stop()
    out.update({"pd": view.pd, "gpus_per_node": args.gpus, "layers": args.layers,
                "boosted": boosted,
                "foreign_cpu_cores": None if foreign is None else round(foreign, 3)})
    n = out["engines"]
    out["goal_ms"] = GOAL_MS
    out["ok"] = (out[f"metrics_render_ms_{n}"] <= GOAL_MS
                 and out[f"api_metrics_render_ms_{n}"] <= GOAL_MS)
    if args.json:
        print(json.dumps(out))
        return 0
    from rich.console import Console
    from rich.table import Table

    con = Console()
    t = Table(title=f"Scrape render time: {n} engines ({view.pd} x {args.gpus} GPUs, "
                    f"{args.layers} layers, {out['registry_rows']:,} engine registry rows), "
                    f"median of {args.repeat}")
    t.add_column("body")
    t.add_column("median ms", justify="right")
    t.add_column("bytes", justify="right")
    t.add_column(f"<= {GOAL_MS:g} ms", justify="center")
    t.add_column("CPU ms", justify="right")
    cpu = out["cpu_ms"]
    for label, key, size, cpu_key, goal in (
            ("/metrics (view + engine frames + host + GPU)", f"metrics_render_ms_{n}",
             "metrics_bytes", "metrics", True),
            ("/metrics, first scrape (layouts new)", f"metrics_render_cold_ms_{n}", None,
             None, False),
            ("/metrics merged from snapshot rows", f"metrics_render_rows_ms_{n}", None,
             "rows", False),
            ("/metrics, view families only", f"metrics_view_render_ms_{n}", None, "view",
             False),
            ("/api/v1/metrics (JSON)", f"api_metrics_render_ms_{n}", "api_metrics_bytes",
             "api_metrics", True)):
        ms = out[key]
        t.add_row(label, f"{ms:.1f}", f"{out[size]:,}" if size else "",
                  ("yes" if ms <= GOAL_MS else "NO") if goal else "",
                  f"{cpu[cpu_key]:.1f}" if cpu_key else "")
    con.print(t)
    if foreign is not None and foreign > FOREIGN_WARN_CORES:
        con.print(f"[yellow]other processes used {foreign:.2f} cores meanwhile: numbers are "
                  "noisy[/yellow]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
