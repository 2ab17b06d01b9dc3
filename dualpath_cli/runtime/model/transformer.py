"""The reference decoder: embed, layer by layer forward, logits, and greedy generation.

The layerwise API (:meth:`ReferenceModel.forward_layer`) is what the engines drive, so they
can overlap loading layer ``l + 1``'s KV with computing layer ``l``. The convenience methods
(:meth:`~ReferenceModel.prefill`, :meth:`~ReferenceModel.decode_step`,
:meth:`~ReferenceModel.generate`) are built from it. Every row is computed independently of
the others (see :mod:`.numerics`), so results never depend on chunking, batching or where the
prefix KV came from.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from dualpath_cli.core.reference_model import ModelConfig, model_config
from dualpath_cli.core.tokenizer import EOS
from dualpath_cli.errors import UsageError
from dualpath_cli.runtime.model.attention import attend
from dualpath_cli.runtime.model.kvcache import KVCache, KVLayoutError, LayerKV
from dualpath_cli.runtime.model.numerics import (
    KV_K_LIMIT,
    KV_V_LIMIT,
    rms_norm,
    round_kv,
    silu,
)
from dualpath_cli.runtime.model.rope import RopeTable, apply_rope
from dualpath_cli.runtime.model.weights import ModelWeights, init_weights, linear

__all__ = ["PastKV", "ReferenceModel", "load_model"]

PastKV = LayerKV | np.ndarray | None
"""A layer's earlier KV: unpacked, packed Layer Block rows (uint8 ``[T, bytes]``), or none."""


