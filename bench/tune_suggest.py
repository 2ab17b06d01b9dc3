"""`dualpath tune suggest` on 10 minutes of recorded 2P4D traffic (issue 14, ``suggest_s``).

Usage::

    python bench/tune_suggest.py              # a table
    python bench/tune_suggest.py --json       # one JSON object (suggest_s, ...)

The recording: 601 samples, one a second, of a 2P4D embedded cluster (the reference model
``tiny``, every node's storage NIC shaped to ``--snic``), plus the decision log of the turns
it served in those 10 minutes: agents of ``runtime.workloads.agentic_workload`` (the
``dualpath bench`` workload, 12 turns each), as many as a 2P4D cluster serves in 600 s at
the settings recorded with 64 agents in flight (Little's law on the twin's own replay of 64:
64 / mean trajectory time, x 600 s; engines sized at :data:`SIZING_COMPUTE` on 2 cores, so
every run writes the same traffic); written with ``services.recording.write_recording``, as
``dualpath record`` writes it. ``--model ds660b`` records a paper-scale 2P4D (the profile
world, the synthetic Table 2 workload at 32K) instead.

``suggest_s``: wall seconds of ``dualpath tune suggest --from FILE --json`` in a fresh
process (CLI start, reading the file, measuring this host's compute for the embedded world,
every replay of the search, each setting with its replicates for the band). Goal: under
60 s. ``suggest_cpu_s`` is the child's CPU time.
``--stories`` also writes each turn's story, as ``dualpath record`` keeps them, so the twin
first calibrates to the recording (``calibration_replays`` replays of the recorded setting,
in ``suggest_s``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dualpath_cli.runtime.workloads import agentic_workload
from dualpath_cli.services import twin
from dualpath_cli.services.recording import write_recording
from dualpath_cli.sim import twin_replay
from dualpath_cli.telemetry.recording import Sample
from dualpath_cli.telemetry.view import (
    ClusterView,
    Decision,
    DecisionCounts,
    EngineView,
    NodeView,
    SchedulerView,
    Thresholds,
)
from dualpath_cli.workload.trajectory import Trajectory

GOAL_S = 60.0
#: The engine speed the recording is sized with (an embedded engine on a quiet 2-core VM),
#: fixed so every run of the bench writes the same traffic; ``tune suggest`` itself still
#: measures this host.
SIZING_COMPUTE = {"flops": 3.3e9, "prefill_overhead_s": 0.002, "decode_step_s": 0.008}
WINDOW_S = 600
T0 = 1_796_000_000.0


def view_2p4d(at: float, model: str, snic: float, decided: int) -> ClusterView:
    """One sample of a 2P4D cluster, one engine per node."""
    roles = ("prefill",) * 2 + ("decode",) * 4
    engines = tuple(EngineView(i, r, i, i, "ready", gpu_utilization=0.7)
                    for i, r in enumerate(roles))
    nodes = tuple(NodeView(i, r, (i,), snic_utilization=0.6, snic_bandwidth_bytes_per_s=snic)
                  for i, r in enumerate(roles))
    th = Thresholds(10**9, 10**9, 1.05, 0.3, "dualpath", {"alpha": "config"})
    sched = SchedulerView("dualpath", 0, {i: 0 for i in range(2, 6)}, 0, 4, th,
                          DecisionCounts(total=decided))
    return ClusterView(at, "ready", "2P4D", model, at - T0 + 30, engines, nodes, sched)


def decisions_for(trajectories: list[Trajectory], window_s: float) -> list[Decision]:
    """The decision log of serving ``trajectories`` evenly over ``window_s``."""
    turns = sum(len(t.turns) for t in trajectories)
    out: list[Decision] = []
    step = window_s / max(1, turns)
    for t in trajectories:
        ctx = 0
        for i, turn in enumerate(t.turns):
            length = ctx + turn.append
            seq = len(out) + 1
            out.append(Decision(seq, T0 + seq * step, seq, 0, t.agent_id, i, length, ctx,
                                seq % 2, 2 + seq % 4, 2 + seq % 4, "pe", 0, 0, 0, 0))
            ctx = length + turn.gen
    return out


def workload(model: str, agents: int) -> list[Trajectory]:
    """The bench workload for the embedded model; the paper's synthetic 32K trace (Table 2
    calibrated) for a model profile."""
    if model == "tiny":
        return agentic_workload(agents)
    from dualpath_cli.workload.build import synthetic_trace

    return list(synthetic_trace(32_000, agents, 1).trajectories)


def agents_for_window(model: str, snic: float) -> int:
    """Agents a 2P4D cluster serves in :data:`WINDOW_S` with 64 in flight (module doc)."""
    probe = workload(model, 64)
    view = view_2p4d(T0, model, snic, 0)
    tr = twin.traffic_from_decisions(view, decisions_for(probe, 10.0), "probe")
    world = twin.world_for(tr, measure=lambda _m, _c: dict(SIZING_COMPUTE), host_cores=2)
    p = twin_replay.predict(tr, world, tr.current)
    return max(64, round(len(probe) * WINDOW_S / p.mean_trajectory_s))


def stories_for(decisions: list[Decision]) -> list[dict[str, Any]]:
    """A finished request's story per turn, as ``dualpath record`` keeps them (the fields
    the twin's calibration reads: arrival just before its decision, a TTFT, no decode)."""
    return [{"rid": d.rid, "agent": d.agent, "turn": d.turn, "arrival": d.at - 0.001,
             "ttft_s": 0.1, "tpot_s": None} for d in decisions]


