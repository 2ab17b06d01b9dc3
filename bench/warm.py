"""Warm-up under its cap (issue 14 item 7): bytes per second a warm-up reads at each cap,
and what serving keeps of a shaped storage NIC while a warm-up runs beside it.

Usage::

    python bench/warm.py                 # table
    python bench/warm.py --json          # one JSON object

Phase 1 (the cap): a POSIX store of block files in a temporary directory (page cache), one
template whose blocks are all stored; ``services.warm.warm_store`` reads them at each cap
(``--rates``) and the achieved rate is the block bytes over the warm-up's own elapsed time.
The limiter submits chunk k only once chunks 0..k-1 fit under the cap, so the achieved rate
may not exceed the cap; ``cap_ratio`` (achieved / cap) says how close it runs.

Phase 2 (serving): one loader shaped to ``--nic`` (a node's storage NIC); a serving thread
reads distinct blocks back to back for ``--seconds`` alone, then again while a warm-up at
``--share`` of the NIC runs; ``serving_kept`` is the second rate over the first (the goal:
at least 1 - share, less a measuring margin).

``--json`` keys: ``cap`` (a list: cap_bps, achieved_bps, cap_ratio, bytes, elapsed_s),
``cap_held`` (every cap_ratio <= 1.0), ``serving_alone_bps``, ``serving_with_warm_bps``,
``warm_bps``, ``serving_kept``, ``share``, ``block_bytes``, ``load`` (1-minute load average).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dualpath_cli.core.layout import BlockShape, Namespace, prefix_keys  # noqa: E402
from dualpath_cli.services.warm import plan_warm, warm_store  # noqa: E402
from dualpath_cli.storage import PosixStore, StorageLoader, encode_block  # noqa: E402
from dualpath_cli.storage.header import file_nbytes  # noqa: E402
from dualpath_cli.storage.warm import Warmer  # noqa: E402
from dualpath_cli.telemetry.registry import MetricsRegistry  # noqa: E402
from dualpath_cli.telemetry.warmup import Template  # noqa: E402
from dualpath_cli.units import format_bandwidth, parse_bandwidth  # noqa: E402

SHAPE = BlockShape(8, 64, 512)  # 256 KiB of KV per block
NS = Namespace("bench-warm", "layer_major", SHAPE, "fp16")


def _fill(store: PosixStore, tokens: list[int]) -> list:
    """Store every full block of ``tokens``; returns their keys."""
    keys = prefix_keys(tokens, NS)
    payload = np.zeros((SHAPE.n_layers, SHAPE.block_tokens, 256), dtype=np.float16)
    for i, key in enumerate(keys):
        payload.flat[0] = i
        store.put(*encode_block(key, payload, NS))
    return keys


def _cap_phase(store: PosixStore, rates: list[float], seconds: float, block: int,
               seed: int) -> list[dict[str, float]]:
    out = []
    for k, rate in enumerate(rates):
        n = max(4, int(rate * seconds // block))
        tokens = [int(x) for x in np.random.default_rng([seed, k]).integers(0, 32_000,
                                                                             n * 64)]
        _fill(store, tokens)
        plan = plan_warm([Template("t", tuple(tokens))], NS, store.contains, block)
        res = warm_store(store, plan, rate, plan.nbytes)
        achieved = res.bytes / res.elapsed_s if res.elapsed_s > 0 else 0.0
        out.append({"cap_bps": rate, "achieved_bps": achieved, "cap_ratio": achieved / rate,
                    "bytes": res.bytes, "elapsed_s": res.elapsed_s, "blocks": res.read})
    return out


def _serve(loader: StorageLoader, keys: list, stop: threading.Event) -> tuple[int, float]:
    """Read ``keys`` in batches of 8 until ``stop``; (bytes, seconds)."""
    t0 = time.monotonic()
    nbytes = 0
    i = 0
    while not stop.is_set() and i < len(keys):
        res = loader.load(keys[i:i + 8], timeout=60)
        nbytes += sum(b.header.file_nbytes for b in res.blocks if b is not None)
        res.release()
        i += 8
    return nbytes, time.monotonic() - t0


def _serving_phase(store: PosixStore, nic: float, share: float, seconds: float,
                   block: int, seed: int) -> dict[str, float]:
    need = int(nic * seconds * 1.5 // block) + 16
    rng = np.random.default_rng([seed, 99])
    serve_a = _fill(store, [int(x) for x in rng.integers(0, 32_000, need * 64)])
    serve_b = _fill(store, [int(x) for x in rng.integers(0, 32_000, need * 64)])
    warm_keys = _fill(store, [int(x) for x in rng.integers(0, 32_000, need * 64)])
    result: dict[str, float] = {}
    with StorageLoader(store, shaping_bps=nic, cache_bytes=(need + 8) * block,
                       block_nbytes=block, registry=MetricsRegistry()) as loader:
        stop = threading.Event()
        timer = threading.Timer(seconds, stop.set)
        timer.start()
        alone, t_alone = _serve(loader, serve_a, stop)
        timer.cancel()
        warmer = Warmer(loader, warm_keys, nic * share, block_nbytes=block).start()
        stop = threading.Event()
        timer = threading.Timer(seconds, stop.set)
        timer.start()
        both, t_both = _serve(loader, serve_b, stop)
        timer.cancel()
        progress = warmer.progress()
        warmer.stop()
    result["serving_alone_bps"] = alone / t_alone
    result["serving_with_warm_bps"] = both / t_both
    result["warm_bps"] = progress.bytes / progress.elapsed_s if progress.elapsed_s else 0.0
    result["serving_kept"] = result["serving_with_warm_bps"] / result["serving_alone_bps"]
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", default="25MB/s,100MB/s,400MB/s",
                    help="warm-up caps to measure, comma-separated")
    ap.add_argument("--nic", default="200MB/s", help="the shaped storage NIC of phase 2")
    ap.add_argument("--share", type=float, default=0.1, help="the warm-up's share in phase 2")
    ap.add_argument("--seconds", type=float, default=2.0, help="seconds per measurement")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    rates = [parse_bandwidth(r.strip()) for r in args.rates.split(",") if r.strip()]
    nic = parse_bandwidth(args.nic)
    block = file_nbytes(SHAPE.full_nbytes)
    with tempfile.TemporaryDirectory(prefix="dualpath-bench-warm-") as tmp:
        store = PosixStore(tmp)
        caps = _cap_phase(store, rates, args.seconds, block, args.seed)
        serving = _serving_phase(store, nic, args.share, args.seconds, block, args.seed)
    out = {"cap": caps, "cap_held": all(c["cap_ratio"] <= 1.0 for c in caps),
           **serving, "share": args.share, "nic_bps": nic, "block_bytes": block,
           "load": round(os.getloadavg()[0], 2)}
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"block files {block:,} B; 1-minute load {out['load']}")
    print(f"{'cap':>12} {'achieved':>12} {'ratio':>7} {'blocks':>7} {'seconds':>8}")
    for c in caps:
        print(f"{format_bandwidth(c['cap_bps']):>12} {format_bandwidth(c['achieved_bps']):>12} "
              f"{c['cap_ratio']:>7.3f} {int(c['blocks']):>7} {c['elapsed_s']:>8.2f}")
    print(f"serving on a {format_bandwidth(nic)} NIC: alone "
          f"{format_bandwidth(serving['serving_alone_bps'])}, beside a {args.share:.0%} warm-up "
          f"{format_bandwidth(serving['serving_with_warm_bps'])} (kept "
          f"{serving['serving_kept']:.1%}; warm-up {format_bandwidth(serving['warm_bps'])})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
