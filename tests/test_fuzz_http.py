"""Fuzz the HTTP API of a started cluster from its own OpenAPI document (schemathesis):
every endpoint, with and without the token; never a 5xx, and a 4xx names its reason."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fuzzing import run_http_fuzz

from dualpath_cli.api.app import create_app
from dualpath_cli.api.auth import TokenAuth
from dualpath_cli.runtime.options import RuntimeOptions
from dualpath_cli.services.live import LiveCluster
from dualpath_cli.telemetry.gpu import UnavailableGpu

#: Generated requests per endpoint in CI (bench/reliability.py --long runs more).
CI_EXAMPLES = 3

# schemathesis is in the dev environment but not yet in the package's test extras
pytest.importorskip("schemathesis")


@pytest.fixture(scope="module")
def live() -> Iterator[LiveCluster]:
    cluster = LiveCluster(RuntimeOptions(block_tokens=8, flops_rate=5e9, fetch_s=0.005,
                                         heartbeat_timeout=10.0))
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.close()


def test_every_endpoint_with_and_without_the_token(live: LiveCluster) -> None:
    app = create_app(live, TokenAuth("fuzz-token"), gpu=UnavailableGpu("tests"))

    def clear() -> None:  # an accepted fault (slow compute...) must not slow the next case
        if live.system.faults:
            live.system.clear_faults()

    outcomes = run_http_fuzz(app, "fuzz-token", CI_EXAMPLES, after_each=clear)
    failures = [o for o in outcomes if not o.ok]
    assert len({o.argv[0] for o in outcomes}) >= 15  # every endpoint was reached
    assert not failures, "\n".join(f"{o.argv}: {o.reason}" for o in failures[:10])


def test_the_http_verdict_can_fail() -> None:
    from fuzzing import _http_reason

    assert _http_reason(500, "boom").startswith("HTTP 500")
    assert _http_reason(422, '{"detail": "alpha: not a size"}') == ""
    assert "without a reason" in _http_reason(400, "{}")
    assert "without a JSON reason" in _http_reason(404, "Not Found")
