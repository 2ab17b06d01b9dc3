"""Reference-model throughput: prefill and decode tokens/s at the tiny and bench sizes.

Run: ``python bench/model.py [--profile tiny|bench|all] [--json]``. One BLAS thread, as
inside an engine process. These numbers calibrate the simulator's compute model for the
embedded runtime (see ``dualpath_cli.runtime.model.timing``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"  # before numpy loads: one BLAS thread, like an engine

from dualpath_cli.core.reference_model import MODEL_CONFIGS  # noqa: E402
from dualpath_cli.runtime.model import ReferenceModel  # noqa: E402
from dualpath_cli.runtime.model.timing import time_decode, time_prefill  # noqa: E402

# (what, new tokens, cached tokens, batch)
CASES = {
    "tiny": [("prefill", 512, 0, 1), ("prefill", 2048, 0, 1), ("prefill", 256, 4096, 1),
             ("decode", 1, 1024, 1), ("decode", 1, 4096, 1), ("decode", 1, 1024, 8)],
    "bench": [("prefill", 512, 0, 1), ("prefill", 256, 2048, 1),
              ("decode", 1, 1024, 1), ("decode", 1, 1024, 8)],
}


def run(profile: str) -> list[dict[str, object]]:
    """Time every case of ``profile``; one row per case."""
    model = ReferenceModel(MODEL_CONFIGS[profile])
    rows: list[dict[str, object]] = []
    for what, n_new, cached, batch in CASES[profile]:
        if what == "prefill":
            seconds = time_prefill(model, n_new, cached, batch=batch, repeats=2)
        else:
            seconds = time_decode(model, cached, batch=batch, steps=4, repeats=2)
        rows.append({"profile": profile, "phase": what, "new_tokens": n_new,
                     "cached_tokens": cached, "batch": batch, "seconds": round(seconds, 5),
                     "tokens_per_s": round(n_new * batch / seconds, 1)})
    return rows


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", choices=[*CASES, "all"], default="all")
    parser.add_argument("--json", action="store_true", help="print JSON lines")
    args = parser.parse_args(argv)
    profiles = list(CASES) if args.profile == "all" else [args.profile]
    if not args.json:
        print(f"{'profile':8} {'phase':8} {'new':>6} {'cached':>7} {'batch':>5} "
              f"{'seconds':>9} {'tokens/s':>10}")
    for profile in profiles:
        for row in run(profile):
            if args.json:
                print(json.dumps(row))
            else:
                print(f"{row['profile']:8} {row['phase']:8} {row['new_tokens']:>6} "
                      f"{row['cached_tokens']:>7} {row['batch']:>5} {row['seconds']:>9} "
                      f"{row['tokens_per_s']:>10}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
