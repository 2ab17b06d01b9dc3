"""Does the twin's suggestion hold on a real cluster? Predicted vs measured JCT change.

Usage::

    python bench/twin_check.py            # a table (a few minutes on 2 cores)
    python bench/twin_check.py --json     # one JSON object

Steps (issue 14's twin test, on the embedded runtime):

1. Launch an embedded cluster (one process per engine, ``--pd``, default 1P2D) behind the
   real HTTP API with a deliberately poor setting (``--poor``, default the read side
   ``round-robin``), its storage NICs sized as ``dualpath bench`` sizes them (Basic's storage
   time 2.5x its compute, from a probe of this host).
2. Serve the bench workload (``--agents`` x 12 turns) through ``/v1/completions`` as
   ``dualpath bench --url`` does; its JCT is the measured "before".
3. ``tune suggest`` on the cluster's own decision log (services/twin.py, as ``dualpath tune
   suggest --url`` runs it): the best setting and its predicted JCT change.
4. Apply it through ``PATCH /api/v1/scheduler`` with the token, serve the workload again (new
   token seeds, so the store holds none of its prefixes, as in run 1): the "after".
5. Repeat before/after ``--repeats`` times (rollback, run, apply, run), averaging.

Reported: ``predicted_change`` and ``measured_change`` of the JCT (after / before - 1) and
their difference in points; the goal is agreement within 15% of the measured change, i.e.
``|predicted - measured| <= 0.15 * |measured|`` (``agree``; ``agree_points`` is the looser
reading, within 15 percentage points), and each predicted JCT against the measured mean
(``before_error``, ``after_error``). The CPU other processes used during the
runs is reported (``foreign_cores``): on a shared host a run's JCT moves by that.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dualpath_cli.api.app import create_app
from dualpath_cli.api.auth import TokenAuth
from dualpath_cli.api.client import DualPathClient
from dualpath_cli.api.server import ServerThread
from dualpath_cli.runtime.options import options_from_config
from dualpath_cli.runtime.workloads import agentic_workload
from dualpath_cli.services import twin
from dualpath_cli.services.bench import load_bench_config
from dualpath_cli.services.live import LiveCluster
from dualpath_cli.services.remote_runner import run_agents_remote
from dualpath_cli.services.tuning import restore_body
from dualpath_cli.telemetry.gpu import FakeGpuBackend
from dualpath_cli.telemetry.hostload import ForeignCpu

GOAL = 0.15


def serve_once(url: str, token: str, agents: int, seed: int) -> float:
    """JCT of one run of the bench workload with fresh prefixes (``seed``)."""
    traj = agentic_workload(agents, seed=seed)
    run, _ = run_agents_remote(url, traj, token=token)
    if run.errors:
        raise SystemExit(f"run failed: {run.errors[0]}")
    return run.jct


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--pd", default="1P2D")
    ap.add_argument("--agents", type=int, default=16)
    ap.add_argument("--poor", default="read_side=round-robin",
                    help="the poor setting launched, as the runtime policy or KEY=VALUE")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    key, _, value = args.poor.partition("=")
    traj = agentic_workload(args.agents)
    loaded, _, cal = load_bench_config(traj, sets=[f"cluster.pd={args.pd}"])
    overrides: dict[str, Any] = {"processes": True}
    if key == "read_side":
        overrides["policy"] = value
    with tempfile.TemporaryDirectory(prefix="dualpath-twin-check-") as d:
        opts = options_from_config(loaded, store_dir=Path(d) / "store", **overrides)
        if key in ("alpha", "beta"):
            setattr(opts, key, int(float(value)))
        live = LiveCluster(opts)
        live.start()
        auth = TokenAuth.generate(Path(d) / "token")
        meter = ForeignCpu()
        out: dict[str, Any] = {"pd": args.pd, "agents": args.agents, "poor": args.poor,
                               "snic_bytes_per_s": opts.snic_bw}
        try:
            with ServerThread(create_app(live, auth, gpu=FakeGpuBackend(()))) as server, \
                    DualPathClient(server.url, auth.token) as client:
                meter.start()
                before = [serve_once(server.url, auth.token, args.agents, seed=1)]
                traffic = twin.traffic_from_decisions(client.view(), client.decisions(-1),
                                                      server.url)
                world = twin.world_for(traffic)
                t0 = time.perf_counter()
                res = twin.suggest(traffic, world)
                out["suggest_s"] = round(time.perf_counter() - t0, 2)
                best = res.best
                out["today"] = traffic.current.to_dict()
                out["suggested"] = best.setting.to_dict()
                out["command"] = best.setting.command(traffic.current)
                out["predicted_before_s"] = res.current.jct_s
                out["predicted_after_s"] = best.jct_s
                out["predicted_change"] = res.change(best)
                if best is res.current:
                    print("the twin keeps today's settings; nothing to apply", file=sys.stderr)
                    return 0
                patch = {k: v for k, v in best.setting.patch().items()
                         if v != traffic.current.patch()[k]}
                after: list[float] = []
                seed = 2
                for r in range(args.repeats):
                    applied = client.patch_scheduler(patch)
                    after.append(serve_once(server.url, auth.token, args.agents, seed))
                    seed += 1
                    if r + 1 < args.repeats:
                        client.patch_scheduler(restore_body(applied.old))
                        before.append(serve_once(server.url, auth.token, args.agents, seed))
                        seed += 1
                other = meter.stop()
        finally:
            live.drain(30)
    mb, ma = sum(before) / len(before), sum(after) / len(after)
    measured = ma / mb - 1
    pred = out["predicted_change"]
    out.update({"measured_before_s": before, "measured_after_s": after,
                "measured_change": measured, "difference_points": pred - measured,
                "agree": abs(pred - measured) <= GOAL * abs(measured),
                "agree_points": abs(pred - measured) <= GOAL,
                "before_error": out["predicted_before_s"] / mb - 1,
                "after_error": out["predicted_after_s"] / ma - 1,
                "foreign_cores": None if other is None else round(other, 2)})
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k:<20} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
