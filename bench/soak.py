"""Soak: a launched cluster serves N turns through the official ``openai`` client; does it leak?

Starts ``dualpath launch`` (a subprocess: the launcher, its engine processes, its store in a
temporary directory), then ``--sessions`` client threads, each with its own ``openai.OpenAI``
client, hold conversations of ``--session-turns`` turns (token-id prompts extended by every
reply, ``X-Session-Id`` per conversation, so later turns hit the stored prefix) until
``--turns`` turns are served. Every ``--interval`` it records the RSS and open file
descriptors of every process of the cluster (psutil), the store's size and its temp files.
The first ``--warmup`` turns (default a tenth, at least four per session) warm the caches,
rings and pools; growth is measured from the end of the warm-up to the end of the run, both
taken with no turn in flight. Then it stops the cluster (``dualpath stop``) and counts
what was left behind.

    nice -n 19 python bench/soak.py                    # 10,000 turns, a table
    nice -n 19 python bench/soak.py --turns 300 --json # the CI version (tests/test_soak.py)

The scheduler keeps its last ``scheduler.decision_ring`` decisions (and as many finished
requests' timelines in its ledger), packed: a bounded ring that grows the launcher's RSS
until it is full, by about 0.2 KB a turn at the default configuration (``scheduler.
decision_ring_bytes`` bounds it). ``--decision-ring N`` launches with that ring size (``--set
scheduler.decision_ring=N``), and the default warm-up then lasts at least N turns, so the
ring is full before growth is measured. ``--set KEY=VALUE`` passes any other config key to
``launch``.

JSON keys: ``soak_rss_growth`` (fraction, goal < 0.05), ``fd_growth`` (descriptors, goal 0),
``leftover_temp_files`` (goal 0: ``*.tmp`` in the store and files left in the launcher's
state directory after it stopped), ``turns``, ``errors``, ``seconds``, ``turns_per_s``,
``rss_mb`` and ``fds`` (at the end of the warm-up and at the end, per process),
``fd_kinds_grown`` (descriptors whose count changed, by kind: socket, pipe, store file...),
``store_bytes``, ``samples`` (the time series: ``t``, ``turns``, ``rss_mb``, ``fds``,
``store_bytes``, ``temp_files``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

__all__ = ["run_soak", "main"]

CLI = [sys.executable, "-m", "dualpath_cli.cli.app"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _family(pid: int) -> dict[int, psutil.Process]:
    """The launcher and every process under it, by pid."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return {}
    return {p.pid: p for p in procs}


def _measure(pid: int) -> tuple[dict[str, float], dict[str, int]]:
    """RSS (MiB) and open descriptors of each process of the cluster, by ``name:pid``."""
    rss: dict[str, float] = {}
    fds: dict[str, int] = {}
    for p in _family(pid).values():
        try:
            name = "launcher" if p.pid == pid else p.name()
            key = f"{name}:{p.pid}"
            rss[key] = round(p.memory_info().rss / 2**20, 2)
            fds[key] = p.num_fds()
        except psutil.NoSuchProcess:
            continue
    return rss, fds


def _fd_kinds(pid: int, store: Path) -> dict[str, int]:
    """Open descriptors of the cluster's processes by kind (what grew, when one did)."""
    kinds: dict[str, int] = {}
    for p in _family(pid).values():
        try:
            names = os.listdir(f"/proc/{p.pid}/fd")
        except OSError:
            continue
        for fd in names:
            try:
                target = os.readlink(f"/proc/{p.pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith(("socket:", "pipe:")):
                kind = target.split(":")[0]
            elif target.startswith("anon_inode:"):
                kind = target
            elif target.startswith(str(store)):
                kind = "store file"
            else:
                kind = "file " + os.path.dirname(target)
            kinds[kind] = kinds.get(kind, 0) + 1
    return kinds


def _store(root: Path) -> tuple[int, int]:
    """Bytes of the store's files and how many temp files (``*.tmp``) it holds."""
    size = temps = 0
    for dirpath, _, files in os.walk(root):
        for name in files:
            if name.endswith(".tmp"):
                temps += 1
            try:
                size += os.stat(os.path.join(dirpath, name)).st_size
            except FileNotFoundError:
                continue
    return size, temps


class _Turns:
    """A shared turn budget: threads take turns until it is spent."""

    def __init__(self, total: int) -> None:
        self.left = total
        self.done = 0
        self.errors: list[str] = []
        self.lock = threading.Lock()

    def take(self) -> bool:
        with self.lock:
            if self.left <= 0:
                return False
            self.left -= 1
            return True


def _client_thread(url: str, token: str, budget: _Turns, worker: int, seed: int,
                   session_turns: int, first: int, append: int, gen: int) -> None:
    import openai

    rng = random.Random(seed * 1000 + worker)
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=token, max_retries=0, timeout=120)
    conversation = 0
    try:
        while budget.take():
            session = f"soak-{worker}-{conversation}"
            prompt: list[int] = []
            for turn in range(session_turns):
                prompt = prompt + [rng.randrange(1, 256) for _ in range(first if turn == 0
                                                                         else append)]
                try:
                    r = client.completions.create(
                        model="tiny", prompt=prompt, max_tokens=gen,
                        extra_headers={"X-Session-Id": session},
                        extra_body={"return_token_ids": True})
                    out = list((r.choices[0].model_extra or {})["token_ids"])
                except Exception as err:  # counted, the conversation restarts
                    with budget.lock:
                        budget.errors.append(f"{type(err).__name__}: {err}"[:200])
                    break
                with budget.lock:
                    budget.done += 1
                prompt = prompt + out
                if turn + 1 < session_turns and not budget.take():
                    return
            conversation += 1
    finally:
        client.close()


