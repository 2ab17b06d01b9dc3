"""The reference decoder: shapes, agreement with a plain float implementation, GQA, outputs."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dualpath_cli.core.reference_model import ModelConfig, model_config
from dualpath_cli.core.tokenizer import ByteTokenizer
from dualpath_cli.errors import UsageError
from dualpath_cli.runtime.model import ReferenceModel
from dualpath_cli.runtime.model.attention import attend, naive_attend
from dualpath_cli.runtime.model.numerics import KV_K_LIMIT, KV_V_LIMIT, round_kv
from dualpath_cli.runtime.model.weights import init_weights

MODEL = ReferenceModel()
CFG = MODEL.config


def _naive_forward(model: ReferenceModel, tokens: list[int]) -> np.ndarray:
    """Textbook float64 Llama forward (no quantization), using the same weights."""
    cfg, w = model.config, model.weights
    t, hd, half = len(tokens), cfg.head_dim, cfg.head_dim // 2

    def norm(x: np.ndarray, g: np.ndarray) -> np.ndarray:
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + cfg.norm_eps) * g

    def rope(x: np.ndarray) -> np.ndarray:  # complex-number form of rotate-half RoPE
        freq = cfg.rope_theta ** (-np.arange(half) * 2.0 / hd)
        z = (x[..., :half] + 1j * x[..., half:]) * np.exp(1j * np.arange(t)[:, None, None] * freq)
        return np.concatenate([z.real, z.imag], axis=-1)

    x = w.embed[tokens] * w.embed_scale
    for lw in w.layers:
        h = norm(x, lw.attn_norm)
        q = rope((h @ (lw.wq.w * lw.wq.scale)).reshape(t, cfg.n_heads, hd))
        k = rope((h @ (lw.wk.w * lw.wk.scale)).reshape(t, cfg.n_kv_heads, hd))
        v = (h @ (lw.wv.w * lw.wv.scale)).reshape(t, cfg.n_kv_heads, hd)
        x = x + naive_attend(q, k, v, 0) @ (lw.wo.w * lw.wo.scale)
        h = norm(x, lw.mlp_norm)
        gate, up = h @ (lw.w_gate.w * lw.w_gate.scale), h @ (lw.w_up.w * lw.w_up.scale)
        x = x + (gate / (1 + np.exp(-gate)) * up) @ (lw.w_down.w * lw.w_down.scale)
    return norm(x, w.final_norm) @ (w.lm_head.w * w.lm_head.scale)


@pytest.mark.parametrize("tie", [False, True])
def test_matches_plain_float_llama(tie: bool) -> None:
    model = ReferenceModel(model_config("tiny", {"tie_embeddings": tie}))
    tokens = ByteTokenizer().encode("The reference model is a plain Llama.", bos=True)
    logits, cache = model.prefill(tokens)
    want = _naive_forward(model, tokens)
    assert logits.shape == (CFG.vocab_size,)
    assert np.max(np.abs(logits - want[-1])) < 0.02 * np.std(want[-1])
    assert int(np.argmax(logits)) == int(np.argmax(want[-1]))
    assert cache.n_tokens == len(tokens)


def test_layerwise_shapes() -> None:
    h = MODEL.embed([1, 2, 3])
    assert h.shape == (3, CFG.d_model) and h.dtype == np.float64
    h2, kv = MODEL.forward_layer(0, h)
    assert h2.shape == h.shape
    assert kv.dtype == np.uint8 and kv.shape == (3, CFG.kv_bytes_per_token_layer)
    h3, kv2 = MODEL.forward_layer(0, MODEL.embed([4]), kv, 3)
    assert h3.shape == (1, CFG.d_model) and kv2.shape == (1, 256)
    assert MODEL.logits(h3).shape == (1, CFG.vocab_size)
    assert 0 <= MODEL.next_token(h3[-1]) < CFG.vocab_size
    h0, kv0 = MODEL.forward_layer(1, MODEL.embed([]), kv, 3)  # no new tokens: a no-op
    assert h0.shape == (0, CFG.d_model) and kv0.shape == (0, 256)


@pytest.mark.parametrize(("n_heads", "n_kv", "n_past", "t"), [
    (4, 2, 0, 9), (4, 2, 5, 3), (4, 4, 3, 4), (4, 1, 0, 6), (8, 2, 7, 1)])
def test_gqa_matches_naive_per_head_attention(n_heads: int, n_kv: int, n_past: int,
                                              t: int) -> None:
    rng = np.random.default_rng(n_heads * 100 + n_kv * 10 + n_past)
    hd = 16
    q = rng.standard_normal((t, n_heads, hd)) * 2
    k = round_kv(rng.standard_normal((n_past + t, n_kv, hd)) * 2, KV_K_LIMIT)
    v = round_kv(rng.standard_normal((n_past + t, n_kv, hd)), KV_V_LIMIT)
    got = attend(q, k, v, n_past)
    want = naive_attend(q, k, v, n_past)
    assert got.shape == (t, n_heads * hd)
    assert np.allclose(got, want, atol=2e-3)


def test_gqa_shares_kv_heads_between_query_heads() -> None:
    """With GQA, query heads of one group given equal queries give equal outputs."""
    rng = np.random.default_rng(3)
    q1 = rng.standard_normal((5, 1, 16))
    q = np.concatenate([q1, q1, rng.standard_normal((5, 2, 16))], axis=1)  # group 0 = heads 0,1
    kv = round_kv(rng.standard_normal((5, 2, 16)), KV_V_LIMIT)
    out = attend(q, kv, kv, 0).reshape(5, 4, 16)
    assert np.array_equal(out[:, 0], out[:, 1])
    assert not np.allclose(out[:, 1], out[:, 2])


def test_weights_are_a_function_of_the_seed() -> None:
    a, b = init_weights(CFG), init_weights(CFG)
    other = init_weights(model_config("tiny", {"seed": 1}))
    assert np.array_equal(a.layers[2].w_up.w, b.layers[2].w_up.w)
    assert np.array_equal(a.lm_head.w, b.lm_head.w)
    assert not np.array_equal(a.layers[2].w_up.w, other.layers[2].w_up.w)
    for lin in (a.layers[0].wq, a.layers[3].w_down, a.lm_head):
        assert np.array_equal(lin.w, np.rint(lin.w)) and np.max(np.abs(lin.w)) <= 127


def test_activations_stay_sane() -> None:
    tokens = np.random.default_rng(0).integers(0, 256, 64)
    h = MODEL.embed(tokens)
    for layer in range(CFG.n_layers):
        h, _ = MODEL.forward_layer(layer, h)
        rms = math.sqrt(float(np.mean(h * h)))
        assert 0.5 < rms < 3.0
    assert 1.0 < float(np.std(MODEL.logits(h[-1:]))) < 20.0


def test_greedy_output_varies_with_the_prompt() -> None:
    tok = ByteTokenizer()
    prompts = ["Hello, world", "The quick brown fox", "def main():", "aaaaaaa", "1 2 3 4 5",
               "Agents call tools", "KV cache", "storage NIC"]
    outs = [tuple(MODEL.generate(tok.encode(p, bos=True), 16)) for p in prompts]
    assert len(set(outs)) == len(outs)  # different prompts, different continuations
    for out in outs:
        assert len(set(out)) >= 4  # not one token repeated
    assert len({out[0] for out in outs}) >= 4


def test_generate_contract() -> None:
    prompt = [256, 72, 105]
    out, cache = MODEL.generate_with_cache(prompt, 5)
    assert len(out) == 5 and cache.n_tokens == len(prompt) + 4
    assert MODEL.generate(prompt, 0) == []
    assert MODEL.generate(prompt, 5) == out


def test_bad_inputs_are_usage_errors() -> None:
    with pytest.raises(UsageError, match="token id 999 is outside"):
        MODEL.embed([1, 999])
    with pytest.raises(UsageError, match="start 2 but 3 past"):
        _, kv = MODEL.forward_layer(0, MODEL.embed([1, 2, 3]))
        MODEL.forward_layer(0, MODEL.embed([4]), kv, 2)
    with pytest.raises(UsageError, match=r"layer 4 is outside \[0, 4\)"):
        MODEL.forward_layer(4, MODEL.embed([1]))
    with pytest.raises(UsageError, match="non-empty prompt"):
        MODEL.generate([], 3)
    with pytest.raises(UsageError, match="cached KV has 3 tokens but the prompt only 2"):
        _, cache = MODEL.prefill([1, 2, 3])
        MODEL.generate([1, 2], 1, cache)
    short = ReferenceModel(ModelConfig(max_seq_len=8))
    with pytest.raises(UsageError, match="exceeds the model's max_seq_len 8"):
        short.prefill(list(range(9)))