class ReferenceModel:
    """Llama-style decoder in numpy: RMSNorm, RoPE, GQA, SwiGLU, greedy decoding.

    Args:
        config: sizes and seed (default: the ``tiny`` profile).
        weights: explicit weights (default: generated from ``config.seed``).
    """

    def __init__(self, config: ModelConfig | None = None,
                 weights: ModelWeights | None = None) -> None:
        self.config = config or ModelConfig()
        self.weights = weights or init_weights(self.config)
        self._rope = RopeTable(self.config.head_dim, self.config.rope_theta)
        self.n_layers: int = self.config.n_layers
        self.kv_bytes_per_token_layer: int = self.config.kv_bytes_per_token_layer

    def new_cache(self, capacity: int = 0) -> KVCache:
        """An empty KV cache for one sequence."""
        return KVCache(self.config, capacity)

    # -- layerwise API -------------------------------------------------------------------

    def embed(self, tokens: Sequence[int] | np.ndarray) -> np.ndarray:
        """Hidden states ``[T, d_model]`` float64 of token ids.

        Raises:
            UsageError: a token id outside the vocabulary.
        """
        ids = np.asarray(tokens, dtype=np.int64).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= self.config.vocab_size):
            bad = int(ids[(ids < 0) | (ids >= self.config.vocab_size)][0])
            raise UsageError(f"token id {bad} is outside the vocabulary "
                             f"[0, {self.config.vocab_size})")
        return self.weights.embed[ids] * self.weights.embed_scale

    def forward_layer(self, layer: int, hidden: np.ndarray, past_kv: PastKV = None,
                      start: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Run decoder layer ``layer`` on new tokens of one sequence.

        Args:
            layer: layer index.
            hidden: ``[T, d_model]`` hidden states of the new tokens.
            past_kv: this layer's KV of the earlier tokens: packed rows (uint8
                ``[start, bytes]``), a :class:`LayerKV`, or None.
            start: position of the first new token; must equal the number of past rows
                (checked when given).

        Returns:
            The layer's output hidden states and the new tokens' packed KV (uint8
            ``[T, kv_bytes_per_token_layer]``), already rounded to what storage keeps.
        """
        if start is not None and start != _past_len(past_kv):
            raise UsageError(f"forward_layer: start {start} but {_past_len(past_kv)} past "
                             f"KV rows; the new tokens must directly follow the past ones")
        outs, kvs = self.forward_layer_batch(layer, [hidden], [past_kv])
        return outs[0], kvs[0].pack()

    def forward_layer_batch(self, layer: int, hiddens: Sequence[np.ndarray],
                            pasts: Sequence[PastKV]) -> tuple[list[np.ndarray], list[LayerKV]]:
        """:meth:`forward_layer` for several sequences at once (linear maps batched).

        The results are bit-identical to calling :meth:`forward_layer` on each sequence;
        the new KV comes back unpacked (``LayerKV.pack()`` gives the rows).
        """
        cfg = self.config
        if not 0 <= layer < cfg.n_layers:
            raise UsageError(f"layer {layer} is outside [0, {cfg.n_layers})")
        w = self.weights.layers[layer]
        if len(hiddens) != len(pasts):
            raise UsageError(f"forward_layer_batch: {len(hiddens)} hiddens, {len(pasts)} pasts")
        past_kv = [self._unpack_past(p) for p in pasts]
        sizes = [h.shape[0] for h in hiddens]
        x = np.concatenate(hiddens) if len(hiddens) > 1 else np.asarray(hiddens[0])
        h = rms_norm(x, w.attn_norm, cfg.norm_eps)
        q = linear(h, w.wq).reshape(-1, cfg.n_heads, cfg.head_dim)
        k = linear(h, w.wk).reshape(-1, cfg.n_kv_heads, cfg.head_dim)
        v = linear(h, w.wv).reshape(-1, cfg.n_kv_heads, cfg.head_dim)
        attn_rows, new_kv, start = [], [], 0
        for size, past in zip(sizes, past_kv, strict=True):
            n_past = 0 if past is None else past.n_tokens
            if n_past + size > cfg.max_seq_len:
                raise UsageError(f"sequence of {n_past + size} tokens exceeds the model's "
                                 f"max_seq_len {cfg.max_seq_len}")
            cos, sin = self._rope.lookup(np.arange(n_past, n_past + size))
            sl = slice(start, start + size)
            kv = LayerKV(round_kv(apply_rope(k[sl], cos, sin), KV_K_LIMIT),
                         round_kv(v[sl], KV_V_LIMIT))
            k_all = kv.k if past is None else np.concatenate([past.k, kv.k])
            v_all = kv.v if past is None else np.concatenate([past.v, kv.v])
            attn_rows.append(attend(apply_rope(q[sl], cos, sin), k_all, v_all, n_past))
            new_kv.append(kv)
            start += size
        x = x + linear(np.concatenate(attn_rows), w.wo)
        h = rms_norm(x, w.mlp_norm, cfg.norm_eps)
        x = x + linear(silu(linear(h, w.w_gate)) * linear(h, w.w_up), w.w_down)
        return np.split(x, np.cumsum(sizes)[:-1]), new_kv

    def logits(self, hidden: np.ndarray) -> np.ndarray:
        """Output logits ``[N, vocab]`` of hidden states ``[N, d_model]`` (final norm applied)."""
        h = rms_norm(np.atleast_2d(hidden), self.weights.final_norm, self.config.norm_eps)
        return linear(h, self.weights.lm_head)

    def next_token(self, hidden_last: np.ndarray) -> int:
        """Greedy next token (lowest id among ties) from one position's hidden state."""
        return int(np.argmax(self.logits(hidden_last)[0]))

    # -- whole-sequence helpers ------------------------------------------------------------

    def prefill(self, tokens: Sequence[int] | np.ndarray,
                cache: KVCache | None = None) -> tuple[np.ndarray, KVCache]:
        """Process new tokens after those in ``cache``; returns last-token logits and the cache.

        ``cache`` (a new one when None) is extended in place with the new tokens' KV.
        """
        logits, caches = self.prefill_batch([tokens], [cache])
        return logits[0], caches[0]

    def prefill_batch(self, token_lists: Sequence[Sequence[int] | np.ndarray],
                      caches: Sequence[KVCache | None]) -> tuple[np.ndarray, list[KVCache]]:
        """:meth:`prefill` of several sequences together; logits ``[B, vocab]``."""
        out_caches = [c if c is not None else self.new_cache() for c in caches]
        if any(len(t) == 0 for t in token_lists):
            raise UsageError("prefill needs at least one new token per sequence")
        hiddens = [self.embed(t) for t in token_lists]
        per_layer: list[list[LayerKV]] = []
        for layer in range(self.n_layers):
            pasts = [c.layer_bytes(layer) for c in out_caches]
            hiddens, kvs = self.forward_layer_batch(layer, hiddens, pasts)
            per_layer.append(kvs)
        for i, cache in enumerate(out_caches):
            cache.extend([per_layer[layer][i] for layer in range(self.n_layers)])
        return self.logits(np.stack([h[-1] for h in hiddens])), out_caches

    def decode_step(self, token: int, cache: KVCache) -> np.ndarray:
        """Feed one token after ``cache`` (extended in place); returns its logits ``[vocab]``."""
        return self.prefill([token], cache)[0]

    def decode_batch(self, tokens: Sequence[int], caches: Sequence[KVCache]) -> np.ndarray:
        """One decode step for several sequences; logits ``[B, vocab]``."""
        return self.prefill_batch([[t] for t in tokens], list(caches))[0]

    def generate_with_cache(self, prompt: Sequence[int], n_new: int,
                            cached_kv: KVCache | np.ndarray | None = None, *,
                            stop_at_eos: bool = False) -> tuple[list[int], KVCache]:
        """Greedy continuation of ``prompt``, reusing the KV of a prefix of it when given.

        Args:
            prompt: the full prompt token ids.
            n_new: tokens to generate.
            cached_kv: KV of ``prompt[:T]`` (a cache, or bytes ``[n_layers, T, bytes]``); it
                is not modified. When it covers the whole prompt, the last token is recomputed
                (its KV comes out bit-identical) to obtain its logits.
            stop_at_eos: stop early after generating EOS.

        Returns:
            The generated tokens and a cache holding the prompt and every generated token
            except the last (whose KV is computed only when it is fed back).
        """
        if n_new < 0:
            raise UsageError(f"n_new must be >= 0, got {n_new}")
        if len(prompt) == 0:
            raise UsageError("generate needs a non-empty prompt")
        cache = self._start_cache(cached_kv, len(prompt))
        out: list[int] = []
        if n_new == 0:
            return out, cache
        logits, _ = self.prefill(prompt[cache.n_tokens:], cache)
        while True:
            token = int(np.argmax(logits))
            out.append(token)
            if len(out) == n_new or (stop_at_eos and token == EOS):
                return out, cache
            logits = self.decode_step(token, cache)

    def generate(self, prompt: Sequence[int], n_new: int,
                 cached_kv: KVCache | np.ndarray | None = None, *,
                 stop_at_eos: bool = False) -> list[int]:
        """Greedy continuation of ``prompt`` (see :meth:`generate_with_cache`)."""
        return self.generate_with_cache(prompt, n_new, cached_kv, stop_at_eos=stop_at_eos)[0]

    # -- internals -------------------------------------------------------------------------

    def _start_cache(self, cached_kv: KVCache | np.ndarray | None, n_prompt: int) -> KVCache:
        if cached_kv is None:
            return self.new_cache(n_prompt)
        if isinstance(cached_kv, KVCache):
            cache = cached_kv.copy()
        else:
            cache = KVCache.from_bytes(self.config, cached_kv)
        if cache.n_tokens > n_prompt:
            raise UsageError(f"cached KV has {cache.n_tokens} tokens but the prompt only "
                             f"{n_prompt}")
        if cache.n_tokens == n_prompt:
            cache.truncate(n_prompt - 1)
        return cache

    def _unpack_past(self, past: PastKV) -> LayerKV | None:
        if past is None or isinstance(past, LayerKV):
            return past
        if isinstance(past, np.ndarray):
            return None if past.shape[0] == 0 else LayerKV.unpack(past, self.config)
        raise KVLayoutError(f"past KV must be LayerKV, uint8 rows or None, got {type(past)}")


def _past_len(past: PastKV) -> int:
    if past is None:
        return 0
    if isinstance(past, LayerKV):
        return past.n_tokens
    return int(past.shape[0])


def load_model(name: str = "tiny", overrides: Mapping[str, Any] | None = None) -> ReferenceModel:
    """The reference model of a built-in profile (the engines' model factory).

    Raises:
        ConfigError: unknown profile, field or bad value.
    """
    return ReferenceModel(model_config(name, overrides))