def _serve(url: str, token: str, budget: _Turns, args: argparse.Namespace, seed: int) -> None:
    """Spend ``budget`` with ``--sessions`` client threads; returns when every turn is done."""
    threads = [threading.Thread(target=_client_thread, daemon=True, args=(
        url, token, budget, w, seed, args.session_turns, args.first, args.append, args.gen))
        for w in range(args.sessions)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _sets(args: argparse.Namespace) -> list[str]:
    """The ``--set`` arguments for ``launch`` (``--decision-ring`` among them)."""
    items = list(args.set or [])
    if args.decision_ring:
        items.append(f"scheduler.decision_ring={args.decision_ring}")
    return [arg for item in items for arg in ("--set", item)]


def run_soak(args: argparse.Namespace) -> dict[str, Any]:
    """Launch, serve, sample, stop; the figures (see the module docstring)."""
    # every client connection and engine-to-engine socket exists by the end of the warm-up
    # and, with --decision-ring, the scheduler's bounded ring (one decision a turn) is full
    ring = args.decision_ring or 0
    warmup = args.warmup if args.warmup is not None else max(
        1, min(args.turns // 2, max(args.turns // 10, 4 * args.sessions, ring + ring // 10)))
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="dualpath-soak-") as tmp_s:
        tmp = Path(tmp_s)
        store, run_dir = tmp / "store", tmp / "run"
        run_dir.mkdir(mode=0o700)
        env = {**os.environ, "XDG_RUNTIME_DIR": str(run_dir), "NO_COLOR": "1"}
        env.pop("DUALPATH_URL", None)
        port = _free_port()
        proc = subprocess.Popen([*CLI, "launch", "--port", str(port), "--store", str(store),
                                 "--pd", args.pd, "--policy", args.policy, "--json",
                                 *_sets(args)], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        family: dict[int, psutil.Process] = {}
        samples: list[dict[str, Any]] = []
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if not line.strip():
                raise SystemExit(f"launch failed: {proc.communicate(timeout=60)[1].strip()}")
            state = json.loads(line)
            url, token = state["url"], Path(state["token_file"]).read_text().strip()
            family = _family(proc.pid)
            warm, body = _Turns(warmup), _Turns(args.turns - warmup)
            stop = threading.Event()

            def sample() -> dict[str, Any]:
                rss, fds = _measure(proc.pid)
                size, temps = _store(store)
                return {"t": round(time.monotonic() - started, 2),
                        "turns": warm.done + body.done,
                        "rss_mb": round(sum(rss.values()), 2), "fds": sum(fds.values()),
                        "store_bytes": size, "temp_files": temps}

            def sampler() -> None:
                while not stop.wait(args.interval):
                    samples.append(sample())

            threading.Thread(target=sampler, daemon=True).start()
            _serve(url, token, warm, args, args.seed)
            rss_warm, fds_warm = _measure(proc.pid)  # no turn in flight
            kinds_warm = _fd_kinds(proc.pid, store)
            samples.append(sample())
            _serve(url, token, body, args, args.seed + 1)
            stop.set()
            rss_end, fds_end = _measure(proc.pid)
            kinds_end = _fd_kinds(proc.pid, store)
            samples.append(sample())
            store_bytes, _ = _store(store)
            stopped = subprocess.run([*CLI, "stop", "--port", str(port)], env=env,
                                     capture_output=True, text=True, timeout=120)
            proc.communicate(timeout=120)
            temps_left = _store(store)[1] if store.is_dir() else 0
            state_left = sorted(p.name for p in (run_dir / "dualpath").iterdir()) \
                if (run_dir / "dualpath").is_dir() else []
        finally:
            for p in family.values():  # nothing may outlive the soak
                try:
                    p.kill()
                except psutil.NoSuchProcess:
                    pass
            if proc.poll() is None:
                proc.kill()
                proc.communicate(timeout=30)
    turns = warm.done + body.done
    seconds = time.monotonic() - started
    growth = (sum(rss_end.values()) - sum(rss_warm.values())) / sum(rss_warm.values())
    return {
        "soak_rss_growth": round(growth, 4),
        "fd_growth": sum(fds_end.values()) - sum(fds_warm.values()),
        "leftover_temp_files": temps_left + len(state_left),
        "turns": turns, "warmup_turns": warm.done,
        "errors": len(warm.errors) + len(body.errors),
        "first_errors": (warm.errors + body.errors)[:5],
        "stop_exit": stopped.returncode,
        "seconds": round(seconds, 1), "turns_per_s": round(turns / seconds, 1),
        "rss_mb": {"warm": rss_warm, "end": rss_end}, "fds": {"warm": fds_warm, "end": fds_end},
        "fd_kinds_grown": {k: n - kinds_warm.get(k, 0) for k, n in kinds_end.items()
                           if n != kinds_warm.get(k, 0)},
        "store_bytes": store_bytes, "state_files_left": state_left, "samples": samples,
        "setup": {"pd": args.pd, "policy": args.policy, "sessions": args.sessions,
                  "decision_ring": args.decision_ring, "sets": _sets(args)[1::2],
                  "session_turns": args.session_turns, "first": args.first,
                  "append": args.append, "gen": args.gen},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=10_000, help="turns to serve")
    parser.add_argument("--warmup", type=int, default=None,
                        help="turns before growth is measured (default: a tenth)")
    parser.add_argument("--sessions", type=int, default=4, help="concurrent client threads")
    parser.add_argument("--session-turns", type=int, default=8,
                        help="turns of one conversation before a new session starts")
    parser.add_argument("--first", type=int, default=64, help="first prompt's tokens")
    parser.add_argument("--append", type=int, default=16, help="tokens each turn appends")
    parser.add_argument("--gen", type=int, default=4, help="max_tokens of each turn")
    parser.add_argument("--pd", default="1P2D", help="prefill/decode nodes")
    parser.add_argument("--policy", default="dualpath",
                        help="runtime policy (round-robin alternates the read side, so a "
                             "short warm-up opens every engine-to-engine socket)")
    parser.add_argument("--decision-ring", type=int, default=None, metavar="N",
                        help="launch with scheduler.decision_ring=N (a bounded ring; the "
                             "default warm-up then fills it first)")
    parser.add_argument("--set", action="append", metavar="KEY=VALUE",
                        help="a config key for launch (repeatable)")
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between samples")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    if args.turns < 2 or not 0 < (args.warmup or 1) < args.turns:
        parser.error("--turns must be >= 2 and --warmup between 1 and --turns - 1")
    if args.decision_ring is not None and args.decision_ring < 1:
        parser.error("--decision-ring must be >= 1")
    # SIGTERM unwinds like Ctrl-C: the cluster is stopped and the temp directory removed
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    figures = run_soak(args)
    if args.json:
        print(json.dumps(figures))
    else:
        print(f"{'decision ring':<22} {figures['setup']['decision_ring'] or 'config default'}")
        print(f"{'turns':<22} {figures['turns']} ({figures['warmup_turns']} warm-up), "
              f"{figures['errors']} errors, {figures['turns_per_s']} turns/s")
        print(f"{'RSS growth':<22} {figures['soak_rss_growth']:+.2%} "
              f"({sum(figures['rss_mb']['warm'].values()):.1f} -> "
              f"{sum(figures['rss_mb']['end'].values()):.1f} MiB, goal < 5%)")
        print(f"{'fd growth':<22} {figures['fd_growth']:+d} (goal 0)")
        print(f"{'leftover temp files':<22} {figures['leftover_temp_files']} (goal 0)")
        print(f"{'store':<22} {figures['store_bytes'] / 2**20:.1f} MiB")
        for key, warm in figures["rss_mb"]["warm"].items():
            end = figures["rss_mb"]["end"].get(key)
            print(f"  {key:<20} {warm:8.1f} -> {end if end is not None else '-':>8} MiB, "
                  f"fds {figures['fds']['warm'][key]} -> {figures['fds']['end'].get(key)}")
    ok = figures["errors"] == 0 and figures["fd_growth"] <= 0 \
        and figures["leftover_temp_files"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
