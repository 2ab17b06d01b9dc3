"""The shipped Prometheus alert rules: valid, unit-tested on synthetic series, and in step
with the metrics table and the diagnose workflows they encode."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from dualpath_cli.cli.diagnose_cmd import WORKFLOW_NAMES
from dualpath_cli.diagnose import thresholds as diag
from dualpath_cli.telemetry.metrics import METRICS, MetricType

DEPLOY = Path(__file__).resolve().parents[1] / "deploy" / "prometheus"
RULES = DEPLOY / "dualpath-alerts.yml"
TESTS = DEPLOY / "dualpath-alerts.test.yml"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"

needs_promtool = pytest.mark.skipif(
    not os.access(PROMTOOL, os.X_OK),
    reason="promtool is not installed (Debian package prometheus; CI installs it)")


def _rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    return [r for group in doc["groups"] for r in group["rules"]]


@needs_promtool
def test_promtool_check_rules() -> None:
    out = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(_rules())} rules found" in out.stdout


@needs_promtool
def test_promtool_unit_tests_on_synthetic_series() -> None:
    out = subprocess.run([PROMTOOL, "test", "rules", TESTS.name], capture_output=True,
                         text=True, timeout=120, cwd=DEPLOY)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_every_alert_is_tested_and_named_for_an_operator() -> None:
    tested = set(re.findall(r"alertname: (\w+)", TESTS.read_text(encoding="utf-8")))
    for rule in _rules():
        name = rule["alert"]
        assert name in tested, f"{name} has no promtool test"
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        ann = rule["annotations"]
        assert ann["summary"] and ann["description"], name
        cmd = shlex.split(ann["diagnose"])
        assert cmd[:2] == ["dualpath", "diagnose"] and cmd[2] in WORKFLOW_NAMES, name


def test_rules_read_only_metrics_of_the_table() -> None:
    names = {m.name for m in METRICS}
    hist = {m.name for m in METRICS if m.type is MetricType.HISTOGRAM}
    for rule in _rules():
        for used in re.findall(r"\b(dualpath_[a-z0-9_]+)", rule["expr"]):
            base = re.sub(r"_(bucket|sum|count)$", "", used)
            assert used in names or base in hist, f"{rule['alert']}: {used} is not a metric"


def test_thresholds_are_the_diagnose_workflows() -> None:
    exprs = {r["alert"]: r["expr"] for r in _rules()}
    assert f"> {diag.SNIC_MAX_AVG_WARN}" in exprs["DualPathSNICImbalance"]
    assert f"> {diag.SNIC_MAX_AVG_CRIT}" in exprs["DualPathSNICImbalanceCritical"]
    for name in ("DualPathSNICImbalance", "DualPathSNICImbalanceCritical"):
        assert f"> {diag.SNIC_BUSY_MIN}" in exprs[name]
    assert f"> {diag.HBM_FRAG_WARN}" in exprs["DualPathHBMFragmentation"]
    assert f"> {diag.HBM_FRAG_CRIT}" in exprs["DualPathHBMFragmentationCritical"]
    assert f"< {diag.PREFIX_HIT_WARN} *" in exprs["DualPathHitRateDrop"]
