"""`dualpath tune show|set|rollback|auto` against a running cluster (a FakeClient behind
``source.connect``), and services/tuning.py's rules: token, confirmation, rollback, guard."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from test_diagnose_rules import ALPHA, BETA, make_view

from dualpath_cli.api.fake import FakeClient
from dualpath_cli.cli import source
from dualpath_cli.cli.app import main
from dualpath_cli.errors import UsageError
from dualpath_cli.services.tuning import (
    CONTROLLER_FIELDS,
    Throughput,
    guard_change,
    live_body,
    rollback_body,
)
from dualpath_cli.telemetry.view import AuditEntry, ClusterView

pytestmark = pytest.mark.usefixtures("fake_env")  # conftest: the fake cluster's URL, token


def run(capsys: pytest.CaptureFixture[str], *args: str, code: int = 0) -> dict[str, Any]:
    got = main(list(args))
    out = capsys.readouterr()
    assert got == code, out.err
    return json.loads(out.out) if "--json" in args and code == 0 else {"err": out.err}


def test_show_lists_thresholds_sources_and_recent_changes(
        fake: FakeClient, capsys: pytest.CaptureFixture[str]) -> None:
    data = run(capsys, "tune", "show", "--json")
    assert data["thresholds"]["alpha"] == {"value": ALPHA, "source": "config"}
    assert data["thresholds"]["read_side"]["value"] == "dualpath"
    assert data["changes"] == []
    fake.update_scheduler(alpha=5_000)
    data = run(capsys, "tune", "show", "--json")
    assert data["thresholds"]["alpha"] == {"value": 5_000, "source": "api"}
    assert [c["new"] for c in data["changes"]] == [{"alpha": 5_000}]
    assert main(["tune", "show"]) == 0
    out = capsys.readouterr().out
    assert "alpha" in out and "api" in out and "#1" in out


def test_set_applies_live_with_yes_and_is_audited(
        fake: FakeClient, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    data = run(capsys, "tune", "set", "alpha=5000", "compute_quota=150ms", "read_side=split",
               "--yes", "--json")
    assert data["live"] is True and data["applied"] is True
    assert fake.audit[-1].new == {"alpha": "5000", "quota": "150ms", "read_side": "split"}
    assert fake.audit[-1].old == {"alpha": ALPHA, "quota": 0.3, "read_side": "dualpath"}
    assert not (tmp_path / "home" / "config.yaml").exists()  # no file touched


def test_set_live_refuses_without_the_token(
        fake: FakeClient, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DUALPATH_TOKEN")
    err = run(capsys, "tune", "set", "alpha=5000", "--yes", code=2)["err"]
    assert "needs its bearer token" in err and "DUALPATH_TOKEN" in err
    assert err.count("\n") == 1
    assert "update_scheduler" not in fake.calls and "patch_scheduler" not in fake.calls


def test_set_live_asks_and_a_script_must_say_yes(
        fake: FakeClient, capsys: pytest.CaptureFixture[str]) -> None:
    err = run(capsys, "tune", "set", "beta=300K", code=2)["err"]
    assert "pass --yes" in err
    assert fake.audit == []


def test_set_live_refuses_a_launch_only_key(
        fake: FakeClient, capsys: pytest.CaptureFixture[str]) -> None:
    err = run(capsys, "tune", "set", "z_factor=1.2", "--yes", code=2)["err"]
    assert "z_factor cannot change on a running cluster" in err


def test_set_without_a_cluster_edits_the_config_file(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    monkeypatch.delenv("DUALPATH_URL")
    data = run(capsys, "tune", "set", "alpha=2s", "--json")
    assert data["written"] is True
    assert (tmp_path / "home" / "config.yaml").read_text() == "scheduler:\n  alpha: 2s\n"


def test_rollback_restores_the_last_change_and_a_second_redoes_it(
        fake: FakeClient, capsys: pytest.CaptureFixture[str]) -> None:
    fake.update_scheduler(alpha=5_000, beta=90_000)
    data = run(capsys, "tune", "rollback", "--yes", "--json")
    assert data["restore"] == {"alpha": ALPHA, "beta": BETA}
    th = fake.status().thresholds
    assert (th.alpha_tokens, th.beta_tokens) == (ALPHA, BETA)
    run(capsys, "tune", "rollback", "--yes", "--json")
    th = fake.status().thresholds
    assert (th.alpha_tokens, th.beta_tokens) == (5_000, 90_000)


def test_rollback_with_nothing_to_undo_is_one_line(
        fake: FakeClient, capsys: pytest.CaptureFixture[str]) -> None:
    err = run(capsys, "tune", "rollback", "--yes", code=2)["err"]
    assert "no scheduler change to undo" in err and err.count("\n") == 1


def test_rollback_reads_the_servers_scheduler_units() -> None:
    faults = AuditEntry(2, 0.0, "tok-a", "faults", {"faults": []}, {"faults": ["x"]})
    change = AuditEntry(1, 0.0, "tok-a", "scheduler",
                        {"alpha_tokens": 100, "quota_s": 0.3, "read_side": "dualpath"},
                        {"alpha_tokens": 7, "quota_s": 0.1, "read_side": "split"})
    last, body = rollback_body([change, faults])
    assert last.seq == 1
    assert body == {"alpha": 100, "quota": 0.3, "read_side": "dualpath"}
    with pytest.raises(UsageError, match="no scheduler change"):
        rollback_body([faults])


def test_live_body_maps_names_and_refuses_launch_keys() -> None:
    assert live_body({"scheduler.alpha": "3s", "compute_quota": "200ms"}) == {
        "alpha": "3s", "quota": "200ms"}
    with pytest.raises(UsageError, match="z_factor"):
        live_body({"z_factor": "1.1"})


# --- tune auto: the guard ----------------------------------------------------------------------
class Clock:
    """Simulated time: sleep advances it (no real waiting)."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


