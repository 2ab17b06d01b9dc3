"""The bench service and `dualpath bench`: offline and online (Poisson arrivals, SLO) modes."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from test_runtime import AGENTS

from dualpath_cli.cli.app import main
from dualpath_cli.config import load_config
from dualpath_cli.errors import ConfigError
from dualpath_cli.runtime.options import RuntimeOptions, options_from_config
from dualpath_cli.services.bench import SLO, load_bench_config, run_bench


def test_online_mode_reports_latencies_and_the_scaled_slo(tmp_path: Path) -> None:
    base = RuntimeOptions(block_tokens=8)  # in-process engines over a POSIX store
    slo = SLO(scale=10.0)
    report = run_bench(["dualpath", "basic"], base, AGENTS, tmp_path, aps=50.0, slo=slo)
    assert report.setup["mode"] == "online 50.0 APS"
    assert report.setup["slo"] == {"scale": 10.0, "ttft_s": 40.0, "tpot_s": 0.5}
    for p in report.policies:
        assert p.turns == sum(t.num_turns for t in AGENTS) and not p.errors
        assert 0 < p.ttft_p50_s <= p.ttft_p99_s < 40.0
        assert 0 < p.ttst_p50_s <= p.ttst_p99_s and 0 < p.tpot_p50_s <= p.tpot_p99_s
        assert p.slo_met == (p.ttft_p99_s <= slo.ttft_limit and p.tpot_p99_s <= slo.tpot_limit)
        assert p.slo_met  # a generous SLO holds on 9 tiny turns
        assert p.tokens_match
    tight = run_bench(["dualpath"], base, AGENTS[:1], tmp_path, aps=50.0,
                      slo=SLO(scale=1e-6)).policies[0]
    assert not tight.slo_met


def test_bench_config_comes_from_load_config() -> None:
    loaded, applied = load_bench_config(AGENTS)
    assert "hardware.snic_bandwidth=7MB/s" in applied
    opts = options_from_config(loaded)
    assert (opts.prefill_nodes, opts.decode_nodes, opts.model) == (1, 2, "tiny")
    assert opts.block_tokens == 64 and opts.snic_bw == 7e6 and opts.cnic_bw == 1e9
    assert opts.alpha == loaded.resolved.alpha_tokens and opts.quota_s == 0.3
    loaded, applied = load_bench_config(AGENTS, sets=["hardware.snic_bandwidth=1GB/s"])
    assert not any(a.startswith("hardware.snic") for a in applied)
    assert options_from_config(loaded).snic_bw == 1e9
    with pytest.raises(ConfigError, match="storage.codec"):
        options_from_config(load_config(overrides=["storage.codec=fp8_e4m3"]))
    with pytest.raises(ConfigError, match="model.profile"):
        options_from_config(load_config(preset="paper"))


def test_cli_online_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "--policy", "dualpath", "--agents", "2", "--turns", "2",
                 "--aps", "20", "--store", str(tmp_path), "--set", "storage.block_size=16",
                 "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["jct_s"]) == {"dualpath"} and set(out["snic_max_avg"]) == {"dualpath"}
    (p,) = out["policies"]
    assert p["turns"] == 4 and not p["errors"] and isinstance(p["slo_met"], bool)
    assert out["setup"]["mode"] == "online 20.0 APS" and out["setup"]["block_tokens"] == 16
    assert math.isfinite(p["ttft_p99_s"]) and math.isfinite(p["tpot_p99_s"])


def test_cli_rejects_bad_policy_and_pd(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--policy", "fastest"]) == 2
    assert "unknown policy fastest" in capsys.readouterr().err
    assert main(["bench", "--pd", "2X4D"]) == 2
    assert "invalid P/D spec" in capsys.readouterr().err

