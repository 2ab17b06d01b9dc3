"""Reproduce the paper's tables and figures with the simulator; write docs/reproduction.md.

Usage::

    python bench/reproduce.py            # human summary, writes docs/reproduction.md
    python bench/reproduce.py --json     # one JSON object: {"targets": [{name, paper, ours, ok}]}
    python bench/reproduce.py --quick    # smaller agent counts and shorter online runs
    python bench/reproduce.py --full     # Table 3 at the paper's 48P96D / 48K agents
    python bench/reproduce.py --ds-kv-bytes 656   # what-if KV size; prints, never writes

Every number comes from the same models and calibration (dualpath_cli/core/calibration.py);
nothing is tuned per table. Agent counts are scaled down where the paper's are expensive,
and the report says so next to each row.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dualpath_cli.core.profiles import MODEL_PROFILES
from dualpath_cli.sim import (
    AgentPlan,
    SimResult,
    make_setup,
    simulate_capacity,
    simulate_offline,
    simulate_online,
    synthetic_plans,
)

ROOT = Path(__file__).resolve().parent.parent
REPORT = ROOT / "docs" / "reproduction.md"
MAXLEN = 64_000


NOTES = """\
## What is modelled

* **Per node** one storage NIC whose read bandwidth is fair-shared by the node's engines (one
  outstanding read per engine, FIFO behind it), reads land in the node's DRAM buffer (80 GB;
  a read waits while the buffer is full). Writes (per-block persistence during decode) use
  the NIC's other direction and never delay reads. DRAM bandwidth is accounted, not queued
  on: every KV byte through a node's DRAM (storage reads in, copies out to HBM or a PE, the
  prompt KV a DE buffers, persisted blocks) is counted, and results report the busiest
  node's share of its 500 GB/s (`dram_util`, and `dram_peak` in its busiest 5 s). DS 660B
  2P4D with 2,048 agents peaks at 45% under DualPath (22% under Basic), so DRAM, like the
  paper's bandwidth analysis says, is not what limits these runs.
* **Per GPU** a compute NIC where model collectives keep 30% busy and KV gets the rest
  (`cnic_model_share`); KV copies into HBM (loopback H2D) and PE-to-DE transfers go through
  it, as FIFO servers per direction (not contended across GPUs: the paper's bottleneck-free
  analysis says these links are not the bottleneck in the P/D ratios run here).
* **Prefill**: FLOPs of core/profiles.py (linear + attention over the cached context, DSA
  top-k capped, + DSA's lightning indexer over every cached token) at peak x MFU; batches
  packed by core's compute-quota packer (300 ms); layerwise prefill takes first-layer load +
  layers x max(load, compute); Basic loads the whole batch's KV into HBM first (load +
  compute) and is limited by PE HBM.
* **Decode**: memory-bound step = weights per GPU / HBM bandwidth (the hardware profile's) +
  per-layer EP collective latency + attended KV / HBM bandwidth; a fluid batch model updated
  on every join/leave. DE HBM is reserved (prompt + generated tokens) from DE assignment to
  the end of decode, as the embedded runtime's scheduler counts it (its DEs take the blocks
  at decode start, but the scheduler never places more than they hold). The paper allocates
  at decode start, once the DE buffer holds the prompt's KV (its section 3.4), and does not
  say how placement accounts for turns not yet decoding; an experiment that reserves
  nothing at placement (it checks the HBM free now; a turn whose HBM is short at decode
  start waits in the DE buffer) moved 2,048-agent JCTs by +7% (Basic), -2% (DualPath) and
  -5% (oracle): not the cause of any miss below, so the simulator stays with the runtime.
* **Scheduling** is core/ unchanged: `pe_fetch` (alpha 3 s of reads, beta 5 s of work in
  prompt tokens per second, core's `prompt_tokens_per_s` at the workload's mean turn),
  `de_route` + `de_place` (Z = 1.05), `read_plan` with the policy's read rule,
  `pack_batch` for the quota. Groups are nodes and fetch on a 50 ms period while work waits.

## Why some numbers miss

