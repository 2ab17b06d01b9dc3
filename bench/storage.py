#!/usr/bin/env python3
"""Storage loader vs fio on the same block files, and shaping accuracy.

Usage::

    python bench/storage.py            # table
    python bench/storage.py --json     # {"rows": [...], "shaping": [...]}
    python bench/storage.py --blocks-kib 1024 --queue-depths 1 --modes page_cache   # one point

For each block size (64 KiB, 1 MiB, 4 MiB) it writes one data set of block files whose
files are exactly that size (4 KiB header + payload), then for page-cache and O_DIRECT
reads at queue depth 1, 8 and 32 it runs, interleaved (fio, loader, fio, ...) ``--rounds``
times, and reports each one's median round (the host is shared, so single runs are noisy;
interleaving exposes both to the same load, and all get the same treatment):

* the StorageLoader (engine ``auto``; both checksums verified on every read), driven like an
  engine: tickets of about 8 MiB (a cached prefix), held until all their blocks landed,
  with enough tickets outstanding for the queue depth (``ticket_layout``);
* fio laid out like the loader (``fio_gbps``, apples to apples): as many threads
  (``numjobs``) as the loader has readers, each with the reader's reads in flight, and the
  loader's engine (``psync`` for its preadv readers, ``io_uring`` for its io_uring rings);
* fio as one thread with an io_uring ring of the whole queue depth (``fio_single_job_gbps``);
* page cache only: the **verified-read ceiling** (``verified_ceiling_gbps``): the loader's
  threads and checksum strategy with nothing else, i.e. native batch reads plus xxh3-64 of
  every payload and no Python per block. fio copies and verifies nothing; this is what any
  reader that verifies every block can reach on the host, so ``ceiling_ratio`` bounds the
  loader/fio ratio from above.

In each round the three runs take turns going first (fio 1 job, loader, matched fio; then
loader, matched, 1 job; then matched, 1 job, loader): on this VM's virtio disk an O_DIRECT
run's rate depends on the run before it (measured, 4 MiB at QD 1: back-to-back runs of one
fio command alternate between ~3 and ~1.3 GB/s; the loader after fio ran at 1.38-1.64 GB/s,
after itself at 2.85-3.07), so a fixed order would favour one position.

``ratio`` is the loader's median over fio's median; ``ratio_paired`` the median over rounds
of the loader's rate over the same round's matched fio (the disk's rate also drifts by 2x
over tens of seconds); ``per_round`` has every run. O_DIRECT rows also carry
``request_kib``: the device's average KiB per read request for matched fio and the loader
(a read whose buffer pages are scattered over more than the device's segment limit goes out
as two requests).

O_DIRECT points run ``--direct-rounds`` rounds (default 7): the disk's rate swings by up to
2x between one-second runs, so more rounds are needed for a stable median.

Both fio runs read whole files (bs = file size), opening and closing each file per read as
the loader does. Then it shapes the loader to 100 MB/s .. 2 GB/s and measures the delivered
rate (when 1 MiB blocks are among those measured). fio is installed from Debian when missing.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dualpath_cli.storage.benchmark import (
    DiskRequests,
    fio_available,
    fio_gbps,
    loader_run,
    make_dataset,
    shaped_mbps,
    verified_ceiling_gbps,
    warm_page_cache,
)
from dualpath_cli.storage.native import native_status
from dualpath_cli.telemetry.hostload import FOREIGN_WARN_CORES, ForeignCpu, cpu_priority

BLOCK_SIZES = (64 << 10, 1 << 20, 4 << 20)
QUEUE_DEPTHS = (1, 8, 32)
SHAPING_MBPS = (100, 250, 500, 1000, 2000)
# per round, who goes first: fio as one job ("single"), the loader, fio laid out like the
# loader ("matched", which needs the loader's layout, so the loader precedes it in round 1)
_ORDERS = (("single", "loader", "matched"), ("loader", "matched", "single"),
           ("matched", "single", "loader"))


def ensure_fio() -> None:
    """Install fio from Debian when it is missing (needs root, as in CI)."""
    if fio_available():
        return
    print("fio not found: apt-get install -y fio", file=sys.stderr)
    subprocess.run(["apt-get", "install", "-y", "-qq", "fio"], check=False,
                   stdout=subprocess.DEVNULL)
    if not fio_available():
        subprocess.run(["apt-get", "update", "-qq"], check=False, stdout=subprocess.DEVNULL)
        subprocess.run(["apt-get", "install", "-y", "-qq", "fio"], check=True,
                       stdout=subprocess.DEVNULL)


def _num(value: object) -> str:
    """A table cell: two decimals, or '-' for a missing number."""
    return f"{float(value):.2f}" if isinstance(value, (int, float)) else "-"


def _ints(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _modes(text: str) -> list[str]:
    modes = [part.strip() for part in text.split(",") if part.strip()]
    bad = [m for m in modes if m not in ("page_cache", "direct")]
    if not modes or bad:
        raise argparse.ArgumentTypeError(f"modes are page_cache and direct, got {text!r}")
    return modes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--dir", type=Path, default=None, help="where to write the files")
    parser.add_argument("--size-mib", type=int, default=256, help="MiB per block size")
    parser.add_argument("--rounds", type=int, default=3,
                        help="interleaved rounds per point (medians are reported)")
    parser.add_argument("--direct-rounds", type=int, default=7,
                        help="rounds for O_DIRECT points (the disk's rate swings run to run)")
    parser.add_argument("--seconds", type=float, default=0.6, help="seconds per measurement")
    parser.add_argument("--blocks-kib", type=_ints, default=[b >> 10 for b in BLOCK_SIZES],
                        help="block sizes to measure, comma-separated KiB (default 64,1024,4096)")
    parser.add_argument("--queue-depths", type=_ints, default=list(QUEUE_DEPTHS),
                        help="queue depths to measure, comma-separated (default 1,8,32)")
    parser.add_argument("--modes", type=_modes, default=["page_cache", "direct"],
                        help="page_cache, direct or both, comma-separated (default both)")
    parser.add_argument("--no-boost", action="store_true",
                        help="do not raise this session's autogroup priority while measuring")
    args = parser.parse_args()
    ensure_fio()
    with cpu_priority(not args.no_boost) as boosted:
        return run(args, boosted)


def run(args: argparse.Namespace, boosted: bool) -> int:
    """Measure every point and print the table (or the JSON object)."""
    started = time.perf_counter()
    rows: list[dict[str, object]] = []
    shaping: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="dualpath-bench-") as tmp:
        for bs in [kib << 10 for kib in args.blocks_kib]:
            data = make_dataset(Path(tmp) / f"bs{bs}", bs, args.size_mib << 20)
            disk = DiskRequests(data.root)
            warm_page_cache(data)
            for mode in args.modes:
                direct = mode == "direct"
                for qd in args.queue_depths:
                    fios: list[float] = []
                    singles: list[float] = []
                    loaders: list[float] = []
                    ceilings: list[float] = []
                    request_kib: dict[str, list[float]] = {}  # O_DIRECT: KiB per request
                    engine, layout = "", ("", 0, 0)
                    rounds = args.rounds if not direct else max(args.rounds, args.direct_rounds)
                    meter = ForeignCpu()
                    meter.start()
                    for turn in range(rounds):
                        # the three runs take turns going first (S L M, L M S, M S L, ...):
                        # O_DIRECT rates here depend on the run before (see the docstring),
                        # so no one keeps a position
                        for what in _ORDERS[turn % len(_ORDERS)]:
                            before = disk.read()
                            if what == "single":
                                singles.append(fio_gbps(data, qd, direct=direct,
                                                        min_seconds=args.seconds))
                            elif what == "loader":
                                run = loader_run(data, qd, direct=direct,
                                                 min_seconds=args.seconds)
                                loaders.append(run.gbps)
                                engine, layout = run.engine, run.fio_layout
                            else:
                                ioengine, numjobs, iodepth = layout
                                fios.append(fio_gbps(data, iodepth, direct=direct,
                                                     min_seconds=args.seconds,
                                                     ioengine=ioengine, numjobs=numjobs))
                            if direct:
                                kib = disk.kib_per_request(before)
                                if kib is not None:
                                    request_kib.setdefault(what, []).append(kib)
                        if not direct:
                            ceiling = verified_ceiling_gbps(data, run.workers, overlap=run.overlap,
                                                            min_seconds=args.seconds)
                            if ceiling is not None:
                                ceilings.append(ceiling)
                    foreign = meter.stop()
                    fio_med = statistics.median(fios)
                    single_med = statistics.median(singles)
                    loader_med = statistics.median(loaders)
                    ceiling_med = statistics.median(ceilings) if ceilings else None
                    rows.append({"mode": mode, "block_size": bs, "queue_depth": qd,
                                 "fio_gbps": round(fio_med, 3),
                                 "loader_gbps": round(loader_med, 3),
                                 "loader_engine": engine,
                                 "fio_layout": f"{layout[0]} {layout[1]}x{layout[2]}",
                                 "fio_single_job_gbps": round(single_med, 3),
                                 "ratio": round(loader_med / fio_med, 3) if fio_med else None,
                                 "ratio_single_job": (round(loader_med / single_med, 3)
                                                      if single_med else None),
                                 "rounds": rounds,
                                 "foreign_cores": (round(foreign, 2) if foreign is not None
                                                   else None),
                                 # loader over matched fio of the same round: the disk's
                                 # rate drifts (O_DIRECT), and a round's runs share it
                                 "ratio_paired": (round(statistics.median(
                                     lo / fi for lo, fi in zip(loaders, fios, strict=True)), 3)
                                                  if min(fios) > 0 else None),
                                 "per_round": {"fio_gbps": [round(v, 3) for v in fios],
                                               "loader_gbps": [round(v, 3) for v in loaders],
                                               "fio_single_job_gbps":
                                                   [round(v, 3) for v in singles]},
                                 # O_DIRECT: the device's average KiB per read request
                                 # (median over rounds) for fio laid out like the loader
                                 # and for the loader
                                 "request_kib": ({who: round(statistics.median(request_kib[key]))
                                                  for who, key in (("fio", "matched"),
                                                                   ("loader", "loader"))
                                                  if request_kib.get(key)} or None),
                                 "verified_ceiling_gbps": (round(ceiling_med, 3)
                                                           if ceiling_med else None),
                                 "ceiling_ratio": (round(ceiling_med / fio_med, 3)
                                                   if ceiling_med and fio_med else None)})
                    if not args.json:
                        print(f"  {mode:10s} {bs >> 10:5d} KiB QD{qd:<3d} fio {fio_med:6.2f} "
                              f"(1 job {single_med:6.2f}) loader {loader_med:6.2f} GB/s "
                              f"({engine})", file=sys.stderr)
            if bs == 1 << 20:
                for target in SHAPING_MBPS:
                    measured = shaped_mbps(data, target * 1e6, seconds=1.0)
                    shaping.append({"target_mbps": target, "measured_mbps": round(measured, 1),
                                    "error": round(measured / target - 1, 4)})
            shutil.rmtree(data.root, ignore_errors=True)
    elapsed = time.perf_counter() - started
    foreigns = [float(r["foreign_cores"]) for r in rows  # type: ignore[arg-type]
                if r["foreign_cores"] is not None]
    worst = round(max(foreigns), 2) if foreigns else None
    if args.json:
        print(json.dumps({"rows": rows, "shaping": shaping, "seconds": round(elapsed, 1),
                          "page_cache_read_path": native_status(),
                          "isolation": {"boosted": boosted, "max_foreign_cores": worst}}))
        return 0
    print(f"{'mode':10s} {'block':>7s} {'QD':>3s} {'fio layout':>14s} {'fio GB/s':>9s} "
          f"{'loader GB/s':>12s} {'ratio':>6s} {'paired':>6s} {'fio 1 job':>10s} {'ratio':>6s} "
          f"{'ceiling':>8s} {'ratio':>6s}  engine")
    for r in rows:
        ratio = f"{r['ratio']:.2f}" if r["ratio"] is not None else "-"
        ratio1 = f"{r['ratio_single_job']:.2f}" if r["ratio_single_job"] is not None else "-"
        print(f"{r['mode']:10s} {int(r['block_size']) >> 10:5d}Ki {r['queue_depth']:>3} "  # type: ignore[call-overload]
              f"{r['fio_layout']:>14s} {r['fio_gbps']:>9.2f} {r['loader_gbps']:>12.2f} "
              f"{ratio:>6s} {_num(r['ratio_paired']):>6s} {r['fio_single_job_gbps']:>10.2f} "
              f"{ratio1:>6s} "
              f"{_num(r['verified_ceiling_gbps']):>8s} {_num(r['ceiling_ratio']):>6s}  "
              f"{r['loader_engine']}")
    print(f"\n{'target MB/s':>11s} {'measured MB/s':>14s} {'error':>7s}")
    for s in shaping:
        print(f"{s['target_mbps']:>11} {s['measured_mbps']:>14.1f} {float(s['error']):>+7.1%}")  # type: ignore[arg-type]
    print(f"\npage-cache read path: {native_status()}  ({elapsed:.0f} s)")
    print(f"session priority boosted: {boosted}; other processes' CPU, worst point: "
          f"{worst if worst is not None else '-'} cores")
    if worst is not None and worst > FOREIGN_WARN_CORES:
        print(f"warning: other processes used up to {worst} cores during a point; "
              "the ratios are not from a quiet host", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
