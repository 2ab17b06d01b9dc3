"""Global prefix hits of a Mooncake log, three ways: the independent count, ``trace stats``
and the simulator, and with ``--runtime`` a fourth, the runtime's own (issue 36, part 1:
within one point of the independent count).

Usage::

    python bench/trace_hits.py --log conversation_trace.jsonl --json   # a Mooncake log
    python bench/trace_hits.py --json                                  # a generated one
    python bench/trace_hits.py --log conversation_trace.jsonl --runtime --json
    python bench/trace_hits.py --runtime-requests 500 --json           # the first 500 only

The independent count walks the requests in timestamp order against one set of hash ids
(``workload.mooncake.prefix_hits``); ``trace stats`` and the simulator see the log as
``dualpath trace convert`` links it (``workload.prefix_store``'s rule; the simulator stores a
turn's blocks when its prefill ends, in simulated time). Every ratio is over the log's input
tokens. JSON keys: ``requests``, ``input_tokens``, ``independent_hit_ratio``,
``independent_cross_tokens``, ``stats_hit_ratio``, ``stats_cross_tokens``, ``sim_hit_ratio``,
``sim_cross_tokens``, ``worst_gap_points``, ``hits_within_goal`` (every gap under 1 point),
``log``, ``pd``.

The runtime (``--runtime``; ``services.hits_replay``): the embedded runtime's scheduler, with
its real prefix hashing, store lookups and lookup counters, over real sockets and a real
``PosixStore``, and emulated engines (``runtime/emulated.py``): they take their time from the
cost model, many times faster than real time, and store a finished turn's full blocks as
empty marker files at the very paths the scheduler looks up (same chained keys, same
namespace). Whether a block hits is decided by the scheduler finding its key's file, never by
the file's bytes or a turn's timing, so emulating the engines changes how long the replay
takes (minutes for the public trace, where real engines would compute 91M tokens), not what
it counts. The requests go one at a time in arrival order, each a turn of its linked
conversation carrying the token ids its block chain names, each finished (its blocks stored)
before the next is sent: the independent count's store, stored at arrival. Keys:
``runtime_requests``, ``runtime_hit_ratio`` (``runtime_hit_tokens`` over the replayed
requests' input tokens), ``runtime_cross_tokens``
(``dualpath_kv_cross_conversation_hit_tokens_total``: hits past the chain the conversation's
previous turn stored, which the scheduler's ledger remembers for its 4,096 most recent
agents, so an older conversation's own hits count as across), ``runtime_looked_tokens``,
``runtime_wall_s``; with ``--runtime-requests N`` below the log's
size the runtime replays only the first N requests in arrival order and is compared with the
independent count of that prefix (``runtime_prefix_independent_hit_ratio``,
``runtime_prefix_independent_cross_tokens``); ``worst_gap_points`` and ``hits_within_goal``
then include the runtime's gap.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dualpath_cli.services.hits_replay import runtime_store_hits
from dualpath_cli.sim import make_setup, plans_from_trajectories, simulate_offline
from dualpath_cli.workload.mooncake import MooncakeRequest, mooncake_stats
from dualpath_cli.workload.mooncake_gen import ConversationShape, generate_conversations
from dualpath_cli.workload.mooncake_link import hit_split, link_requests
from dualpath_cli.workload.stats import trace_stats
from dualpath_cli.workload.trace_io import read_mooncake


def runtime_hits(requests: list[MooncakeRequest], limit: int | None
                 ) -> tuple[dict[str, object], float]:
    """The runtime's count of the first ``limit`` requests (all: ``None``), and its gap in
    points to the independent count of those requests."""
    first = sorted(requests, key=lambda r: r.timestamp_ms)[:limit]
    truth = mooncake_stats(first)
    hit, cross = hit_split(first)

    def progress(n: int) -> None:
        if n % 1000 == 0 or n == len(first):
            print(f"runtime: {n:,}/{len(first):,} requests", file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="dualpath-hits-") as store:
        got = runtime_store_hits(requests, Path(store), limit=limit, on_request=progress)
    ratio = got.hit_tokens / truth.input_tokens
    out: dict[str, object] = {
        "runtime_requests": got.requests, "runtime_hit_ratio": round(ratio, 4),
        "runtime_hit_tokens": got.hit_tokens, "runtime_cross_tokens": got.cross_tokens,
        "runtime_looked_tokens": got.looked_tokens,
        "runtime_wall_s": got.wall_s}
    if got.requests < len(requests):  # a prefix: its own independent count
        out.update(runtime_prefix_independent_hit_ratio=round(hit / truth.input_tokens, 4),
                   runtime_prefix_independent_cross_tokens=cross)
    return out, abs(ratio - hit / truth.input_tokens) * 100


def measure(log: str | None, pd: str, seed: int, runtime: bool = False,
            runtime_requests: int | None = None) -> dict[str, object]:
    """The counts of one log (``None``: a generated one of the given seed); ``runtime``:
    with the runtime's, of its first ``runtime_requests`` requests (``None``: all)."""
    requests = (read_mooncake(log) if log else
                generate_conversations(ConversationShape(conversations=400), seed))
    truth = mooncake_stats(requests)
    hit, cross = hit_split(requests)
    trace, _ = link_requests(requests)
    trajs = trace.trajectories
    stats = trace_stats(trajs, trace.header.block_tokens)
    prompts = sum(t.prompt_length(i) for t in trajs for i in range(t.num_turns))
    res = simulate_offline(make_setup("ds660b", pd, "dualpath"),
                           plans_from_trajectories(trajs, trace.header.block_tokens))
    inputs = truth.input_tokens
    ratios = {"independent_hit_ratio": hit / inputs,
              "stats_hit_ratio": stats.hit_ratio * prompts / inputs,
              "sim_hit_ratio": res.hit_tokens / inputs}
    gap = max(abs(r - ratios["independent_hit_ratio"]) for r in ratios.values()) * 100
    extra: dict[str, object] = {}
    if runtime:
        extra, runtime_gap = runtime_hits(requests, runtime_requests)
        gap = max(gap, runtime_gap)
    return {"requests": truth.requests, "input_tokens": inputs,
            **{k: round(v, 4) for k, v in ratios.items()},
            "independent_cross_tokens": cross, "stats_cross_tokens": stats.shared_hit_tokens,
            "sim_cross_tokens": res.shared_hit_tokens, "worst_gap_points": round(gap, 2),
            "hits_within_goal": gap < 1.0, "log": Path(log).name if log else f"generated:{seed}",
            "pd": pd, **extra}