* **Table 1, DeepSeek-V3.2.** core's FLOP model now includes DSA's lightning indexer, which
  scores *every* earlier token, uncapped by top-k (2 x 64 heads x 128 dims = 16,384 FLOPs
  per attended token per layer). KV stays at 788 B/token/layer (656 B latent + ~132 B
  indexer key, the brief's estimate); with the 656 B latent alone the ratios would be about
  17% lower. We keep the documented estimate rather than the value that fits this table, so
  the rows above are reported as they come out: 14.4 / 25.5 / 41.6 GB/PFLOP at 16K / 32.7K /
  64K against the paper's 13 / ~22 / 36, i.e. 11-16% high, just outside the 10% band (it was
  28-84% high before the indexer term). With 656 B they would be 12.0 / 21.2 / 34.6. Qwen's
  rows (dense, no indexer) are unchanged and within 2%. The whole report with 656 B
  (`python bench/reproduce.py --ds-kv-bytes 656`, which never writes this file) meets 14 of
  23: the three rows above pass, but the speedup over Basic stays at 2.22 / 2.29 and the DS
  660B capacity gain drops to 1.58; the KV size is not what separates our offline ratios
  from the paper's, so we keep the complete 788 B (the indexer keys must be loaded too).
* **+ layerwise prefill (-17% in the paper).** In our Basic the storage reads are pipelined
  into the PE's DRAM buffer, so Basic is bound by the two PE storage NICs; layerwise prefill
  only hides the HBM copy on the PE, which is not the bottleneck, hence about -5%. The
  paper's larger gain suggests its Basic also loses read/compute overlap (e.g. loading a
  batch's KV synchronously before computing it), which we do not assume.
* **Speedup over Basic (2.2-2.3x vs 1.87x), the last ablation step and split/oracle.**
  The offline JCT is the finish of the *last* trajectory, and here that is always a copy of
  the trace's longest base trajectory: 1,078 turns of about 60 tokens, 6.9x the mean of 157
  (4 of the 2,048 agents). Its finish is a critical path of 1,079 queued turns: 5.75 s per
  turn under Basic, 2.6 s under DualPath, 2.14 s in the oracle. The typical trajectory does
  not look like that: on the same runs the *mean* trajectory time is 1.97x shorter with
  DualPath than with Basic (inside the paper's 1.7-2.0 band) and DualPath's mean is within
  1.07 of the oracle's (the paper's "close to Oracle"), where the JCTs give 2.21x and 1.215
  (rows "same runs, mean trajectory time" above), and by mean trajectory time the ablation's
  last two steps come out at -39.3% and -47.7% against the paper's -38.19% and -45.62%
  (by JCT -43.8% and -54.0%). Five trace seeds agree (JCT speedup
  2.21-2.29, mean-time speedup 1.93-1.98, DualPath/oracle JCT 1.19-1.22). How long the
  longest trajectories are is not in the paper: Table 2 gives means only, and our
  generator's turn counts are log-normal on a fixed quantile grid (p99 656, max 1,078 at
  64K for every seed), an assumption the JCT ratio depends on and no table can check. We do
  not cut that tail to fit the ratio. Absolute times: our DualPath at 2P4D / 2,048 agents
  takes 2,810 s, 11% below the paper's Table 3 figure for that setting (3,167 s); a paper
  Basic at 1.87x of 3,167 s would take about 5,900 s, ours takes 6,200 s. Side experiments
  with a decode step fixed at the paper's 39 ms and MFU 0.3 still gave 2.10x and 2.07x.
  (The Figure 7 pixel reading of 5,365 s for DualPath at 2,048 agents disagrees with
  Table 3's 3,167 s; we compare with Table 3.) The split read does no better than DualPath:
  late in the run, when contexts are longest, the storage NICs of all six nodes run at line
  rate, so no read rule gets the longest trajectories' turns within 1.05x of the oracle's.
  Queue orders that favour those trajectories were tried and not kept: serving the PE,
  read and prefill queues by most turns done, or by fewest appended tokens (long
  trajectories have short turns), changed DualPath's JCT by -2% and -6% and the oracle's by
  +10% and -0.4% (2,048 agents); early in the run every turn waits about 10 s in the
  prefill engines' queues, in the oracle too, whatever the order.
* **SNIC Max/Avg** is now measured as the paper describes it: "across all SNICs of three
  machines in a small time window", leaving out underloaded phases ("tail phases are not
  shown, because the system is underloaded then"). The graded rows use three machines (DS
  27B 1P2D, a configuration of the paper's own DS 27B P/D sweep) and average max/avg over the
  5 s bins in which the SNICs together ran at >= 50% of line rate (`sim/metrics.py`,
  `LOADED_UTIL`); the DS 660B 2P4D row beside them uses the same metric on six machines.
  Round robin comes out at 1.50 on both: it sends half of the reads to the PE side, so
  with twice as many DE nodes as PE nodes a PE node reads 1.5x the average, which is the
  paper's 1.53. The earlier metric averaged the first half of the run, which in our offline
  runs is the *lightly* loaded half (contexts grow turn by turn, so storage demand peaks
  late; see the time series from `dualpath sim run --plot`) and gave 1.80 / 1.83 there.
  Ties of the shorter-queue rule still go to the PE side (core/read_side.py says why).
* **Online TTFT/TTST at 0.4 APS** are 5-8x below Table 3 because 0.4 APS is less than half
  our DualPath capacity (0.91 APS), where the paper runs near its capacity. TPOT, which comes
  from the decode roofline, is within 20%. The **DS 27B capacity gain** (2.08x against 1.67x)
  misses for the same reason as the offline ratio: our DS 27B prefill is cheap, so the
  storage path decides even more.
* **Table 3 at full scale** (`--full` grades it; the default run grades 8P16D). Measured with
  `nice -n 19 python bench/sim_speed.py --pd 48P96D --agents 49152 --json` and the same with
  `--pd 2P4D --agents 2048` (DS 660B, DualPath, 64K trace, seed 1: what `--full` runs): JCT
  2,760 s against 2,811 s, a ratio of 0.982, inside the 2% band but 2.9 points below the
  paper's 3,201 / 3,167 = 1.011. With 2,000 agents per 2P4D unit (`--agents 48000` against
  `--agents 2000`) it is 2,708 s against 2,764 s, 0.980, just outside (2.04%). The scaled
  8P16D rows agree (8,192 agents: 0.988; 8,000 against 2,000: 0.983). The workload per unit
  is the same at every count (157.9 turns and 5.29M cached tokens read per agent; the
  1,079-turn agents finish last and set the JCT), so the simulator itself gets about 2%
  faster per unit as groups multiply. We think it is pooling, not the storage side: more PE
  and DE groups drain one queue (each fetching every 50 ms) with less waiting, as in any
  multi-server queue. The oracle (no I/O) gains even more, 2,271 s at 2P4D / 2,000 against
  2,114 s at 8P16D / 8,000 (0.931, PE utilisation 0.77 -> 0.82), and the gap is there by
  mid-run (its median agent finishes 4% sooner), not only in the tail. What the paper's
  real 1,152-GPU run pays and we do not model (scheduler and network latency growing with
  scale, stragglers) would explain its 1.1% slowdown. (The 2,585 s / 2,685 s quoted here before
  were measured before core's FLOP model had DSA's indexer.)
