"""The HTTP API's costs: per-completion overhead, launch-to-ready, render time, a load run.

Run: ``python bench/api.py [--duration 60] [--clients 16] [--samples 100] [--launch-runs 3]
[--json]`` (CI: ``--duration 5 --samples 20 --launch-runs 1``). Five measurements:

- ``overhead_p50_ms`` (goal <= 2 ms): the embedded default 1P2D (engine processes, a
  PosixStore in a temp dir) served by ``create_app`` on uvicorn in this process; ``samples``
  sequential non-streamed ``/v1/completions`` (64-token fresh prompt, 4 tokens) from a
  keep-alive HTTP/1.1 client in its own process (``--client http.client``, the default: the
  stdlib client, so the figure is the server's path and not a client library's own Python
  cost; ``--client httpx`` measures with httpx, about 0.5 ms more per request here). The
  cluster runs the configuration ``dualpath launch`` serves (default ``fetch_period``).
  Per completion, the client's HTTP latency minus the in-process path of that very turn
  (from the server's call to ``LiveCluster.submit`` until a thread waiting on the ticket
  wakes). ``http_p50_ms`` and ``in_process_p50_ms`` (fresh prompts of the same shape
  submitted directly, interleaved) are reported beside it as a cross-check.
- ``stream_first_chunk_ratio`` (goal <= 0.3): on the same embedded 1P2D, sequential
  streamed ``/v1/completions`` (64-token fresh prompt, ``max_tokens`` 64) read by a
  keep-alive httpx client in this process: the time to the first chunk with text over the
  time to ``[DONE]``, the median over ``--stream-samples`` (a client's time to first token
  against its whole wait: 1.0 when the text came in one piece at the end).
  ``stream_ttft_ratio`` beside it is its floor: the turn's own time to first token (the
  scheduler's, mostly the wait for the engines' next ``fetch``) over the same wait.
- ``ready_s`` (goal <= 5 s): bench/launch.py's launch-to-``/readyz`` of ``dualpath launch``,
  median over ``--launch-runs`` fresh launches.
- ``metrics_render_ms_1152`` (goal <= 50 ms each): the api's render benchmark
  (``dualpath_cli.api.render_bench.measure_renders``) for 48P96D x 8 engines, with
  ``api_metrics_render_ms_1152`` for the JSON view.
- ``errors`` (goal 0): ``--clients`` official ``openai`` clients (no retries) against a
  ``dualpath launch`` process for ``--duration`` seconds, each an agent: chat or token-id
  completions in one session, every turn extending the last (a new session every 8 turns);
  completions per second and generated tokens per second are reported.

The machine may be shared: like the other benches this raises the session's autogroup CPU
priority while measuring (``--no-boost`` to not) and reports the cores other processes kept
busy (``foreign_cpu_cores``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

from dualpath_cli.api.listen import free_port


def _launch_config() -> Any:
    """The configuration `dualpath launch` serves: the defaults with the launcher's own
    (its 5 ms fetch period, cli/launcher.py LAUNCH_DEFAULTS), as a launched cluster runs."""
    from dualpath_cli.cli.launcher import LAUNCH_DEFAULTS
    from dualpath_cli.config import load_config

    return load_config(overrides=[f"{k}={v}" for k, v in LAUNCH_DEFAULTS.items()])


GOALS = {"overhead_p50_ms": 2.0, "stream_first_chunk_ratio": 0.3, "ready_s": 5.0,
         "metrics_render_ms_1152": 50.0, "errors": 0}


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


# -- overhead ----------------------------------------------------------------------------

def measure_overhead(samples: int, prompt_len: int = 64, gen: int = 4,
                     client: str = "http.client") -> dict[str, Any]:
    """HTTP path minus in-process path per completion (module docstring)."""
    from dualpath_cli.api.app import create_app
    from dualpath_cli.api.auth import TokenAuth
    from dualpath_cli.api.server import ServerThread
    from dualpath_cli.runtime.options import options_from_config
    from dualpath_cli.runtime.turns import Ticket
    from dualpath_cli.services.live import LiveCluster
    from dualpath_cli.telemetry.gpu import UnavailableGpu

    class Recording(LiveCluster):
        """Times each session's turn on the in-process path: from the call to ``submit``
        until a thread blocked in ``ticket.event.wait()`` wakes (what an in-process caller
        of ``submit(...).wait()`` sees)."""

        def __post_init__(self) -> None:
            super().__post_init__()
            self.timings: dict[str, tuple[float, list[float], threading.Thread]] = {}

        def submit(self, tokens: list[int], gen: int, session: str | None = None,
                   stream: bool = False) -> Ticket:
            t0 = time.perf_counter()
            ticket = super().submit(tokens, gen, session, stream=stream)
            if session is not None:
                end: list[float] = []

                def watch() -> None:
                    ticket.event.wait()
                    end.append(time.perf_counter())

                thread = threading.Thread(target=watch, daemon=True)
                thread.start()
                self.timings[session] = (t0, end, thread)
            return ticket

    store = Path(tempfile.mkdtemp(prefix="dualpath-api-bench-"))
    loaded = _launch_config()
    live = Recording(options_from_config(loaded, processes=True, store_dir=store))
    rng = np.random.default_rng(0)
    http_ms: list[float] = []
    turn_ms: list[float] = []
    inproc_ms: list[float] = []
    over_ms: list[float] = []
    try:
        live.start()
        server = ServerThread(create_app(live, TokenAuth("bench-token"),
                                         gpu=UnavailableGpu("bench"))).start()
        port = server.port
        url = f"http://127.0.0.1:{port}/v1/completions"
        model = live.opts.model
        # the client runs in its own process, as a real client does (no GIL shared with
        # the server and the scheduler); it prints one latency per session id
        sessions = [f"overhead-{i}" for i in range(-5, samples)]  # five warm-up rounds
        prompts = [rng.integers(0, 256, prompt_len).tolist() for _ in sessions]
        job = json.dumps({"url": url, "model": model, "gen": gen, "sessions": sessions,
                          "prompts": prompts, "client": client})
        out = subprocess.run([sys.executable, __file__, "--_client"], input=job, text=True,
                             capture_output=True, check=True, timeout=600).stdout
        client_s = json.loads(out)
        for session in sessions[5:]:
            t_submit, end, watcher = live.timings.pop(session)
            watcher.join()
            http, turn = client_s[session], end[0] - t_submit
            http_ms.append(http * 1e3)
            turn_ms.append(turn * 1e3)
            over_ms.append((http - turn) * 1e3)
        for _ in range(samples):  # the in-process path alone, same prompt shape
            t1 = time.perf_counter()
            ticket = live.submit(rng.integers(0, 256, prompt_len).tolist(), gen)
            ticket.wait(120)
            inproc_ms.append((time.perf_counter() - t1) * 1e3)
            live.done(ticket)
        server.stop()
    finally:
        live.close()
        shutil.rmtree(store, ignore_errors=True)
    return {"overhead_p50_ms": round(_pct(over_ms, 50), 3),
            "overhead_p90_ms": round(_pct(over_ms, 90), 3),
            "http_p50_ms": round(_pct(http_ms, 50), 3),
            "turn_p50_ms": round(_pct(turn_ms, 50), 3),
            "in_process_p50_ms": round(_pct(inproc_ms, 50), 3), "samples": samples,
            "client": f"{client} in its own process",
            "prompt_tokens": prompt_len, "max_tokens": gen}


# -- streaming: time to the first chunk over the whole -------------------------------------

def measure_stream(samples: int, prompt_len: int = 64, gen: int = 64) -> dict[str, Any]:
    """Time to the first text chunk over the time to ``[DONE]`` (module docstring)."""
    import httpx

    from dualpath_cli.api.app import create_app
    from dualpath_cli.api.auth import TokenAuth
    from dualpath_cli.api.server import ServerThread
    from dualpath_cli.runtime.options import options_from_config
    from dualpath_cli.services.live import LiveCluster
    from dualpath_cli.telemetry.gpu import UnavailableGpu

    store = Path(tempfile.mkdtemp(prefix="dualpath-api-bench-"))
    live = LiveCluster(options_from_config(_launch_config(), processes=True, store_dir=store))
    rng = np.random.default_rng(1)
    ratios: list[float] = []
    first_ms: list[float] = []
    total_ms: list[float] = []
    chunks: list[int] = []
    floors: list[float] = []  # the turn's own TTFT over the client's whole wait
    try:
        live.start()
        server = ServerThread(create_app(live, TokenAuth("bench-token"),
                                         gpu=UnavailableGpu("bench"))).start()
        url = f"http://127.0.0.1:{server.port}/v1/completions"
        with httpx.Client(timeout=120) as client:
            for i in range(samples + 3):  # three warm-up rounds
                body = {"model": live.opts.model, "max_tokens": gen, "stream": True,
                        "prompt": rng.integers(0, 256, prompt_len).tolist()}
                t0 = time.perf_counter()
                first, n = 0.0, 0
                with client.stream("POST", url, json=body) as r:
                    r.raise_for_status()
                    for line in r.iter_lines():
                        if line.startswith("data: {") and json.loads(line[6:]).get(
                                "choices", [{}])[0].get("text"):
                            n += 1
                            first = first or time.perf_counter()
                total = time.perf_counter() - t0
                story = live.requests("finished", 1)["requests"][-1]
                if i >= 3 and first:
                    floors.append(float(story["ttft_s"]) / total)
                    ratios.append((first - t0) / total)
                    first_ms.append((first - t0) * 1e3)
                    total_ms.append(total * 1e3)
                    chunks.append(n)
        server.stop()
    finally:
        live.close()
        shutil.rmtree(store, ignore_errors=True)
    return {"stream_first_chunk_ratio": round(_pct(ratios, 50), 3),
            "stream_first_chunk_ms": round(_pct(first_ms, 50), 2),
            "stream_total_ms": round(_pct(total_ms, 50), 2),
            "stream_chunks_p50": round(_pct([float(c) for c in chunks], 50), 1),
            "stream_ttft_ratio": round(_pct(floors, 50), 3),
            "stream_samples": samples, "stream_max_tokens": gen}


# -- launch to ready -----------------------------------------------------------------------

def measure_ready(runs: int) -> dict[str, Any]:
    """Launch-to-ready, median over ``runs`` launches: bench/launch.py's measure when it is
    there, else this script's own (spawn ``dualpath launch`` until ``/readyz`` is 200)."""
    path = Path(__file__).with_name("launch.py")
    times: list[float] = []
    if path.exists():
        spec = importlib.util.spec_from_file_location("bench_launch", path)
        if spec is None or spec.loader is None:
            raise RuntimeError(f"cannot load {path}")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        times = [mod.one_launch()["ready_s"] for _ in range(runs)]
    else:
        for _ in range(runs):
            root = Path(tempfile.mkdtemp(prefix="dualpath-api-ready-"))
            try:
                t0 = time.monotonic()
                proc, _ = _launch(root)
                times.append(time.monotonic() - t0)
                _stop(proc)
            finally:
                shutil.rmtree(root, ignore_errors=True)
    return {"ready_s": round(statistics.median(times), 3),
            "ready_s_runs": [round(t, 3) for t in times]}


