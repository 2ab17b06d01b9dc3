"""Layered loading: precedence, source of every value, presets and every kind of error."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dualpath_cli.config import (
    KEYS,
    PRESETS,
    LoadedConfig,
    default_system_file,
    default_user_file,
    load_config,
    load_file,
    load_preset,
    preset,
)
from dualpath_cli.config.render import render_yaml
from dualpath_cli.core.profiles import HARDWARE_PROFILES
from dualpath_cli.core.thresholds import tokens_processable, tokens_readable
from dualpath_cli.errors import ConfigError


@pytest.fixture()
def files(tmp_path: Path) -> dict[str, Path]:
    return {"system": tmp_path / "system.yaml", "user": tmp_path / "user.yaml",
            "file": tmp_path / "given.yaml"}


def _load(files: dict[str, Path], env: dict[str, str] | None = None, **kwargs: object
          ) -> LoadedConfig:
    return load_config(env=env or {}, user_file=files["user"], system_file=files["system"],
                       **kwargs)  # type: ignore[arg-type]


def test_defaults_are_the_embedded_deployment(files: dict[str, Path]) -> None:
    loaded = _load(files)
    config = loaded.config
    assert config.preset == "embedded"
    assert str(config.cluster.pd) == "1P2D"
    assert config.hardware.profile == "cpu" and config.model.profile == "reference"
    assert config.storage.block_size == 64 and config.storage.layout == "layer_major"
    assert config.scheduler.z_factor == 1.05
    assert config.scheduler.alpha.text == "3s" and config.scheduler.beta.text == "5s"
    assert loaded.resolved.compute_quota_s == pytest.approx(0.3)
    assert str(loaded.source("cluster.pd")) == "default"
    assert str(loaded.source("hardware.snic_bandwidth")) == "profile:cpu"
    assert str(loaded.source("cluster.gpus_per_node")) == "profile:cpu"


def test_every_key_has_a_value_and_a_source(files: dict[str, Path]) -> None:
    loaded = _load(files, preset="paper")
    assert list(loaded.settings) == [key.path for key in KEYS]
    assert all(str(s.source) for s in loaded.settings.values())


def test_precedence_flags_file_env_user_system_preset(files: dict[str, Path]) -> None:
    files["system"].write_text("scheduler:\n  alpha: 1KiB\n  beta: 1K\n  z_factor: 1.1\n"
                               "  fetch_period: 1s\n  random_seed: 1\n")
    files["user"].write_text("scheduler:\n  alpha: 2KiB\n  beta: 2K\n  z_factor: 1.2\n"
                             "  fetch_period: 2s\n")
    files["file"].write_text("scheduler:\n  alpha: 3KiB\n  beta: 3K\n")
    env = {"DUALPATH_SCHEDULER__ALPHA": "4KiB", "DUALPATH_SCHEDULER__Z_FACTOR": "1.4"}
    loaded = _load(files, env, preset="small", config_file=files["file"],
                   overrides=["scheduler.alpha=5KiB"])
    sched = loaded.config.scheduler
    assert sched.alpha.text == "5KiB" and str(loaded.source("scheduler.alpha")) == "flag:--set"
    assert sched.beta.text == "3K"
    assert str(loaded.source("scheduler.beta")) == f"file:{files['file']}:3"
    assert sched.z_factor == 1.4
    assert str(loaded.source("scheduler.z_factor")) == "env:DUALPATH_SCHEDULER__Z_FACTOR"
    assert sched.fetch_period == 2.0
    assert str(loaded.source("scheduler.fetch_period")) == f"user:{files['user']}:5"
    assert sched.random_seed == 1
    assert str(loaded.source("scheduler.random_seed")) == f"system:{files['system']}:6"
    assert sched.compute_quota.text == "15TFLOP"
    assert str(loaded.source("scheduler.compute_quota")) == "preset:small"
    assert str(loaded.source("preset")) == "flag:--preset"


def test_later_set_flags_win(files: dict[str, Path]) -> None:
    loaded = _load(files, overrides=["scheduler.beta=8K", "scheduler.beta=9K"])
    assert loaded.resolved.beta_tokens == 9000


def test_preset_can_come_from_env_or_a_file(files: dict[str, Path]) -> None:
    files["user"].write_text("preset: medium\n")
    loaded = _load(files)
    assert loaded.config.preset == "medium" and loaded.config.scheduler.layerwise_prefill
    assert str(loaded.source("preset")) == f"user:{files['user']}:1"
    assert str(loaded.source("scheduler.layerwise_prefill")) == "preset:medium"
    from_env = _load(files, {"DUALPATH_PRESET": "large"})
    assert from_env.config.preset == "large" and from_env.config.scheduler.hierarchical


def test_explicit_values_beat_the_profile(files: dict[str, Path]) -> None:
    files["user"].write_text("hardware:\n  profile: hopper\n  snic_bandwidth: 200Gbps\n")
    loaded = _load(files)
    assert loaded.config.hardware.snic_bandwidth == 25e9
    assert loaded.config.hardware.dram_bandwidth == HARDWARE_PROFILES["hopper"].dram_bandwidth
    assert str(loaded.source("hardware.dram_bandwidth")) == "profile:hopper"
    assert loaded.config.cluster.gpus_per_node == 8


def test_env_values_are_yaml_scalars(files: dict[str, Path]) -> None:
    env = {"DUALPATH_SCHEDULER__LAYERWISE_PREFILL": "true", "DUALPATH_STORAGE__BLOCK_SIZE": "128",
           "DUALPATH_CONFIG_HOME": "/nowhere", "DUALPATH_TOKEN": "ignored"}
    config = _load(files, env).config
    assert config.scheduler.layerwise_prefill is True and config.storage.block_size == 128


def test_default_file_locations_follow_env() -> None:
    assert default_user_file({"DUALPATH_CONFIG_HOME": "/a"}) == Path("/a/config.yaml")
    assert default_user_file({"XDG_CONFIG_HOME": "/x"}) == Path("/x/dualpath/config.yaml")
    assert default_user_file({}).parts[-3:] == (".config", "dualpath", "config.yaml")
    assert default_system_file({}) == Path("/etc/dualpath/config.yaml")
    assert default_system_file({"DUALPATH_SYSTEM_CONFIG": "/s.yaml"}) == Path("/s.yaml")


def test_user_file_found_through_config_home(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("cluster:\n  pd: 3P5D\n")
    loaded = load_config(env={"DUALPATH_CONFIG_HOME": str(tmp_path),
                              "DUALPATH_SYSTEM_CONFIG": str(tmp_path / "none.yaml")})
    assert str(loaded.config.cluster.pd) == "3P5D"
    assert str(loaded.source("cluster.pd")) == f"user:{tmp_path / 'config.yaml'}:2"


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_loads_and_resolves(name: str) -> None:
    loaded = load_preset(name)
    assert loaded.config.preset == name
    assert loaded.resolved.beta_tokens >= loaded.config.storage.block_size


def test_seed_presets_match_section_8_1() -> None:
    small, medium, large = preset("small"), preset("medium"), preset("large")
    assert (str(small.cluster.pd), small.scheduler.alpha.amount, small.scheduler.beta.amount,
            small.scheduler.compute_quota.amount) == ("1P2D", 4000, 8000, 15e12)
    assert (str(medium.cluster.pd), medium.scheduler.alpha.amount,
            medium.scheduler.beta.amount, medium.scheduler.layerwise_prefill) == \
        ("2P4D", 8000, 16000, True)
    assert (large.scheduler.alpha.amount, large.scheduler.beta.amount,
            large.scheduler.hierarchical) == (16000, 32000, True)


def test_paper_preset_resolves_by_the_papers_rules() -> None:
    loaded = load_preset("paper")
    config = loaded.config
    assert str(config.cluster.pd) == "2P4D" and config.cluster.gpus_per_node == 8
    assert config.hardware.snic_bandwidth == 50e9 and config.hardware.cnic_bandwidth == 50e9
    assert loaded.resolved.alpha_tokens == tokens_readable(50e9, 48068, 3)
    assert (config.scheduler.reference_context, config.scheduler.reference_append) == \
        (32000, 429)
    rate = config.hardware_profile.prompt_tokens_per_s(config.model_profile, 32000, 429)
    assert loaded.resolved.beta_tokens == tokens_processable(rate, 5)
    assert loaded.resolved.compute_quota_s == pytest.approx(0.3)


def test_custom_profile_needs_every_field(files: dict[str, Path]) -> None:
    files["user"].write_text("model:\n  profile: custom\n  n_layers: 2\n")
    with pytest.raises(ConfigError) as err:
        _load(files)
    assert str(err.value).startswith(f"{files['user']}:2: model.kv_bytes_per_token_layer: "
                                     "required when model.profile is 'custom'")
    files["user"].write_text("model:\n  profile: custom\n  n_layers: 2\n"
                             "  kv_bytes_per_token_layer: 1KiB\n  n_heads: 2\n  head_dim: 8\n"
                             "  active_params: 1M\n  attention_topk: 0\n  kv_dtype: bf16\n"
                             "  indexer_flops_per_token_layer: 0\n")
    config = _load(files).config
    assert config.model.kv_bytes_per_token == 2048 and config.model.active_params == 10**6


# ---- errors: one line naming file, line, field and reason ---------------------------------


@pytest.mark.parametrize(("text", "expected"), [
    ("scheduler:\n  alpha: [1\n", ":3: malformed YAML"),
    ("scheduler:\n  alpah: 3s\n", ":2: scheduler.alpah: unknown key; did you mean 'alpha'?"),
    ("schedular:\n  alpha: 3s\n", ":1: schedular: unknown section; did you mean 'scheduler'?"),
    ("cluster:\n  pd: 2X4D\n", ":2: cluster.pd: invalid P/D spec '2X4D'"),
    ("hardware:\n  profile: hopper\n  snic_bandwidth: -5GB/s\n",
     ":3: hardware.snic_bandwidth: invalid bandwidth '-5GB/s'"),
    ("hardware:\n  dram_bandwidth: 0GB/s\n", ":2: hardware.dram_bandwidth: '0GB/s' must be "
     "greater than zero"),
    ("storage:\n  block_size: lots\n", ":2: storage.block_size: invalid token count 'lots'"),
    ("scheduler:\n  layerwise_prefill: maybe\n",
     ":2: scheduler.layerwise_prefill: expected true or false"),
    ("cluster:\n  gpus_per_node: 2.5\n", ":2: cluster.gpus_per_node: expected a whole number"),
    ("scheduler:\n  z_factor: 0.9\n", ":2: scheduler.z_factor: 0.9 must be at least 1"),
    ("hardware:\n  mfu: 1.5\n", ":2: hardware.mfu: must be in (0, 1]"),
    ("scheduler:\n  beta: 10\n", ":2: scheduler.beta: 10 resolves to 10 tokens, below one block"),
    ("scheduler:\n  compute_quota: 0s\n", ":2: scheduler.compute_quota: 0s must be greater"),
    ("scheduler:\n  alpha: -1K\n", ":2: scheduler.alpha: invalid alpha '-1K'"),
    ("scheduler:\n  read_side: fastest\n", ":2: scheduler.read_side: 'fastest' is not one of"),
    ("scheduler:\n  alpha:\n", ":2: scheduler.alpha: empty value"),
    ("scheduler:\n  alpha:\n    x: 1\n", ":3: scheduler.alpha: expected a single value"),
    ("scheduler: 3\n", ":1: scheduler: expected a mapping of keys"),
    ("- a\n- b\n", ":1: expected a mapping of sections"),
    ("scheduler:\n  alpha: 3s\n  alpha: 4s\n", ":3: scheduler: duplicate key 'alpha'"),
    ("preset: papr\n", ":1: preset: unknown preset 'papr'; did you mean 'paper'?"),
])
def test_file_errors_name_file_line_field_and_reason(tmp_path: Path, text: str,
                                                      expected: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_file(path)
    message = str(err.value)
    assert message.startswith(f"{path}{expected}"), message
    assert "\n" not in message
    assert err.value.exit_code == 2


def test_missing_config_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_file(tmp_path / "absent.yaml")


def test_env_errors_name_the_variable(files: dict[str, Path]) -> None:
    with pytest.raises(ConfigError) as err:
        _load(files, {"DUALPATH_HARDWARE__SNIC_BANDWIDTH": "-5GB/s"})
    assert str(err.value).startswith("env DUALPATH_HARDWARE__SNIC_BANDWIDTH: "
                                     "hardware.snic_bandwidth: invalid bandwidth")
    with pytest.raises(ConfigError, match="did you mean 'DUALPATH_SCHEDULER__ALPHA'"):
        _load(files, {"DUALPATH_SCHEDULER__ALPAH": "3s"})


def test_flag_errors_name_the_flag(files: dict[str, Path]) -> None:
    with pytest.raises(ConfigError, match=r"^--set: scheduler\.alpah: unknown key; did you mean "
                                          r"'scheduler\.alpha'\?"):
        _load(files, overrides=["scheduler.alpah=3s"])
    with pytest.raises(ConfigError, match="expected key=value"):
        _load(files, overrides=["scheduler.alpha"])
    with pytest.raises(ConfigError, match=r"^--preset: preset: unknown preset 'tiny'"):
        _load(files, preset="tiny")


def test_threshold_error_points_at_the_source_of_the_threshold(files: dict[str, Path]) -> None:
    files["system"].write_text("scheduler:\n\n  beta: 100us\n")
    with pytest.raises(ConfigError) as err:
        _load(files)
    assert str(err.value).startswith(f"{files['system']}:3: scheduler.beta: 100us resolves to 1 "
                                     "tokens, below one block (64 tokens)")


# ---- property: any valid override set survives config init's YAML --------------------------

_CHOICES = {
    "preset": ["embedded", "small", "paper"],
    "cluster.pd": ["1P1D", "3P7D", "48P96D"],
    "hardware.snic_bandwidth": ["100Gbps", "12.5GB/s", "25000000000"],
    "model.profile": ["ds27b", "qwen32b", "reference"],
    "storage.root": ["/mnt/3fs/kv", "relative dir", "~/kv: odd"],
    "storage.codec": ["bf16", "fp8_e4m3"],
    "scheduler.alpha": ["8KiB", "2M", "16K tokens", "1.5s", "0"],
    "scheduler.beta": ["16K", "64", "5s"],
    "scheduler.compute_quota": ["20TFLOP", "0.25", "1s"],
    "scheduler.dynamic_alpha": ["true", "off"],
}


@st.composite
def _overrides(draw: st.DrawFn) -> list[str]:
    keys = draw(st.lists(st.sampled_from(sorted(_CHOICES)), unique=True, max_size=6))
    return [f"{key}={draw(st.sampled_from(_CHOICES[key]))}" for key in keys]


@given(_overrides())
@settings(max_examples=40, deadline=None)
def test_init_yaml_round_trips_any_overrides(overrides: list[str]) -> None:
    try:
        loaded = load_config(overrides=overrides, environment=False)
    except ConfigError:
        return  # e.g. a beta below one block for a small model: refused, nothing to write
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "c.yaml"
        path.write_text(render_yaml(loaded))
        reread = load_file(path)
    assert reread.config == loaded.config
    assert reread.resolved == loaded.resolved
