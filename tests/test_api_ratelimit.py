"""The API's per-client rate limit: 429 with Retry-After and a reason past it, monitoring
kept apart, recovery once the bucket refills, and a default no bench or test reaches."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from dualpath_cli.api.app import create_app
from dualpath_cli.api.auth import TokenAuth
from dualpath_cli.api.ratelimit import DEFAULT_RATE, MAX_CLIENTS, READ_FACTOR, RateLimit
from dualpath_cli.api.server import ServerThread
from dualpath_cli.config import load_config
from dualpath_cli.errors import ConfigError
from dualpath_cli.limits import LimitError
from dualpath_cli.runtime.options import RuntimeOptions, options_from_config
from dualpath_cli.services.live import LiveCluster

pytestmark = pytest.mark.e2e  # an API server

RATE = 5.0  # requests/s per address: a burst of 5, then one every 0.2 s


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, TokenAuth]]:
    """A server over a cluster that is never started: the routes used here answer before
    they reach it (health, auth refusals, body validation), so no engine runs."""
    live = LiveCluster(RuntimeOptions(api_rate_limit=RATE))
    auth = TokenAuth.generate(tmp_path_factory.mktemp("run") / "token")
    with ServerThread(create_app(live, auth)) as srv:
        yield srv.url, auth


def _until(check: Callable[[], httpx.Response], deadline_s: float = 20.0) -> httpx.Response:
    """Poll ``check`` (a callable returning a response) until it is not 429."""
    end = time.monotonic() + deadline_s
    while True:
        response = check()
        if response.status_code != 429 or time.monotonic() > end:
            return response


def _first_429(send: Callable[[], httpx.Response], most: int = 400
               ) -> tuple[list[int], httpx.Response]:
    """Send until a 429 comes back (``most`` tries): the codes before it and the 429."""
    codes: list[int] = []
    for _ in range(most):
        response = send()
        if response.status_code == 429:
            return codes, response
        codes.append(response.status_code)
    raise AssertionError(f"no 429 in {most} requests: {sorted(set(codes))}")


def test_a_flood_of_writes_gets_429_with_retry_after_then_recovers(
        server: tuple[str, TokenAuth]) -> None:
    url, auth = server
    with httpx.Client(base_url=url, timeout=20) as c:
        # the cluster's config (RuntimeOptions.api_rate_limit) sets the limit: a burst of
        # RATE requests is served (401: no token sent), then the address is throttled
        codes, refused = _first_429(lambda: c.patch("/api/v1/scheduler", json={"alpha": "1K"}))
        assert len(codes) >= RATE and set(codes) == {401}
        retry = int(refused.headers["retry-after"])
        assert 1 <= retry <= 2
        detail = refused.json()["detail"]
        assert "\n" not in detail and "rate limit" in detail
        assert "cluster.api_rate_limit" in detail and "DUALPATH_LIMIT_API_RATE" in detail
        assert auth.token not in refused.text
        # the same address still reads its health (monitoring has its own, larger bucket)
        assert c.get("/healthz").status_code == 200
        # once the bucket refills the writes are served again: poll with a deadline
        again = _until(lambda: c.patch("/api/v1/scheduler", json={"alpha": "1K"}))
        assert again.status_code == 401


def test_the_openai_routes_answer_in_openais_error_shape(
        server: tuple[str, TokenAuth]) -> None:
    url, _ = server
    with httpx.Client(base_url=url, timeout=20) as c:
        # (an earlier test may have emptied this address's bucket: wait for it to refill)
        first = _until(lambda: c.post("/v1/completions", json={"prompt": 1}))
        codes, limited = _first_429(lambda: c.post("/v1/completions", json={"prompt": 1}))
    assert first.status_code == 400 and set(codes) <= {400}  # a bad body: OpenAI says 400
    error = limited.json()["error"]
    assert error["code"] == "rate_limit_exceeded" and error["type"] == "requests"
    assert "\n" not in error["message"] and int(limited.headers["retry-after"]) >= 1


def test_reads_have_a_bigger_bucket_of_their_own(server: tuple[str, TokenAuth]) -> None:
    url, _ = server
    with httpx.Client(base_url=url, timeout=20) as c:
        reads = [c.get("/healthz").status_code for _ in range(int(RATE * READ_FACTOR * 3))]
    # more reads pass than the write budget allows, and the read bucket has a limit too
    assert reads.count(200) > RATE and 429 in reads


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def _ok(_scope: object, _receive: object, _send: object) -> None:
    raise AssertionError("not called in these checks")


def test_bucket_refills_at_the_rate_and_is_per_address() -> None:
    clock = _Clock()
    limit = RateLimit(_ok, rate=10.0, clock=clock)
    assert [limit._take("a", False) for _ in range(10)] == [0.0] * 10
    wait = limit._take("a", False)
    assert wait == pytest.approx(0.1)  # one token comes back every 0.1 s
    assert limit._take("b", False) == 0.0  # another address: its own bucket
    assert limit._take("a", True) == 0.0  # reads: their own bucket
    clock.now += 0.1
    assert limit._take("a", False) == 0.0
    assert limit._take("a", False) > 0
    clock.now += 60  # a long idle: the bucket is full again, never more than the burst
    assert sum(limit._take("a", False) == 0.0 for _ in range(30)) == 10


def test_the_table_of_addresses_stays_bounded() -> None:
    clock = _Clock()
    limit = RateLimit(_ok, rate=1.0, clock=clock)
    for i in range(MAX_CLIENTS * 2):
        limit._take(f"10.0.{i // 256}.{i % 256}", False)
    assert len(limit._buckets) <= MAX_CLIENTS + 2
    clock.now += 5  # every bucket refilled: the next new address prunes them
    limit._take("192.0.2.1", False)
    assert len(limit._buckets) == 1


def test_config_key_env_override_and_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    loaded = load_config(environment=False)
    assert loaded.config.cluster.api_rate_limit == DEFAULT_RATE
    assert options_from_config(loaded, flops_rate=1e9).api_rate_limit == DEFAULT_RATE
    low = load_config(overrides=["cluster.api_rate_limit=3"], environment=False)
    assert options_from_config(low, flops_rate=1e9).api_rate_limit == 3.0
    for bad in ("-1", "nan", "1e400", "\u0661\u0662", "lots"):
        with pytest.raises(ConfigError, match="api_rate_limit"):
            load_config(overrides=[f"cluster.api_rate_limit={bad}"], environment=False)
    off = RateLimit(_ok, rate=0)
    assert not off.on
    monkeypatch.setenv("DUALPATH_LIMIT_API_RATE", "7")
    assert RateLimit(_ok).rate == 7.0
    from dualpath_cli.api.ratelimit import rate_in_force

    assert rate_in_force(3.0) == 7.0
    monkeypatch.setenv("DUALPATH_LIMIT_API_RATE", "nope")
    with pytest.raises(LimitError, match="DUALPATH_LIMIT_API_RATE"):
        rate_in_force(3.0)
    monkeypatch.delenv("DUALPATH_LIMIT_API_RATE")
    assert rate_in_force(3.0) == 3.0


def test_the_default_lets_sixteen_concurrent_clients_of_one_address_through(
        tmp_path: Path) -> None:
    """bench/api.py drives 16 concurrent clients from 127.0.0.1, as every test does: with the
    default limit none of their requests is refused."""
    live = LiveCluster(RuntimeOptions())
    auth = TokenAuth.generate(tmp_path / "token")
    with ServerThread(create_app(live, auth)) as srv, \
            httpx.Client(base_url=srv.url, timeout=30,
                         limits=httpx.Limits(max_connections=16)) as c, \
            ThreadPoolExecutor(16) as pool:
        codes = list(pool.map(lambda _: c.patch("/api/v1/scheduler", json={}).status_code,
                              range(16 * 40)))
    assert codes.count(401) == len(codes)
