"""`dualpath tune alpha|beta`: both rules, JSON keys, derivations and bad input."""

from __future__ import annotations

import json

import pytest

from dualpath_cli.cli.app import main
from dualpath_cli.core.profiles import HARDWARE_PROFILES, MODEL_PROFILES


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    code = main([*args, "--json"])
    out = capsys.readouterr().out
    assert code == 0, out
    return json.loads(out)


def test_alpha_by_bandwidth_delay_is_2_5_mb(capsys: pytest.CaptureFixture[str]) -> None:
    data = run_json(capsys, "tune", "alpha", "--snic", "400Gbps", "--latency", "50us")
    assert data["rule"] == "bandwidth-delay"
    assert data["alpha_bytes"] == 2_500_000
    assert data["inputs"]["snic_bytes_per_s"] == 50e9
    assert data["inputs"]["latency_s"] == pytest.approx(50e-6)
    assert "8KB" in data["note"] and "2.5MB" in data["note"]
    assert "alpha_tokens" not in data


def test_alpha_bandwidth_delay_in_tokens_with_a_model(
        capsys: pytest.CaptureFixture[str]) -> None:
    data = run_json(capsys, "tune", "alpha", "--snic", "400Gbps", "--latency", "50us",
                    "--model", "ds660b")
    assert data["alpha_tokens"] == 2_500_000 // 48_068


def test_alpha_human_mode_explains_and_flags_the_seed(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tune", "alpha", "--snic", "400Gbps", "--latency", "50us"]) == 0
    out = capsys.readouterr().out
    assert "50GB/s x 50us = 2.5MB (2,500,000 bytes)" in out
    assert "the seed quotes alpha = 8KB" in out


def test_alpha_by_window_gives_tokens(capsys: pytest.CaptureFixture[str]) -> None:
    data = run_json(capsys, "tune", "alpha", "--window", "3s", "--bytes-per-token", "48068",
                    "--snic", "400Gbps")
    assert data["rule"] == "window"
    assert data["alpha_tokens"] == int(50e9 * 3 // 48_068)
    assert data["inputs"]["window_s"] == 3.0


def test_alpha_window_defaults_to_the_papers_nic_and_reads_profiles(
        capsys: pytest.CaptureFixture[str]) -> None:
    default = run_json(capsys, "tune", "alpha", "--window", "3s", "--model", "ds660b")
    assert default["inputs"]["snic_bytes_per_s"] == 50e9
    cpu = run_json(capsys, "tune", "alpha", "--window", "3s", "--model", "reference",
                   "--hardware", "cpu")
    hw, model = HARDWARE_PROFILES["cpu"], MODEL_PROFILES["reference"]
    assert cpu["alpha_tokens"] == int(hw.snic_bandwidth * hw.snics_per_node * 3
                                      // model.kv_bytes_per_token)


def test_beta_from_a_given_rate(capsys: pytest.CaptureFixture[str]) -> None:
    data = run_json(capsys, "tune", "beta", "--window", "5s", "--tokens-per-s", "12K")
    assert data == {"rule": "window", "beta_tokens": 60_000,
                    "inputs": {"window_s": 5.0, "tokens_per_s": 12_000.0,
                               "source": "--tokens-per-s"}}


def test_beta_from_profiles_uses_the_flop_model(capsys: pytest.CaptureFixture[str]) -> None:
    data = run_json(capsys, "tune", "beta", "--model", "ds660b", "--hardware", "hopper",
                    "--context", "32K")
    hw, model = HARDWARE_PROFILES["hopper"], MODEL_PROFILES["ds660b"]
    rate = hw.prompt_tokens_per_s(model, 32_000, 429)
    assert data["beta_tokens"] == int(rate * 5)
    assert data["inputs"]["context_tokens"] == 32_000
    assert data["inputs"]["append_tokens"] == 429  # the paper's mean append at 64K
    # prompt tokens per second: the whole prompt over the time to prefill the new tokens
    assert rate == pytest.approx(32_429 / (model.prefill_flops(32_000, 429) / hw.gpu_flops))
    other = run_json(capsys, "tune", "beta", "--model", "ds660b", "--context", "32K",
                     "--append", "1K")
    assert other["beta_tokens"] == int(hw.prompt_tokens_per_s(model, 32_000, 1000) * 5)
    assert main(["tune", "beta", "--model", "ds660b"]) == 0
    assert "tokens/s x 5s" in capsys.readouterr().out


@pytest.mark.parametrize(("args", "message"), [
    (["tune", "alpha", "--snic", "400Gbps"], "exactly one of --latency"),
    (["tune", "alpha", "--latency", "50us", "--window", "3s"], "exactly one of --latency"),
    (["tune", "alpha", "--window", "3s"], "--bytes-per-token or --model"),
    (["tune", "alpha", "--latency", "5 parsecs"], "invalid duration '5 parsecs'"),
    (["tune", "alpha", "--snic", "fast", "--latency", "50us"], "invalid bandwidth 'fast'"),
    (["tune", "alpha", "--window", "3s", "--bytes-per-token", "0"], "greater than zero"),
    (["tune", "alpha", "--window", "3s", "--model", "gpt9"], "unknown model profile 'gpt9'"),
    (["tune", "beta"], "give --tokens-per-s"),
    (["tune", "beta", "--model", "ds660b", "--hardware", "tpu"], "unknown hardware profile"),
    (["tune", "beta", "--tokens-per-s", "1K", "--model", "ds660b"], "not both"),
    (["tune", "beta", "--model", "ds660b", "--append", "0"], "at least 1 token"),
])
def test_bad_input_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str], args: list[str],
                                          message: str) -> None:
    assert main(args) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert message in captured.err
    assert captured.err.startswith("error:") and "Traceback" not in captured.err