# -- render ----------------------------------------------------------------------------------

def measure_render() -> dict[str, Any]:
    """The api helper's render benchmark at 1,152 engines."""
    from dualpath_cli.api.render_bench import measure_renders

    got = measure_renders()
    return {k: got[k] for k in ("metrics_render_ms_1152", "api_metrics_render_ms_1152")}


# -- load: concurrent OpenAI clients against a launched cluster ----------------------------

def _launch(root: Path) -> tuple[subprocess.Popen[str], str]:
    (root / "run").mkdir(mode=0o700)
    env = {**os.environ, "XDG_RUNTIME_DIR": str(root / "run"),
           "XDG_DATA_HOME": str(root / "data"), "XDG_STATE_HOME": str(root / "state")}
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "dualpath_cli.cli.app", "launch",
                             "--port", str(port)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(f"{url}/readyz", timeout=1) as resp:
                if resp.status == 200:
                    return proc, url
        except (urllib.error.URLError, OSError):
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            err = proc.stderr.read() if proc.stderr else ""
            raise RuntimeError(f"launch did not get ready: {err.strip()[-500:]}")
        time.sleep(0.05)


def _stop(proc: subprocess.Popen[str]) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(120)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()
    finally:
        if proc.stderr is not None:
            proc.stderr.close()


