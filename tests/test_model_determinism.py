"""Determinism by construction: same tokens and KV bytes however the work is cut.

The end-to-end correctness tests (every policy and read path yields the tokens of a run with
no cache) rest on these: one-pass vs chunked prefill, batched vs alone, prefix KV from bytes
"stored" in an earlier turn vs recomputed, another process with another BLAS thread count.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dualpath_cli.runtime.model import KVCache, ReferenceModel
from dualpath_cli.runtime.model import attention as attention_mod

MODEL = ReferenceModel()
BLOCK = 16  # tokens per Full Block in these tests

prompts = st.lists(st.integers(0, 259), min_size=1, max_size=100)


def _cuts(draw: st.DrawFn, n: int) -> list[int]:
    inner = draw(st.lists(st.integers(1, max(1, n - 1)), max_size=6, unique=True))
    return sorted({c for c in inner if 0 < c < n}) + [n]


@st.composite
def prompt_and_cuts(draw: st.DrawFn) -> tuple[list[int], list[int]]:
    prompt = draw(prompts)
    return prompt, _cuts(draw, len(prompt))


def _chunked(prompt: list[int], cuts: list[int]) -> tuple[np.ndarray, KVCache]:
    cache, start, logits = MODEL.new_cache(), 0, np.empty(0)
    for stop in cuts:
        logits, _ = MODEL.prefill(prompt[start:stop], cache)
        start = stop
    return logits, cache


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prompt_and_cuts())
def test_chunked_prefill_is_bit_identical(case: tuple[list[int], list[int]]) -> None:
    prompt, cuts = case
    whole_logits, whole = MODEL.prefill(prompt)
    logits, chunked = _chunked(prompt, cuts)
    assert chunked.export().tobytes() == whole.export().tobytes()
    assert logits.tobytes() == whole_logits.tobytes()


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prompts, st.integers(1, 12), st.lists(st.integers(0, 255), max_size=40),
       st.integers(1, 6))
def test_prefix_kv_from_an_earlier_turn_gives_the_same_tokens(
        turn1: list[int], n_gen: int, appended: list[int], n_new: int) -> None:
    # turn 1: generate, then "store" the KV as bytes in whole blocks (as the DE persists it)
    gen1, cache1 = MODEL.generate_with_cache(turn1, n_gen)
    stored = cache1.export(0, (cache1.n_tokens // BLOCK) * BLOCK)
    stored = np.frombuffer(stored.tobytes(), np.uint8).reshape(stored.shape)  # via bytes
    # turn 2: context = turn-1 prompt + its output + appended tokens
    prompt2 = turn1 + gen1 + appended
    recomputed, cache_a = MODEL.generate_with_cache(prompt2, n_new)
    reused, cache_b = MODEL.generate_with_cache(prompt2, n_new, stored)
    assert reused == recomputed
    assert cache_b.export().tobytes() == cache_a.export().tobytes()
    # and turn 1's KV is a bit-exact prefix of the recomputed turn-2 KV
    assert cache_a.export(0, stored.shape[1]).tobytes() == stored.tobytes()


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(prompts, min_size=2, max_size=5), st.lists(st.integers(0, 40), min_size=5,
                                                           max_size=5))
def test_batching_does_not_change_results(batch: list[list[int]], cached: list[int]) -> None:
    caches: list[KVCache] = []
    news: list[list[int]] = []
    for prompt, c in zip(batch, cached, strict=False):
        c = min(c, len(prompt) - 1)
        caches.append(MODEL.prefill(prompt[:c], None)[1] if c else MODEL.new_cache())
        news.append(prompt[c:])
    alone = [MODEL.prefill(new, cache.copy()) for new, cache in zip(news, caches, strict=True)]
    logits, batched = MODEL.prefill_batch(news, [c.copy() for c in caches])
    for i, (lg, cache) in enumerate(alone):
        assert logits[i].tobytes() == lg.tobytes()
        assert batched[i].export().tobytes() == cache.export().tobytes()
    # one decode step, batched vs alone
    tokens = [int(np.argmax(lg)) for lg in logits]
    step = MODEL.decode_batch(tokens, batched)
    for i, (token, (_, cache)) in enumerate(zip(tokens, alone, strict=True)):
        assert step[i].tobytes() == MODEL.decode_step(token, cache).tobytes()


def test_layerwise_path_mixing_sources_matches_one_pass() -> None:
    """A PE that gets part of the hit from the DE (as unpacked arrays) and part from its own
    buffer (as bytes), in another model instance, produces the same KV and token."""
    prompt = list(np.random.default_rng(5).integers(0, 256, 90))
    ref_logits, ref = MODEL.prefill(prompt)
    pe = ReferenceModel()
    stored = ref.export(0, 64)
    hidden = pe.embed(prompt[64:])
    new_rows = []
    for layer in range(pe.n_layers):
        past = stored[layer]
        hidden, rows = pe.forward_layer(layer, hidden, past, 64)
        new_rows.append(rows)
    assert pe.next_token(hidden[-1]) == int(np.argmax(ref_logits))
    assert np.stack(new_rows).tobytes() == ref.export(64, 90).tobytes()


def test_attention_query_blocking_does_not_change_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    prompt = list(np.random.default_rng(6).integers(0, 256, 120))
    logits, cache = MODEL.prefill(prompt)
    for name, value in (("_BLOCK_ROWS", 7), ("_BLOCK_ELEMS", 500)):  # few query rows per block
        monkeypatch.setattr(attention_mod, name, value)
        logits2, cache2 = ReferenceModel().prefill(prompt)
        assert logits2.tobytes() == logits.tobytes()
        assert cache2.export().tobytes() == cache.export().tobytes()


_CHILD = """
import hashlib, numpy as np
from dualpath_cli.runtime.model import limit_blas_threads, ReferenceModel
limit_blas_threads(1)
m = ReferenceModel()
prompt = list(np.random.default_rng(7).integers(0, 256, 120))
out, cache = m.generate_with_cache(prompt[:70], 3)
logits, cache = m.prefill(prompt[70:], cache)
print(hashlib.sha256(cache.export().tobytes() + logits.tobytes()).hexdigest(), out)
"""


@pytest.mark.e2e
def test_another_process_with_one_blas_thread_agrees() -> None:
    prompt = list(np.random.default_rng(7).integers(0, 256, 120))
    out, cache = MODEL.generate_with_cache(prompt[:70], 3)
    logits, cache = MODEL.prefill(prompt[70:], cache)
    want = f"{hashlib.sha256(cache.export().tobytes() + logits.tobytes()).hexdigest()} {out}"
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    got = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True,
                         env=env, check=True, timeout=120).stdout.strip()
    assert got == want
