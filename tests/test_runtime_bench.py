"""The bench service and `dualpath bench`: offline and online (Poisson arrivals, SLO) modes."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from test_runtime import AGENTS

from dualpath_cli.cli.app import main
from dualpath_cli.config import load_config
from dualpath_cli.core.reference_model import model_config
from dualpath_cli.errors import ConfigError, UsageError
from dualpath_cli.runtime.calibrate import measure_flops_rate
from dualpath_cli.runtime.options import RuntimeOptions, options_from_config
from dualpath_cli.runtime.workloads import agentic_workload
from dualpath_cli.services.bench import (
    REGIME_MULTIPLE,
    SLO,
    Demand,
    calibrate_snic,
    load_bench_config,
    oracle_rate,
    run_bench,
    workload_demand,
)
from dualpath_cli.storage.header import file_nbytes
from dualpath_cli.workload.trajectory import Trajectory, Turn


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
    workload = agentic_workload(4, turns=4)  # later turns hit whole 64-token blocks
    loaded, applied, cal = load_bench_config(workload, flops_rate=5e9)
    assert cal is not None and cal.flops_rate == 5e9
    opts = options_from_config(loaded)
    assert f"hardware.snic_bandwidth={cal.snic_bw!r}B/s" in applied
    assert (opts.prefill_nodes, opts.decode_nodes, opts.model) == (1, 2, "tiny")
    assert opts.block_tokens == 64 and opts.snic_bw == cal.snic_bw and opts.cnic_bw == 1e9
    assert opts.alpha == loaded.resolved.alpha_tokens and opts.quota_s == 0.3
    for sets, flag in ((["hardware.snic_bandwidth=1GB/s"], None), ([], "1GB/s")):
        loaded, applied, cal = load_bench_config(workload, sets=sets, snic_bw=flag)
        assert cal is None and not any(a.startswith("hardware.snic") for a in applied)
        assert options_from_config(loaded).snic_bw == 1e9
    with pytest.raises(ConfigError, match="storage.codec"):
        options_from_config(load_config(overrides=["storage.codec=fp8_e4m3"]))
    with pytest.raises(ConfigError, match="model.profile"):
        options_from_config(load_config(preset="paper"))


def test_calibrated_snic_puts_basic_storage_at_the_regime_multiple() -> None:
    demand = Demand(prefill_flops=4e10, read_bytes=90_000_000)
    one = calibrate_snic(demand, 8e9, prefill_nodes=1, decode_nodes=2)
    # compute 5 s on one PE; Basic reads 90 MB over one NIC in 2.5 x 5 s -> 7.2 MB/s
    assert one.compute_s == pytest.approx(5.0) and one.snic_bw == 7.2e6
    assert one.basic_storage_s == pytest.approx(REGIME_MULTIPLE * one.compute_s)
    assert one.dualpath_storage_s == pytest.approx(one.basic_storage_s / 3)
    two = calibrate_snic(demand, 8e9, prefill_nodes=2, decode_nodes=1, multiple=2.0)
    assert two.snic_bw == 9e6 and two.compute_s == pytest.approx(2.5)  # P cancels
    assert two.basic_storage_s == pytest.approx(2.0 * two.compute_s)
    # three significant figures: what is printed is what is used
    odd = calibrate_snic(Demand(3e10, 85_786_624), 9.9e9, prefill_nodes=1, decode_nodes=2)
    assert odd.snic_bw == 11_300_000.0
    assert odd.basic_storage_s / odd.compute_s == pytest.approx(REGIME_MULTIPLE, rel=5e-3)
    with pytest.raises(UsageError):
        calibrate_snic(demand, 0.0, prefill_nodes=1, decode_nodes=2)


def test_oracle_rate_is_the_workloads_flops_over_the_compute_only_run() -> None:
    demand = Demand(prefill_flops=4e10, read_bytes=90_000_000)
    rate = oracle_rate(demand, 10.0, prefill_nodes=2)
    assert rate == pytest.approx(2e9)
    cal = calibrate_snic(demand, rate, prefill_nodes=2, decode_nodes=1, source="oracle")
    assert cal.compute_s == pytest.approx(10.0) and cal.source == "oracle"  # = the oracle JCT
    with pytest.raises(UsageError):
        oracle_rate(demand, 0.0, prefill_nodes=1)


def test_workload_demand_counts_whole_block_hits_and_block_files() -> None:
    traj = [Trajectory(0, (Turn(128, 2), Turn(64, 2), Turn(64, 2)))]
    cfg = model_config("tiny")
    profile = cfg.to_profile()
    d = workload_demand(traj, "tiny", 64)
    # contexts 0, 130, 196 -> 0, 2, 3 whole 64-token blocks hit
    assert d.read_bytes == 5 * file_nbytes(cfg.n_layers * 64 * cfg.kv_bytes_per_token_layer)
    want = (profile.prefill_flops(0, 128) + profile.prefill_flops(128, 194 - 128)
            + profile.prefill_flops(192, 260 - 192))
    assert d.prefill_flops == pytest.approx(want)


@pytest.mark.e2e
def test_measured_flops_rate_is_a_median_of_probes() -> None:
    sample = measure_flops_rate("tiny", 0.05, new=16, cached=32)
    assert sample.probes >= 3 and 0 < sample.low <= sample.rate <= sample.high


@pytest.mark.e2e
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
    cal = out["setup"]["snic_calibration"]  # the bench measured the compute and sized the NICs
    assert out["setup"]["snic_source"] == "calibrated" and cal["flops_rate"] > 0
    assert cal["source"] == "oracle"  # the default: an (offline) oracle run sized the NICs
    assert out["setup"]["snic_bw"] == cal["snic_bw"] > 0
    assert p["foreign_cores"] is None or p["foreign_cores"] >= 0
    assert math.isfinite(p["ttft_p99_s"]) and math.isfinite(p["tpot_p99_s"])


def test_cli_rejects_bad_policy_and_pd(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--policy", "fastest"]) == 2
    assert "unknown policy fastest" in capsys.readouterr().err
    assert main(["bench", "--pd", "2X4D"]) == 2
    assert "invalid P/D spec" in capsys.readouterr().err

