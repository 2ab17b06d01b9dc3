"""Config model pieces: P/D specs, threshold forms, and their resolution to scheduler units."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dualpath_cli.config import (
    PDSpec,
    parse_alpha,
    parse_beta,
    parse_pd,
    parse_quota,
    preset,
    resolve_alpha,
    resolve_beta,
    resolve_quota,
    resolve_scheduler,
)
from dualpath_cli.config.model import Threshold
from dualpath_cli.config.resolve import ThresholdError
from dualpath_cli.core.profiles import HARDWARE_PROFILES, MODEL_PROFILES
from dualpath_cli.core.thresholds import (
    bytes_to_tokens,
    read_seconds,
    tokens_processable,
    tokens_readable,
)
from dualpath_cli.errors import UnitError, UsageError

HOPPER = HARDWARE_PROFILES["hopper"]
DS660B = MODEL_PROFILES["ds660b"]


def test_pd_spec_parses_and_prints() -> None:
    spec = parse_pd("2P4D")
    assert spec == PDSpec(2, 4)
    assert (spec.nodes, spec.ratio, str(spec)) == (6, 0.5, "2P4D")
    assert parse_pd(" 48p96d ") == PDSpec(48, 96)


@pytest.mark.parametrize("bad", ["2X4D", "P4D", "2P", "0P4D", "2P0D", "", "2P4D1", 24])
def test_pd_spec_rejects_bad_forms(bad: object) -> None:
    with pytest.raises(UsageError, match="P/D spec"):
        parse_pd(bad)


@given(st.integers(1, 500), st.integers(1, 500))
def test_pd_spec_round_trips(p: int, d: int) -> None:
    assert parse_pd(str(PDSpec(p, d))) == PDSpec(p, d)


@pytest.mark.parametrize(("text", "form", "amount"), [
    ("8KiB", "bytes", 8192),
    ("4KB", "bytes", 4000),
    ("16K", "tokens", 16000),
    ("16K tokens", "tokens", 16000),
    ("4096", "tokens", 4096),
    (4096, "tokens", 4096),
    ("3.2M", "tokens", 3_200_000),
    ("3s", "seconds", 3.0),
    ("500ms", "seconds", 0.5),
    ("2min", "seconds", 120.0),
])
def test_alpha_forms_are_decided_by_the_unit(text: object, form: str, amount: float) -> None:
    threshold = parse_alpha(text)
    assert (threshold.form, threshold.amount) == (form, pytest.approx(amount))
    assert threshold.text == str(text)


@pytest.mark.parametrize("bad", ["fast", "3m", "-8KiB", "8XB", True, None, "1TFLOP"])
def test_alpha_rejects_bad_values(bad: object) -> None:
    with pytest.raises(UnitError, match="alpha"):
        parse_alpha(bad)


def test_beta_accepts_tokens_and_seconds_but_not_bytes() -> None:
    assert parse_beta("16K") == Threshold("16K", "tokens", 16000)
    assert parse_beta("5s") == Threshold("5s", "seconds", 5.0)
    with pytest.raises(UnitError, match="cannot be given in bytes"):
        parse_beta("16KB")


def test_quota_accepts_time_and_flops() -> None:
    assert parse_quota("300ms").amount == pytest.approx(0.3)
    assert parse_quota("0.3") == Threshold("0.3", "seconds", 0.3)
    assert parse_quota("20TFLOP") == Threshold("20TFLOP", "flops", 20e12)
    assert parse_quota("15TFLOPS").amount == 15e12
    with pytest.raises(UnitError, match="cannot be given in tokens"):
        parse_quota("16K")


def test_paper_alpha_is_tokens_readable_in_three_seconds() -> None:
    resolved = resolve_alpha(parse_alpha("3s"), DS660B, HOPPER)
    assert DS660B.kv_bytes_per_token == 48068
    assert resolved.value == tokens_readable(50e9, 48068, 3)
    assert resolved.unit == "tokens"
    # and back, as status shows it: the whole tokens read in just under 3 s
    back = read_seconds(resolved.value, 48068, 50e9)
    assert back is not None and 3 - 48068 / 50e9 < back <= 3
    assert read_seconds(resolved.value, 48068, 0.0) is None  # no rate: no seconds


def test_seed_alpha_bytes_convert_to_tokens() -> None:
    reference = MODEL_PROFILES["reference"]  # 4 layers x 256 B = 1024 B per token
    resolved = resolve_alpha(parse_alpha("8KiB"), reference, HOPPER)
    assert resolved.value == bytes_to_tokens(8192, 1024) == 8
    # For DS 660B one token's KV is 48,068 B, so the seed's 8 KiB is 0 tokens, and we say so.
    zero = resolve_alpha(parse_alpha("8KiB"), DS660B, HOPPER)
    assert zero.value == 0 and "less than one token" in zero.derivation


def test_alpha_in_seconds_counts_every_storage_nic_of_the_node() -> None:
    two_nics = dataclasses.replace(HARDWARE_PROFILES["hopper"], snics_per_node=2)
    assert resolve_alpha(parse_alpha("3s"), DS660B, two_nics).value == \
        tokens_readable(100e9, 48068, 3)


def test_beta_in_seconds_is_tokens_one_gpu_prefills() -> None:
    resolved = resolve_beta(parse_beta("5s"), DS660B, HOPPER, 32000, 429)
    rate = HOPPER.prompt_tokens_per_s(DS660B, 32000, 429)
    assert resolved.value == tokens_processable(rate, 5)
    assert "prompt tokens/s" in resolved.derivation
    # a longer append amortises the cached context less: fewer prompt tokens per second
    assert resolve_beta(parse_beta("5s"), DS660B, HOPPER, 32000, 4000).value < resolved.value
    assert resolve_beta(parse_beta("16K"), DS660B, HOPPER, 32000).value == 16000


def test_quota_in_flops_is_seconds_of_achieved_compute() -> None:
    resolved = resolve_quota(parse_quota("15TFLOP"), HOPPER)
    assert resolved.value == pytest.approx(15e12 / (989e12 * 0.4))
    assert resolved.unit == "seconds"


def test_resolve_scheduler_refuses_beta_below_one_block() -> None:
    config = preset("small")
    tiny = config.scheduler.__class__(**{**{f: getattr(config.scheduler, f) for f in
                                            config.scheduler.__slots__},
                                         "beta": parse_beta("10")})
    broken = config.__class__(config.preset, config.cluster, config.hardware, config.model,
                              config.storage, tiny)
    with pytest.raises(ThresholdError, match="below one block"):
        resolve_scheduler(broken)


def test_config_exposes_core_profiles() -> None:
    config = preset("paper")
    assert config.hardware_profile.gpus_per_node == 8
    assert config.hardware_profile.snic_bandwidth == 50e9
    assert config.model_profile == DS660B
    assert config.cluster.gpus == 48
