"""Global prefix hits of a Mooncake log, three ways: the independent count, ``trace stats``
and the simulator (issue 36, part 1: within one point of the independent count).

Usage::

    python bench/trace_hits.py --log conversation_trace.jsonl --json   # a Mooncake log
    python bench/trace_hits.py --json                                  # a generated one

The independent count walks the requests in timestamp order against one set of hash ids
(``workload.mooncake.prefix_hits``); ``trace stats`` and the simulator see the log as
``dualpath trace convert`` links it (``workload.prefix_store``'s rule; the simulator stores a
turn's blocks when its prefill ends, in simulated time). Every ratio is over the log's input
tokens. JSON keys: ``requests``, ``input_tokens``, ``independent_hit_ratio``,
``independent_cross_tokens``, ``stats_hit_ratio``, ``stats_cross_tokens``, ``sim_hit_ratio``,
``sim_cross_tokens``, ``worst_gap_points``, ``hits_within_goal`` (every gap under 1 point),
``log``, ``pd``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dualpath_cli.sim import make_setup, plans_from_trajectories, simulate_offline
from dualpath_cli.workload.mooncake import mooncake_stats
from dualpath_cli.workload.mooncake_gen import ConversationShape, generate_conversations
from dualpath_cli.workload.mooncake_link import hit_split, link_requests
from dualpath_cli.workload.stats import trace_stats
from dualpath_cli.workload.trace_io import read_mooncake


def measure(log: str | None, pd: str, seed: int) -> dict[str, object]:
    """The three counts of one log (``None``: a generated one of the given seed)."""
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
    return {"requests": truth.requests, "input_tokens": inputs,
            **{k: round(v, 4) for k, v in ratios.items()},
            "independent_cross_tokens": cross, "stats_cross_tokens": stats.shared_hit_tokens,
            "sim_cross_tokens": res.shared_hit_tokens, "worst_gap_points": round(gap, 2),
            "hits_within_goal": gap < 1.0, "log": Path(log).name if log else f"generated:{seed}",
            "pd": pd}


def main(argv: list[str] | None = None) -> int:
    """Measure and print a table, or with ``--json`` one object."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--log", help="a Mooncake request log (default: a generated one)")
    ap.add_argument("--pd", default="2P4D")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    out = measure(args.log, args.pd, args.seed)
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"{out['log']}: {out['requests']:,} requests, {out['input_tokens']:,} input tokens")
    for who in ("independent", "stats", "sim"):
        print(f"  {who:<12} {out[f'{who}_hit_ratio']:.2%}  "
              f"({out[f'{who}_cross_tokens']:,} tokens across conversations)")
    print(f"  worst gap {out['worst_gap_points']} points "
          f"({'within' if out['hits_within_goal'] else 'NOT within'} 1 point)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