def main(argv: list[str] | None = None) -> int:
    """Measure and print a table, or with ``--json`` one object."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--log", help="a Mooncake request log (default: a generated one)")
    ap.add_argument("--pd", default="2P4D")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--runtime", action="store_true",
                    help="also count the runtime's hits (emulated engines; see the module)")
    ap.add_argument("--runtime-requests", type=int, metavar="N",
                    help="the runtime replays only the log's first N requests (implies "
                         "--runtime; compared with the independent count of those)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    if args.runtime_requests is not None and args.runtime_requests < 1:
        ap.error(f"--runtime-requests {args.runtime_requests}: need at least 1")
    out = measure(args.log, args.pd, args.seed,
                  args.runtime or args.runtime_requests is not None, args.runtime_requests)
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"{out['log']}: {out['requests']:,} requests, {out['input_tokens']:,} input tokens")
    for who in ("independent", "stats", "sim"):
        print(f"  {who:<12} {out[f'{who}_hit_ratio']:.2%}  "
              f"({out[f'{who}_cross_tokens']:,} tokens across conversations)")
    if "runtime_hit_ratio" in out:
        prefix = ("" if "runtime_prefix_independent_hit_ratio" not in out else
                  f", first {out['runtime_requests']:,} requests: independent "
                  f"{out['runtime_prefix_independent_hit_ratio']:.2%}")
        print(f"  {'runtime':<12} {out['runtime_hit_ratio']:.2%}  "
              f"({out['runtime_cross_tokens']:,} tokens across conversations{prefix})")
    print(f"  worst gap {out['worst_gap_points']} points "
          f"({'within' if out['hits_within_goal'] else 'NOT within'} 1 point)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