* **Online capacity** depends on how long a probe runs: agents live for roughly 157 turns x
  ~6 s, so a probe shorter than a few agent lifetimes is still filling up. Probes run 30
  minutes of simulated time; the SLO test also fails a probe whose oldest waiting turn is
  older than 4 s (a growing backlog). Probes end as the paper's runs do: when the mean TTFT
  of the last 150 s passes 4 s (a miss) or at steady state (within 5% of 30 minutes
  before); this ends failing probes sooner and changed none of the capacities above.
"""


@dataclass
class Target:
    """One paper number beside ours."""

    name: str
    paper: float | str
    ours: float | str
    ok: bool | None
    note: str = ""
    section: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The JSON form."""
        return {"name": self.name, "paper": self.paper, "ours": self.ours, "ok": self.ok,
                "note": self.note}


def _within(ours: float, paper: float, rel: float) -> bool:
    return abs(ours - paper) <= rel * abs(paper)


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class Runner:
    """Caches offline runs so a (model, pd, policy, agents) is simulated once."""

    def __init__(self) -> None:
        self.plans: dict[tuple[int, int], list[AgentPlan]] = {}
        self.runs: dict[tuple[str, str, str, int], SimResult] = {}

    def offline(self, model: str, pd: str, policy: str, agents: int) -> SimResult:
        key = (model, pd, policy, agents)
        if key not in self.runs:
            pk = (MAXLEN, agents)
            if pk not in self.plans:
                self.plans[pk] = synthetic_plans(MAXLEN, agents, 1)
            t0 = time.perf_counter()
            self.runs[key] = simulate_offline(make_setup(model, pd, policy), self.plans[pk])
            r = self.runs[key]
            _log(f"  {model} {pd} {policy:9s} {agents:6d} agents: JCT {r.jct:8.0f} s "
                 f"({r.turns} turns, {time.perf_counter() - t0:.1f} s wall)")
        return self.runs[key]


