"""Batched sampling with a preallocated KV cache: prefill once, then decode token by token, all inside one jitted
function per (batch, prompt bucket, new-token bucket, n) shape.

    results = generate(params, cfg, [prompt_ids, ...], SamplingParams(temperature=1.0, max_tokens=1024,
                       stop_tokens=(128009,)), n=16, seed=0)
    results[i][j].tokens, .logprobs, .finish_reason      # prompt i, sample j

- Prompts are left-padded to a length bucket, so every row writes the same cache slot at each step; each row's RoPE
  positions count its own tokens only, and padding is invisible (segment id 0).
- The n samples of a prompt share a single prefill: the prompt's cache is computed once and broadcast to its n rows.
- Sampling controls: temperature (0 = greedy), top-p, top-k, stop tokens, max_tokens and seed. A row stops at its
  first stop token (which is kept, as vLLM does with EOS) or after max_tokens.
- `logprobs` are the model's own log-probabilities of the sampled tokens: log softmax of the raw logits (T = 1), in
  float32, whatever the sampling temperature. They are what `forward()` gives for those tokens, and what SWEET-RL
  stores as the sampler's reference term.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from sweet_jax.data.batching import bucket_length, default_buckets
from sweet_jax.models import llama
from sweet_jax.models.config import LlamaConfig

MAX_STOP_TOKENS = 8


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    max_tokens: int = 256
    stop_tokens: tuple[int, ...] = ()

    def __post_init__(self):
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.top_k < 0 or self.max_tokens < 1:
            raise ValueError(f"invalid sampling parameters {self}: temperature >= 0, 0 < top_p <= 1, top_k >= 0, "
                             f"max_tokens >= 1")
        if len(self.stop_tokens) > MAX_STOP_TOKENS:
            raise ValueError(f"at most {MAX_STOP_TOKENS} stop tokens, got {len(self.stop_tokens)}")


@dataclasses.dataclass
class Sample:
    tokens: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" (a stop token, included in tokens) or "length"


def sample_logits(logits, keys, temperature, top_p, top_k):
    """One token per row from logits [B, V] (float32), with per-row keys [B] and settings [B]: temperature 0 =
    argmax, top_k 0 = off, top_p 1 = off."""
    greedy = jnp.argmax(logits, axis=-1)
    # An all-greedy batch skips the random draws (a Gumbel sample per vocabulary entry is costly on CPU).
    return jax.lax.cond(jnp.all(temperature <= 0), lambda: greedy,
                        lambda: _draw(logits, keys, temperature, top_p, top_k, greedy))


def _draw(logits, keys, temperature, top_p, top_k, greedy):
    scaled = logits / jnp.maximum(temperature, 1e-6)[:, None]

    def filtered(scaled):
        order = jnp.argsort(-scaled, axis=-1)
        ranked = jnp.take_along_axis(scaled, order, axis=-1)
        probs = jax.nn.softmax(ranked, axis=-1)
        keep = (jnp.cumsum(probs, axis=-1) - probs) < top_p[:, None]  # the smallest prefix reaching top_p
        keep &= (jnp.arange(ranked.shape[-1])[None] < top_k[:, None]) | (top_k[:, None] <= 0)
        keep = keep.at[:, 0].set(True)
        masked = jnp.full_like(scaled, -jnp.inf)
        return jnp.put_along_axis(masked, order, jnp.where(keep, ranked, -jnp.inf), axis=-1, inplace=False)

    scaled = jax.lax.cond(jnp.any((top_p < 1.0) | (top_k > 0)), filtered, lambda x: x, scaled)
    sampled = jax.vmap(lambda k, row: jax.random.categorical(k, row))(keys, scaled)
    return jnp.where(temperature > 0, sampled, greedy)


def _logits(params, cfg, hidden):
    w = llama.lm_head_weight(params, cfg).astype(hidden.dtype)
    return jnp.einsum("bd,dv->bv", hidden, w, preferred_element_type=jnp.float32)


@functools.partial(jax.jit, static_argnames=("cfg", "max_new", "n"))
def _generate(params, cfg: LlamaConfig, tokens, pad, keys, temperature, top_p, top_k, limit, stop, *, max_new: int,
              n: int):
    """tokens [B, P] left-padded (pad[b] leading pads), per-prompt keys and settings [B] -> (new tokens
    [B*n, max_new], logprobs, lengths [B*n], stopped [B*n]). Row b*n + j is sample j of prompt b; it draws from
    fold_in(keys[b], j), so a prompt's samples do not depend on the other prompts of the batch. Row b*n + j runs
    at most limit[b] (<= max_new) steps."""
    b, p = tokens.shape
    segment_ids = (jnp.arange(p)[None] >= pad[:, None]).astype(jnp.int32)
    positions = jnp.maximum(jnp.arange(p)[None] - pad[:, None], 0)
    cache = llama.init_cache(cfg, b, p + max_new)
    hidden, cache = llama.forward_cached(params, cfg, tokens, positions, segment_ids, cache, 0)
    logits = _logits(params, cfg, hidden[:, -1])
    # the n samples of a prompt share its prefill
    cache = jax.tree.map(lambda c, axis: jnp.repeat(c, n, axis=axis), cache, {"k": 1, "v": 1, "segment_ids": 0})
    logits = jnp.repeat(logits, n, axis=0)
    rep = lambda x: jnp.repeat(x, n, axis=0)  # noqa: E731
    next_pos, temperature, top_p, top_k, limit = map(rep, (p - pad, temperature, top_p, top_k, limit))
    rows = b * n
    row_keys = jax.vmap(jax.random.fold_in)(rep(keys), jnp.tile(jnp.arange(n), b))

    def step(carry):
        i, cache, logits, out, lps, done, length = carry
        step_keys = jax.vmap(lambda k: jax.random.fold_in(k, i))(row_keys)
        tok = sample_logits(logits, step_keys, temperature, top_p, top_k).astype(jnp.int32)
        lp = jnp.take_along_axis(logits, tok[:, None], axis=-1)[:, 0] - jax.nn.logsumexp(logits, axis=-1)
        out = out.at[:, i].set(jnp.where(done, 0, tok))
        lps = lps.at[:, i].set(jnp.where(done, 0.0, lp))
        length = length + (~done).astype(jnp.int32)
        done = done | jnp.any(tok[:, None] == stop[None, :], axis=-1) | (length >= limit)
        hidden, cache = llama.forward_cached(params, cfg, tok[:, None], (next_pos + i)[:, None],
                                             jnp.ones((rows, 1), jnp.int32), cache, p + i)
        return i + 1, cache, _logits(params, cfg, hidden[:, 0]), out, lps, done, length

    init = (jnp.int32(0), cache, logits, jnp.zeros((rows, max_new), jnp.int32), jnp.zeros((rows, max_new)),
            jnp.zeros(rows, bool), jnp.zeros(rows, jnp.int32))
    _, _, _, out, lps, done, length = jax.lax.while_loop(lambda c: (c[0] < max_new) & ~jnp.all(c[5]), step, init)
    last = jnp.take_along_axis(out, jnp.maximum(length - 1, 0)[:, None], axis=1)[:, 0]
    stopped = (length > 0) & jnp.any(last[:, None] == stop[None, :], axis=-1)
    return out, lps, length, stopped


def generate(params, cfg: LlamaConfig, prompts: list[list[int]],
             sampling: SamplingParams | list[SamplingParams] = SamplingParams(), *, n: int = 1,
             seed: int | list[int] = 0, prompt_buckets=None, new_buckets=None) -> list[list[Sample]]:
    """Sample n continuations of every prompt (token id lists). `sampling` and `seed` are shared or per prompt; a
    prompt's samples depend only on its own prompt, settings and seed. Returns results[prompt][sample]."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    settings = list(sampling) if isinstance(sampling, (list, tuple)) else [sampling] * len(prompts)
    seeds = list(seed) if isinstance(seed, (list, tuple)) else [seed] * len(prompts)
    if len(settings) != len(prompts) or len(seeds) != len(prompts):
        raise ValueError("sampling and seed must be one value or one per prompt")
    stops = sorted({t for s in settings for t in s.stop_tokens})
    if len(stops) > MAX_STOP_TOKENS:
        raise ValueError(f"at most {MAX_STOP_TOKENS} distinct stop tokens per batch, got {len(stops)}")
    if any(set(s.stop_tokens) != set(settings[0].stop_tokens) for s in settings):
        raise ValueError("prompts batched together must share their stop tokens")
    longest, most = max(len(p) for p in prompts), max(s.max_tokens for s in settings)
    p_len = bucket_length(longest, prompt_buckets or default_buckets(max(longest, 16), 16))
    max_new = bucket_length(most, new_buckets or default_buckets(max(most, 16), 16))
    tokens = np.zeros((len(prompts), p_len), np.int32)
    pad = np.zeros(len(prompts), np.int32)
    for i, ids in enumerate(prompts):
        tokens[i, p_len - len(ids):] = ids
        pad[i] = p_len - len(ids)
    stop = np.full(MAX_STOP_TOKENS, -1, np.int32)
    stop[:len(stops)] = stops
    keys = jax.vmap(jax.random.key)(jnp.asarray(seeds, jnp.uint32))
    col = lambda f, dtype: jnp.asarray([f(s) for s in settings], dtype)  # noqa: E731
    out, lps, length, stopped = jax.device_get(_generate(
        params, cfg, jnp.asarray(tokens), jnp.asarray(pad), keys, col(lambda s: s.temperature, jnp.float32),
        col(lambda s: s.top_p, jnp.float32), col(lambda s: s.top_k, jnp.int32), col(lambda s: s.max_tokens, jnp.int32),
        jnp.asarray(stop), max_new=max_new, n=n))
    results = []
    for b in range(len(prompts)):
        row = []
        for j in range(n):
            r = b * n + j
            k = int(length[r])
            row.append(Sample(out[r, :k].tolist(), lps[r, :k].astype(float).tolist(),
                              "stop" if bool(stopped[r]) else "length"))
        results.append(row)
    return results