def traffic(rates: list[float], util: float = 0.95) -> list[ClusterView]:
    """Views one second apart whose decision count grows at ``rates[i]`` per second."""
    views, total = [], 0.0
    for i, r in enumerate(rates):
        total += r
        v = make_view(i, decided=int(total), util={n: util for n in range(6)})
        views.append(v)
    return views


def test_server_controllers_roll_back_on_a_throughput_drop() -> None:
    clock = Clock()
    fake = FakeClient(traffic([10.0] * 12 + [3.0] * 30), metrics_text="")
    fake.scheduler_fields += CONTROLLER_FIELDS
    res = guard_change(fake, duration_s=30, window_s=5, interval_s=1, max_drop=0.2,
                       clock=clock, sleep=clock.sleep)
    assert res.mode == "server"
    assert res.baseline_rate == pytest.approx(10.0)
    assert res.rolled_back and "below the baseline" in res.reason
    assert fake.audit[0].new == dict.fromkeys(CONTROLLER_FIELDS, True)
    restore = fake.audit[-1].new
    assert restore["alpha"] == ALPHA and restore["beta"] == BETA
    assert all(restore[f] is False for f in CONTROLLER_FIELDS)
    assert fake.switches == dict.fromkeys(CONTROLLER_FIELDS, False)


def test_client_controllers_step_alpha_down_and_keep_a_steady_rate() -> None:
    clock = Clock()
    fake = FakeClient(traffic([10.0] * 40), metrics_text="")  # busy NICs (95%)
    res = guard_change(fake, duration_s=10, window_s=3, interval_s=1, max_drop=0.2,
                       clock=clock, sleep=clock.sleep)
    assert res.mode == "client" and not res.rolled_back
    alphas = [s["set"]["alpha"] for s in res.steps if "alpha" in s.get("set", {})]
    assert alphas and alphas[0] == round(ALPHA * 0.9)
    assert all(b < a for a, b in zip(alphas, alphas[1:], strict=False))
    assert min(alphas) >= ALPHA / 4  # bounded
    assert "held within 20%" in res.reason


def test_auto_cli_needs_the_token_and_reports_a_rollback(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeClient(traffic([10.0] * 3 + [0.0] * 10), metrics_text="")
    monkeypatch.setattr(source, "connect", lambda ref, timeout: fake)
    monkeypatch.delenv("DUALPATH_TOKEN")
    assert "bearer token" in run(capsys, "tune", "auto", "--yes", code=2)["err"]
    monkeypatch.setenv("DUALPATH_TOKEN", "fake-token")
    # wall-clock driven: a 10 ms baseline, then 50 ms of looks every 1 ms
    code = main(["tune", "auto", "--yes", "--for", "50ms", "--window", "10ms",
                 "--interval", "1ms", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert data["mode"] == "client"
    assert code == (1 if data["rolled_back"] else 0)


def test_throughput_window_uses_ttft_counts_when_metrics_have_them() -> None:
    tp = Throughput(window_s=10)
    page = ("dualpath_ttft_seconds_count {n}\ndualpath_ttft_seconds_sum {s}\n")
    for i in range(5):
        view = dataclasses.replace(make_view(i), at=float(i))
        tp.add(view, page.format(n=4 * i, s=0.5 * 4 * i))
    assert tp.rate() == pytest.approx(4.0)
    assert tp.ttft_mean() == pytest.approx(0.5)


def test_show_lists_what_the_controllers_did(capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    v = make_view(0)
    step = {"controller": "alpha", "signal_name": "snic_util", "signal": 0.93,
            "old": 100_000, "new": 90_000, "floor": 25_000, "ceiling": 400_000,
            "max_change": 0.1, "reason": "above 80%: down"}
    ctl = {"alpha": {"on": True, "floor": 25_000, "ceiling": 400_000, "max_change": 0.1,
                     "last": step}, "beta": {"on": False, "last": None}}
    th = dataclasses.replace(v.scheduler.thresholds, controllers=ctl,
                             source={"alpha": "controller"})
    fake = FakeClient(dataclasses.replace(v, scheduler=dataclasses.replace(
        v.scheduler, thresholds=th)), metrics_text="")
    monkeypatch.setattr(source, "connect", lambda ref, timeout: fake)
    data = run(capsys, "tune", "show", "--json")
    assert data["controllers"]["alpha"]["last"]["new"] == 90_000
    assert data["thresholds"]["alpha"]["source"] == "controller"
    assert main(["tune", "show"]) == 0
    out = capsys.readouterr().out
    assert "dynamic controllers" in out and "snic_util 0.93" in out and "above 80%" in out


def test_the_applied_change_reads_as_status_shows_thresholds() -> None:
    """The table after ``tune set alpha=1s``: ``alpha 3s -> 1s`` as status says it, not the
    audit's ``alpha_tokens 586K tok -> 195K tok``."""
    from dualpath_cli.cli.tune_live import _audit_rows

    entry = AuditEntry(2, 0.0, "tok-1", "scheduler",
                       {"alpha_tokens": 586_000, "quota_s": 0.3},
                       {"alpha_tokens": 195_333, "quota_s": 0.15})
    assert _audit_rows(entry, 3.0 / 586_000) == [("alpha", "3s", "1s"),
                                                  ("quota", "300ms", "150ms")]
    assert _audit_rows(entry)[0] == ("alpha", "586K tok", "195K tok")  # rate unknown