def write(path: Path, model: str, snic: float, stories: bool = False) -> dict[str, Any]:
    agents = agents_for_window(model, snic)
    traj = workload(model, agents)
    decisions = decisions_for(traj, WINDOW_S)
    per_s = len(decisions) / WINDOW_S
    samples = [Sample(T0 + i, view_2p4d(T0 + i, model, snic, int(i * per_s)))
               for i in range(WINDOW_S + 1)]
    header = {"source": "bench/tune_suggest.py", "interval_s": 1.0, "window_s": WINDOW_S,
              "created": time.time()}
    counts = write_recording(path, header, samples, decisions,
                             stories_for(decisions) if stories else ())
    return {"agents": agents, "turns": len(decisions), "samples": counts["samples"],
            "stories": counts["outcomes"], "bytes": path.stat().st_size}


def _exe() -> str:
    path = Path(sys.executable).parent / "dualpath"
    return str(path) if path.exists() else shutil.which("dualpath") or "dualpath"


def run_suggest(path: Path, *extra: str) -> tuple[float, float, dict[str, Any]]:
    """(wall s, CPU s, the JSON answer) of one ``tune suggest --from`` process (``extra``:
    more of its flags), measuring this host's compute afresh (``--remeasure``: the twin
    otherwise keeps its first measurement). bench/twin_check.py runs the twin through this
    too."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([_exe(), "tune", "suggest", "--from", str(path), "--json",
                           "--remeasure", *extra], capture_output=True, text=True,
                          check=False)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"tune suggest failed ({proc.returncode}): {proc.stderr.strip()}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, json.loads(proc.stdout)


def bench_suggest(model: str = "tiny", snic: float = 4e6,
                  stories: bool = False) -> dict[str, Any]:
    """The ``suggest`` part: ``suggest_s`` and what the run saw (bench/tuning.py uses it)."""
    with tempfile.TemporaryDirectory(prefix="dualpath-bench-suggest-") as d:
        path = Path(d) / "2p4d-10min.jsonl.gz"
        facts = write(path, model, snic, stories)
        load0 = os.getloadavg()[0]
        wall, cpu, answer = run_suggest(path)
    best = answer["best"][0]
    return {"suggest_s": round(wall, 2), "suggest_cpu_s": round(cpu, 2),
            "suggest_goal_s": GOAL_S, "suggest_ok": wall < GOAL_S,
            "recording": {"pd": "2P4D", "model": model, "window_s": WINDOW_S, **facts},
            "settings_searched": answer["searched"], "skipped": len(answer["skipped"]),
            "replicates": answer.get("replicates"), "decision": answer.get("decision"),
            "best_jct_change": best["jct_change"], "best_command": best["command"],
            "ranked_by": answer.get("ranked_by"),
            "best_mean_trajectory_change": best.get("mean_trajectory_change"),
            "twin_wall_s": answer["wall_s"], "loadavg_1m": round(load0, 2),
            "calibration_replays": (answer["world"].get("calibration") or {}).get("rounds")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    ap.add_argument("--model", default="tiny", help="tiny (embedded) or a model profile")
    ap.add_argument("--snic", type=float, default=4e6,
                    help="storage-NIC bytes/s per node of the recorded cluster")
    ap.add_argument("--stories", action="store_true",
                    help="write each turn's story as dualpath record does, so tune suggest "
                         "calibrates to the recording first (timed in suggest_s)")
    args = ap.parse_args()
    result = bench_suggest(args.model, args.snic, args.stories)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:<22} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