def table1() -> list[Target]:
    """Cache-compute ratio, GB of KV per PFLOP of prefill, append 429 (paper Table 1)."""
    out = []

    def ratio(name: str, ctx: int) -> float:
        m = MODEL_PROFILES[name]
        return ctx * m.kv_bytes_per_token / 1e9 / (m.prefill_flops(ctx, 429) / 1e15)

    for name, label, lo, hi in (("ds660b", "DeepSeek-V3.2 660B", 13, 36),
                                ("qwen32b", "Qwen2.5-32B", 117, 267)):
        for ctx, paper in ((16_384, lo), (65_536, hi)):
            ours = ratio(name, ctx)
            out.append(Target(f"table1 {label} @{ctx // 1024}K GB/PFLOP", paper,
                              round(ours, 1), _within(ours, paper, 0.10), section="table1"))
    ours = ratio("ds660b", 32_721)
    out.append(Target("table1 DeepSeek-V3.2 @32.7K GB/PFLOP (text: ~22)", 22, round(ours, 1),
                      _within(ours, 22, 0.10), section="table1"))
    return out


def offline(run: Runner, quick: bool) -> list[Target]:
    out = []
    counts = (512, 1024) if quick else (2048, 4096)
    for n in counts:
        b = run.offline("ds660b", "2P4D", "basic", n).jct
        d = run.offline("ds660b", "2P4D", "dualpath", n).jct
        s = b / d
        out.append(Target(f"offline DS660B 2P4D 64K speedup over basic, {n} agents", 1.87,
                          round(s, 2), 1.7 <= s <= 2.0,
                          note="paper agents 2048/4096" if quick else "", section="offline"))
    n = counts[0]
    basic, dual = (run.offline("ds660b", "2P4D", p, n) for p in ("basic", "dualpath"))
    oracle = run.offline("ds660b", "2P4D", "oracle", n)
    o, d = oracle.jct, dual.jct
    sp = run.offline("ds660b", "2P4D", "split", n).jct
    mean = "mean_trajectory_s"
    out.append(Target(f"same runs, mean trajectory time: basic / DualPath, {n} agents", "-",
                      round(basic.extra[mean] / dual.extra[mean], 2), None,
                      note="not in the paper (it reports JCT); see why the JCT ratio misses",
                      section="offline"))
    out.append(Target(f"DualPath JCT / oracle JCT, {n} agents", "close to 1",
                      round(d / o, 3), None, section="offline"))
    out.append(Target(f"DualPath / oracle mean trajectory time, {n} agents", "-",
                      round(dual.extra[mean] / oracle.extra[mean], 3), None,
                      section="offline"))
    out.append(Target(f"beyond paper: split read JCT / oracle, {n} agents (goal <= 1.05)",
                      "-", round(sp / o, 3), sp / o <= 1.05, section="beyond"))
    return out


def ablation(run: Runner, quick: bool) -> list[Target]:
    counts = (512, 1024) if quick else (1024, 2048)
    steps = (("layerwise", "+ layerwise prefill", -17.21),
             ("round-robin", "+ dual-path loading (round robin)", -38.19),
             ("dualpath", "+ scheduling algorithm", -45.62))
    out = []

    def change(policy: str, metric: Callable[[SimResult], float]) -> float:
        """Mean over ``counts`` of the % change of ``metric`` against basic."""
        vals = [100.0 * (metric(run.offline("ds660b", "2P4D", policy, n))
                         / metric(run.offline("ds660b", "2P4D", "basic", n)) - 1)
                for n in counts]
        return sum(vals) / len(vals)

    for policy, label, paper in steps:
        ours = change(policy, lambda r: r.jct)
        out.append(Target(f"ablation {label}: JCT change vs basic (%)", paper, round(ours, 1),
                          abs(ours - paper) <= 6.0,
                          note=f"agents {counts[0]}/{counts[1]}", section="ablation"))
    means = [change(p, lambda r: r.extra["mean_trajectory_s"]) for p, _, _ in steps]
    out.append(Target("ablation by mean trajectory time: the three steps (%)",
                      " / ".join(f"{p:g}" for _, _, p in steps),
                      " / ".join(f"{m:.1f}" for m in means), None,
                      note="not in the paper (it reports JCT)", section="ablation"))
    return out


