"""ModelConfig: sizes, KV bytes, profile conversion and validation."""

from __future__ import annotations

import pytest

from dualpath_cli.core.profiles import ModelProfile
from dualpath_cli.core.reference_model import MODEL_CONFIGS, ModelConfig, model_config
from dualpath_cli.errors import ConfigError
from dualpath_cli.runtime.model import load_model


def test_tiny_defaults_and_kv_bytes() -> None:
    cfg = ModelConfig()
    assert (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim) == (
        4, 128, 4, 2, 32)
    assert cfg.vocab_size == 260
    # K and V, 2 kv heads x 32 dims, fp16
    assert cfg.kv_bytes_per_token_layer == 2 * 2 * 32 * 2 == 256
    assert cfg.kv_bytes_per_token == 4 * 256


def test_bench_is_larger() -> None:
    tiny, bench = MODEL_CONFIGS["tiny"], MODEL_CONFIGS["bench"]
    assert bench.n_layers == 8 and bench.d_model == 512
    assert bench.active_params > 10 * tiny.active_params
    assert bench.kv_bytes_per_token_layer == 2 * 4 * 64 * 2


def test_active_params_counts_every_matmul_weight() -> None:
    cfg = ModelConfig()
    per_layer = 128 * 128 + 2 * 128 * 64 + 128 * 128 + 3 * 128 * 352
    assert cfg.params_per_layer == per_layer
    assert cfg.active_params == 4 * per_layer + 260 * 128


def test_to_profile_carries_the_same_facts() -> None:
    for cfg in MODEL_CONFIGS.values():
        prof = cfg.to_profile()
        assert isinstance(prof, ModelProfile)
        assert prof.n_layers == cfg.n_layers
        assert prof.kv_bytes_per_token_layer == cfg.kv_bytes_per_token_layer
        assert (prof.n_heads, prof.head_dim) == (cfg.n_heads, cfg.head_dim)
        assert prof.active_params == cfg.active_params
        assert prof.kv_dtype == "fp16" and prof.attention_topk == 0
    assert MODEL_CONFIGS["tiny"].to_profile().name == "reference"
    assert MODEL_CONFIGS["bench"].to_profile().name == "reference-bench"


def test_model_config_overrides_and_loader() -> None:
    cfg = model_config("tiny", {"seed": 7, "n_layers": 2})
    assert cfg.seed == 7 and cfg.n_layers == 2
    model = load_model("tiny", {"n_layers": 2})
    assert model.n_layers == 2 and model.kv_bytes_per_token_layer == 256


@pytest.mark.parametrize(("overrides", "needle"), [
    ({"n_heads": 3}, "multiple of n_kv_heads"),
    ({"head_dim": 31}, "even"),
    ({"n_layers": 0}, "n_layers"),
    ({"n_layers": "4"}, "n_layers"),
    ({"vocab_size": 100}, "vocab_size"),
    ({"kv_dtype": "fp8"}, "kv_dtype"),
    ({"rope_theta": "x"}, "rope_theta"),
    ({"tie_embeddings": 1}, "tie_embeddings"),
    ({"seed": -1}, "seed"),
    ({"max_seq_len": 1 << 20}, "max_seq_len"),
    ({"d_ff": 100000}, "8192"),
    ({"n_layer": 4}, "unknown field"),
])
def test_bad_config_is_one_clear_config_error(overrides: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle) as info:
        model_config("tiny", overrides)
    assert "\n" not in str(info.value)


def test_unknown_profile() -> None:
    with pytest.raises(ConfigError, match="unknown model profile 'huge'.*bench, tiny"):
        model_config("huge")