def load_run(url: str, clients: int, duration: float, gen: int = 8,
             turns_per_session: int = 8) -> dict[str, Any]:
    """``clients`` official OpenAI clients as agents for ``duration`` seconds."""
    import openai

    stop_at = time.monotonic() + duration
    lock = threading.Lock()
    counts = {"completions": 0, "errors": 0, "tokens": 0, "cached": 0, "prompt": 0}
    first_errors: list[str] = []

    def agent(k: int) -> None:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="loopback", max_retries=0,
                               timeout=120)
        model = client.models.list().data[0].id
        rng = np.random.default_rng(k)
        chat = k % 2 == 1
        session = 0
        while time.monotonic() < stop_at:
            session += 1
            sid = f"load-{k}-{session}"
            ids: list[int] = []
            messages: list[Any] = []
            for turn in range(turns_per_session):
                if time.monotonic() >= stop_at:
                    break
                try:
                    if chat:
                        messages.append({"role": "user", "content": f"agent {k} session "
                                         f"{session} turn {turn}: run the next tool call."})
                        r = client.chat.completions.create(model=model, messages=messages,
                                                           max_tokens=gen, user=sid)
                        messages.append({"role": "assistant",
                                         "content": r.choices[0].message.content or ""})
                    else:
                        ids = ids + rng.integers(0, 256, 64 if turn == 0 else 16).tolist()
                        c = client.completions.create(
                            model=model, prompt=ids, max_tokens=gen,
                            extra_headers={"X-Session-Id": sid},
                            extra_body={"return_token_ids": True})
                        ids = ids + (c.choices[0].model_extra or {})["token_ids"]
                        r = c  # type: ignore[assignment]
                    usage = r.usage
                    assert usage is not None
                    details = usage.prompt_tokens_details
                    with lock:
                        counts["completions"] += 1
                        counts["tokens"] += usage.completion_tokens
                        counts["prompt"] += usage.prompt_tokens
                        counts["cached"] += (details.cached_tokens or 0) if details else 0
                except Exception as err:  # every failure counts; the first few are shown
                    with lock:
                        counts["errors"] += 1
                        if len(first_errors) < 5:
                            first_errors.append(f"{type(err).__name__}: {err}")
                    break

    t0 = time.monotonic()
    threads = [threading.Thread(target=agent, args=(k,), daemon=True) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    return {"errors": counts["errors"], "error_samples": first_errors, "clients": clients,
            "duration_s": round(wall, 2), "completions": counts["completions"],
            "throughput_rps": round(counts["completions"] / wall, 2),
            "tokens_per_s": round(counts["tokens"] / wall, 1),
            "cached_fraction": round(counts["cached"] / max(1, counts["prompt"]), 3)}


def measure_load(clients: int, duration: float) -> dict[str, Any]:
    """A launched cluster (private XDG dirs, free port) under the load run; stopped after."""
    root = Path(tempfile.mkdtemp(prefix="dualpath-api-load-"))
    try:
        proc, url = _launch(root)
        try:
            result = load_run(url, clients, duration)
        finally:
            result_code = _stop(proc)
        result["launch_exit_code"] = result_code
        return result
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _client_main() -> int:
    """The overhead's HTTP client (a child process): sequential completions, one latency
    (seconds) per session id, as JSON on stdout."""
    job = json.loads(sys.stdin.read())
    out: dict[str, float] = {}
    if job["client"] == "httpx":
        import httpx

        with httpx.Client(timeout=120) as client:
            for session, prompt in zip(job["sessions"], job["prompts"], strict=True):
                t0 = time.perf_counter()
                resp = client.post(job["url"], json={"model": job["model"], "prompt": prompt,
                                                     "max_tokens": job["gen"]},
                                   headers={"X-Session-Id": session})
                out[session] = time.perf_counter() - t0
                resp.raise_for_status()
    else:
        import http.client
        from urllib.parse import urlsplit

        url = urlsplit(job["url"])
        conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=120)
        for session, prompt in zip(job["sessions"], job["prompts"], strict=True):
            body = json.dumps({"model": job["model"], "prompt": prompt,
                               "max_tokens": job["gen"]})
            t0 = time.perf_counter()
            conn.request("POST", url.path, body=body,
                         headers={"Content-Type": "application/json", "X-Session-Id": session})
            resp = conn.getresponse()
            data = resp.read()
            out[session] = time.perf_counter() - t0
            if resp.status != 200:
                raise SystemExit(f"HTTP {resp.status}: {data[:200]!r}")
        conn.close()
    print(json.dumps(out))
    return 0