def pd_sweep(run: Runner, quick: bool) -> list[Target]:
    n = 512 if quick else 1024
    j = {(pd, p): run.offline("ds27b", pd, p, n).jct
         for pd in ("1P1D", "2P1D", "1P2D") for p in ("basic", "dualpath")}
    pairs = (("basic 1P1D ~ basic 1P2D", ("1P1D", "basic"), ("1P2D", "basic")),
             ("DualPath 1P1D ~ basic 2P1D", ("1P1D", "dualpath"), ("2P1D", "basic")),
             ("DualPath 2P1D ~ DualPath 1P2D", ("2P1D", "dualpath"), ("1P2D", "dualpath")))
    out = []
    for label, a, b in pairs:
        r = j[a] / j[b]
        out.append(Target(f"P/D equivalence DS27B 64K {n} agents: {label} (JCT ratio)", 1.0,
                          round(r, 3), abs(r - 1) <= 0.10, section="pd"))
    best = max(j[(pd, "basic")] / j[(pd, "dualpath")] for pd in ("1P1D", "2P1D", "1P2D"))
    out.append(Target(f"P/D sweep DS27B best speedup over basic, {n} agents", 2.46,
                      round(best, 2), None, note="paper: up to 2.46x, average 1.64x",
                      section="pd"))
    return out


def balance(run: Runner, quick: bool) -> list[Target]:
    """Storage-NIC Max/Avg (paper Figure 13: "all SNICs of three machines").

    Graded on a three-machine deployment, DS 27B 1P2D (a configuration of the paper's DS 27B
    P/D sweep), where the storage path is the bottleneck; DS 660B 2P4D (six machines, the
    offline default) is reported beside it, ungraded.
    """
    n = 512 if quick else 1024
    three = {p: run.offline("ds27b", "1P2D", p, n).snic_max_avg
             for p in ("round-robin", "dualpath", "split")}
    six_n = 1024 if quick else 2048
    six = {p: run.offline("ds660b", "2P4D", p, six_n).snic_max_avg
           for p in ("round-robin", "dualpath", "split")}
    note3 = (f"DS27B 1P2D (3 machines), {n} agents; max/avg of bytes read per 5 s bin over "
             "the 3 SNICs, bins with the SNICs >= 50% busy")
    note6 = f"DS660B 2P4D (6 machines), {six_n} agents; same metric; not graded"
    rr, dp, sp = three["round-robin"], three["dualpath"], three["split"]
    return [
        Target("SNIC Max/Avg, round robin", 1.53, round(rr, 2), _within(rr, 1.53, 0.15),
               note=note3, section="balance"),
        Target("SNIC Max/Avg, DualPath (<= 1.2)", 1.18, round(dp, 2), dp <= 1.2, note=note3,
               section="balance"),
        Target("beyond paper: SNIC Max/Avg, split read (goal <= 1.10)", "-", round(sp, 2),
               sp <= 1.10, note=note3, section="beyond"),
        Target("SNIC Max/Avg at 2P4D: round robin / DualPath / split", "1.53 / 1.18 / -",
               f"{six['round-robin']:.2f} / {six['dualpath']:.2f} / {six['split']:.2f}", None,
               note=note6, section="balance"),
    ]


def online(quick: bool) -> list[Target]:
    horizon = 1200.0 if quick else 1800.0
    steps = 3 if quick else 5
    out = []
    caps = {}
    for model, pd, paper in (("ds660b", "2P4D", 2.25), ("ds27b", "1P1D", 1.67)):
        for policy in ("basic", "dualpath"):
            t0 = time.perf_counter()
            c = simulate_capacity(make_setup(model, pd, policy), lo=0.05, hi=1.5,
                                  horizon=horizon, steps=steps)
            caps[(model, policy)] = c.aps
            _log(f"  capacity {model} {pd} {policy}: {c.aps:.3f} APS "
                 f"({time.perf_counter() - t0:.0f} s wall)")
        b, d = caps[(model, "basic")], caps[(model, "dualpath")]
        gain = d / b if b > 0 else float("inf")
        out.append(Target(f"online capacity gain {model} {pd} (APS under SLO)", paper,
                          round(gain, 2), _within(gain, paper, 0.15),
                          note=f"basic {b:.3f} APS, DualPath {d:.3f} APS; horizon "
                               f"{horizon:.0f} s, {steps} bisection steps",
                          section="online"))
    res = simulate_online(make_setup("ds660b", "2P4D", "dualpath"), 0.4, horizon=horizon)
    for label, paper, stat in (("TTFT", 1.739, res.ttft), ("TTST", 0.228, res.ttst),
                               ("TPOT", 0.039, res.tpot)):
        ours = stat.mean if stat else float("nan")
        out.append(Target(f"Table 3 online 2P4D 0.4 APS mean {label} (s)", paper,
                          round(ours, 3), _within(ours, paper, 0.25),
                          note="informational; 25% band", section="online"))
    return out


