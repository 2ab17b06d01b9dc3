"""The shipped FakeClient: same interface as DualPathClient, plays views, checks tokens."""

from __future__ import annotations

import dataclasses
import inspect
import subprocess
import sys

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dualpath_cli.api.client import DualPathClient
from dualpath_cli.api.errors import Forbidden, NotReady, Rejected, Unauthorized, Unreachable
from dualpath_cli.api.fake import FakeClient
from dualpath_cli.api.protocol import ClusterClient
from dualpath_cli.api.render_bench import synthetic_view
from dualpath_cli.telemetry.view import Decision


def _views(n: int) -> list:
    base = synthetic_view(1, 2, 1, layers=1)
    return [dataclasses.replace(base, uptime_s=float(i), state="starting" if i == 0
                                else "ready") for i in range(n)]


def _decision(seq: int) -> Decision:
    return Decision(seq=seq, at=0.0, rid=seq, attempt=0, agent=0, turn=seq, length=64,
                    cached=32, pe=0, de=1, de_group=1, side="pe", pe_tokens=32, de_tokens=0,
                    pe_read_q=0, de_read_q=0, inputs={"alpha": 10})


def _public_methods(cls: type) -> dict[str, inspect.Signature]:
    """``cls``'s public methods (a classmethod constructor is not part of the seam)."""
    return {name: inspect.signature(member)
            for name, member in inspect.getmembers(cls, inspect.isfunction)
            if not name.startswith("_")}


def test_client_and_fake_have_exactly_the_protocols_methods() -> None:
    seam = _public_methods(ClusterClient)
    assert seam, "ClusterClient lists no methods"
    for cls in (DualPathClient, FakeClient):
        assert _public_methods(cls) == seam, cls.__name__  # names, parameters, annotations
        for dunder in ("__enter__", "__exit__"):
            assert dunder in vars(cls), f"{cls.__name__} lacks {dunder}"


def test_the_protocol_is_the_type_both_fit() -> None:
    views = _views(1)
    for client in (DualPathClient("http://127.0.0.1:1"), FakeClient(views)):
        assert isinstance(client.url, str) and client.url
        with client as same:
            assert same is client


def test_views_play_in_order_then_the_last_repeats() -> None:
    fake = FakeClient(_views(3), [_decision(1), _decision(2), _decision(3)])
    assert not fake.readyz()  # the first view is still starting
    assert [fake.view().uptime_s for _ in range(5)] == [0.0, 1.0, 2.0, 2.0, 2.0]
    assert fake.readyz() and fake.healthz()
    assert [d.seq for d in fake.decisions(1)] == [2, 3]
    st = fake.status()
    assert (st.engines_healthy, st.engines_total, st.pd) == (3, 3, "1P2D")
    assert len(fake.engines()) == 3 and [n.node for n in fake.nodes()] == [0, 1, 2]


def test_control_checks_the_token_records_and_applies_the_change() -> None:
    views = _views(3)
    with pytest.raises(Unauthorized, match="401"):
        FakeClient(views, client_token=None).update_scheduler(alpha=5)
    with pytest.raises(Forbidden, match="403"):
        FakeClient(views, client_token="wrong").update_scheduler(alpha=5)
    fake = FakeClient(views)
    with pytest.raises(Rejected, match="nothing to change"):
        fake.update_scheduler()
    first = fake.view()
    entry = fake.update_scheduler(alpha=5000, read_side="basic")
    assert entry.new == {"alpha": 5000, "read_side": "basic"}
    assert entry.old == {"alpha": 200_000, "read_side": "dualpath"}
    later = fake.view()
    assert later.uptime_s == 1.0 and first.scheduler.thresholds.alpha_tokens == 200_000
    th = later.scheduler.thresholds
    assert (th.alpha_tokens, th.read_side, th.source["alpha"]) == (5000, "basic", "api")
    assert fake.status().audit == (entry,)


def test_failures_are_injected_like_the_real_clients() -> None:
    fake = FakeClient(_views(1), unreachable=True, url="http://10.0.0.9:8470")
    with pytest.raises(Unreachable, match="http://10.0.0.9:8470"):
        fake.status()
    fake.unreachable = False
    fake.fail_next = NotReady("http://fake/api/v1/metrics: HTTP 503: draining", 503)
    with pytest.raises(NotReady):
        fake.view()
    assert fake.view().state == "starting"  # only the next call failed
    assert fake.calls == ["status", "view", "view"]


def test_metrics_text_is_the_views_exposition_unless_given() -> None:
    text = FakeClient(_views(2)).metrics_text()
    names = {f.name for f in text_string_to_metric_families(text)}
    assert {"dualpath_engine_up", "dualpath_hbm_usage_bytes"} <= names
    assert FakeClient(_views(1), metrics_text="x 1\n").metrics_text() == "x 1\n"


@pytest.mark.e2e
def test_importing_the_client_does_not_load_the_server_side() -> None:
    code = ("import sys, dualpath_cli.api.client, dualpath_cli.api.fake; "
            "print(sorted(m for m in ('fastapi', 'uvicorn', 'starlette', 'numpy') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.strip() == "[]"


def test_replicate_checks_token_keys_and_roots_like_the_server() -> None:
    key = "ab" * 16
    with pytest.raises(Unauthorized, match="401"):
        FakeClient(_views(2), client_token=None).replicate_blocks([key])
    fake = FakeClient(_views(2))
    with pytest.raises(Rejected, match="no replica roots"):
        fake.replicate_blocks([key])
    fake.replica_roots = ["/r1", "/r2"]
    with pytest.raises(Rejected, match="not a block key"):
        fake.replicate_blocks(["../etc/passwd"])
    entry = fake.replicate_blocks([key, key.upper()], copies=2)
    assert entry.action == "replicate" and fake.audit == [entry]
    assert entry.new["blocks"] == {key: ["store", "/r1"]}
    assert entry.old["blocks"] == {key: ["store"]}