def main(argv: list[str]) -> int:
    if argv == ["--_client"]:
        return _client_main()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=60.0,
                        help="seconds of the concurrent-client run (CI: 5)")
    parser.add_argument("--clients", type=int, default=16, help="concurrent OpenAI clients")
    parser.add_argument("--samples", type=int, default=100,
                        help="sequential completions for the overhead")
    parser.add_argument("--client", choices=("http.client", "httpx"), default="http.client",
                        help="the overhead's HTTP client (module docstring)")
    parser.add_argument("--stream-samples", type=int, default=20,
                        help="streamed completions for the first-chunk ratio")
    parser.add_argument("--launch-runs", type=int, default=3,
                        help="launches for launch-to-ready")
    parser.add_argument("--parts", default="overhead,stream,ready,render,load",
                        help="which measurements to run (comma-separated)")
    parser.add_argument("--no-boost", action="store_true",
                        help="do not raise this session's CPU priority while measuring")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    parts = {p.strip() for p in args.parts.split(",") if p.strip()}
    unknown = parts - {"overhead", "stream", "ready", "render", "load"}
    if unknown:
        parser.error(f"--parts: unknown {', '.join(sorted(unknown))}")
    nan = float("nan")
    result: dict[str, Any] = {
        "cpus": os.cpu_count(), "load_average_1m": round(os.getloadavg()[0], 2),
        "overhead_p50_ms": nan, "http_p50_ms": nan, "turn_p50_ms": nan,
        "in_process_p50_ms": nan, "stream_first_chunk_ratio": nan, "ready_s": nan,
        "metrics_render_ms_1152": nan,
        "api_metrics_render_ms_1152": nan, "errors": None, "error_samples": [],
        "duration_s": nan, "throughput_rps": nan, "tokens_per_s": nan}
    from dualpath_cli.telemetry.hostload import ForeignCpu, cpu_priority

    with cpu_priority(not args.no_boost) as boosted:
        meter = ForeignCpu()
        meter.start()
        if "overhead" in parts:
            result.update(measure_overhead(args.samples, client=args.client))
        if "stream" in parts:
            result.update(measure_stream(args.stream_samples))
        if "ready" in parts:
            result.update(measure_ready(args.launch_runs))
        if "render" in parts:
            result.update(measure_render())
        if "load" in parts:
            result.update(measure_load(args.clients, args.duration))
        foreign = meter.stop()
    result["boosted"] = boosted
    result["foreign_cpu_cores"] = None if foreign is None else round(foreign, 3)
    result["goals"] = GOALS
    result["met"] = {
        "overhead_p50_ms": result["overhead_p50_ms"] <= GOALS["overhead_p50_ms"],
        "stream_first_chunk_ratio": result["stream_first_chunk_ratio"]
        <= GOALS["stream_first_chunk_ratio"],
        "ready_s": result["ready_s"] <= GOALS["ready_s"],
        "metrics_render_ms_1152": max(result["metrics_render_ms_1152"],
                                      result["api_metrics_render_ms_1152"])
        <= GOALS["metrics_render_ms_1152"],
        "errors": result["errors"] == GOALS["errors"]}
    if args.json:
        print(json.dumps({k: (None if isinstance(v, float) and v != v else v)
                          for k, v in result.items()}))
        return 0
    rows = [
        ("overhead p50 (HTTP - in-process)", f"{result['overhead_p50_ms']:.2f} ms",
         "<= 2 ms", result["met"]["overhead_p50_ms"]),
        ("  HTTP / its turn / in-process p50",
         f"{result['http_p50_ms']:.1f} / {result['turn_p50_ms']:.1f} / "
         f"{result['in_process_p50_ms']:.1f} ms", "", None),
        ("streamed: first chunk / whole (p50)", f"{result['stream_first_chunk_ratio']:.3f}",
         "<= 0.3", result["met"]["stream_first_chunk_ratio"]),
        ("launch to ready (median)", f"{result['ready_s']:.2f} s", "<= 5 s",
         result["met"]["ready_s"]),
        ("/metrics render, 1,152 engines", f"{result['metrics_render_ms_1152']:.1f} ms",
         "<= 50 ms", result["met"]["metrics_render_ms_1152"]),
        ("/api/v1/metrics render", f"{result['api_metrics_render_ms_1152']:.1f} ms",
         "<= 50 ms", None),
        (f"errors, {args.clients} clients x {result['duration_s']:.0f} s",
         str(result["errors"]), "0", result["met"]["errors"]),
        ("  throughput", f"{result['throughput_rps']:.1f} completions/s, "
         f"{result['tokens_per_s']:.0f} tokens/s", "", None),
    ]
    print(f"dualpath API benchmark ({os.cpu_count()} CPUs, priority "
          f"{'boosted' if result['boosted'] else 'not boosted'}, other processes kept "
          f"{result['foreign_cpu_cores']} cores busy)")
    print(f"{'measure':<36} {'value':<34} {'goal':<9} met")
    for name, value, goal, met in rows:
        mark = "" if met is None else ("yes" if met else "NO")
        print(f"{name:<36} {value:<34} {goal:<9} {mark}")
    for err in result["error_samples"]:
        print(f"  error: {err}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