def table3(run: Runner, full: bool) -> list[Target]:
    small = run.offline("ds660b", "2P4D", "dualpath", 2048).jct
    big_pd, big_n = ("48P96D", 49_152) if full else ("8P16D", 8192)
    big = run.offline("ds660b", big_pd, "dualpath", big_n).jct
    r = big / small
    return [Target(f"Table 3 offline JCT {big_pd}/{big_n} agents over 2P4D/2048",
                   round(3201 / 3167, 3),
                   round(r, 3), abs(r - 1) <= 0.02,
                   note="" if full else "scaled: 8P16D/8192 agents instead of 48P96D/48K (49,152) "
                                        "(use --full)", section="table3")]


def render(targets: list[Target], wall: float, args: argparse.Namespace) -> str:
    lines = ["# Reproduction report", "",
             "Generated by `python bench/reproduce.py"
             + (" --quick" if args.quick else "") + (" --full" if args.full else "")
             + f"` in {wall / 60:.1f} minutes of one core. Paper numbers are from",
             "shared/reference/dualpath-paper.md (figure readings marked [R] there).",
             "Every run uses the same model, hardware and calibration "
             "(`dualpath_cli/core/calibration.py`); no constant is tuned to a table.", "",
             "| target | paper | ours | ok | note |", "|---|---|---|---|---|"]
    for t in targets:
        ok = "-" if t.ok is None else ("yes" if t.ok else "**no**")
        lines.append(f"| {t.name} | {t.paper} | {t.ours} | {ok} | {t.note} |")
    hit = sum(1 for t in targets if t.ok)
    graded = sum(1 for t in targets if t.ok is not None)
    lines += ["", f"**{hit} of {graded} graded targets met.**", ""]
    lines.append(NOTES)
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    """Run every experiment, print targets, write the report."""
    ap = argparse.ArgumentParser(description="Reproduce the DualPath paper's numbers.")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--quick", action="store_true", help="smaller runs (minutes less)")
    ap.add_argument("--full", action="store_true", help="Table 3 at 48P96D / 48K agents")
    ap.add_argument("--no-online", action="store_true", help="skip capacity searches")
    ap.add_argument("--no-write", action="store_true", help="do not write the report")
    ap.add_argument("--ds-kv-bytes", type=int, metavar="B",
                    help="what-if: KV bytes per token per layer of the DeepSeek profiles "
                         "(theirs: 788); such a run never writes the report")
    args = ap.parse_args(argv)
    if args.ds_kv_bytes is not None:
        if args.ds_kv_bytes < 1:
            ap.error(f"--ds-kv-bytes must be at least 1, got {args.ds_kv_bytes}")
        for name in ("ds660b", "ds27b"):  # every lookup by name (make_setup, table1) sees it
            MODEL_PROFILES[name] = replace(MODEL_PROFILES[name],
                                           kv_bytes_per_token_layer=args.ds_kv_bytes)
        args.no_write = True
    t0 = time.perf_counter()
    run = Runner()
    steps: list[tuple[str, Callable[[], list[Target]]]] = [
        ("table 1", table1),
        ("offline", lambda: offline(run, args.quick)),
        ("ablation", lambda: ablation(run, args.quick)),
        ("load balance", lambda: balance(run, args.quick)),
        ("P/D sweep", lambda: pd_sweep(run, args.quick)),
        ("table 3", lambda: table3(run, args.full)),
    ]
    if not args.no_online:
        steps.append(("online", lambda: online(args.quick)))
    targets: list[Target] = []
    for label, fn in steps:
        _log(f"{label} ...")
        targets.extend(fn())
    wall = time.perf_counter() - t0
    if not args.no_write:
        REPORT.write_text(render(targets, wall, args))
    if args.json:
        print(json.dumps({"targets": [t.to_dict() for t in targets], "wall_s": round(wall, 1)}))
    else:
        for t in targets:
            mark = "-" if t.ok is None else ("ok " if t.ok else "MISS")
            print(f"{mark:4s} {t.name}: paper {t.paper}, ours {t.ours} {t.note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
