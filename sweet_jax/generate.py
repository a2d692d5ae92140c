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


def sample_logits(logits, key, temperature, top_p, top_k):
    """One token per row from logits [B, V] (float32). temperature 0 = argmax; top_k 0 = off; top_p 1 = off."""
    greedy = jnp.argmax(logits, axis=-1)
    scaled = logits / jnp.maximum(temperature, 1e-6)

    def filtered(scaled):
        order = jnp.argsort(-scaled, axis=-1)
        ranked = jnp.take_along_axis(scaled, order, axis=-1)
        probs = jax.nn.softmax(ranked, axis=-1)
        keep = (jnp.cumsum(probs, axis=-1) - probs) < top_p  # the smallest prefix whose mass reaches top_p
        keep &= (jnp.arange(ranked.shape[-1]) < top_k) | (top_k <= 0)
        keep = keep.at[:, 0].set(True)
        masked = jnp.full_like(scaled, -jnp.inf)
        return jnp.put_along_axis(masked, order, jnp.where(keep, ranked, -jnp.inf), axis=-1, inplace=False)

    scaled = jax.lax.cond((top_p < 1.0) | (top_k > 0), filtered, lambda x: x, scaled)
    sampled = jax.random.categorical(key, scaled, axis=-1)
    return jnp.where(temperature > 0, sampled, greedy)


def _logits(params, cfg, hidden):
    w = llama.lm_head_weight(params, cfg).astype(hidden.dtype)
    return jnp.einsum("bd,dv->bv", hidden, w, preferred_element_type=jnp.float32)


@functools.partial(jax.jit, static_argnames=("cfg", "max_new", "n"))
def _generate(params, cfg: LlamaConfig, tokens, pad, key, temperature, top_p, top_k, stop, limit, *, max_new: int,
              n: int):
    """tokens [B, P] left-padded (pad[b] leading pads) -> (new tokens [B*n, max_new], logprobs, lengths [B*n],
    stopped [B*n]). Row b*n + j is sample j of prompt b. At most `limit` (<= max_new, traced) steps run."""
    b, p = tokens.shape
    segment_ids = (jnp.arange(p)[None] >= pad[:, None]).astype(jnp.int32)
    positions = jnp.maximum(jnp.arange(p)[None] - pad[:, None], 0)
    cache = llama.init_cache(cfg, b, p + max_new)
    hidden, cache = llama.forward_cached(params, cfg, tokens, positions, segment_ids, cache, 0)
    logits = _logits(params, cfg, hidden[:, -1])
    # the n samples of a prompt share its prefill
    cache = jax.tree.map(lambda c, axis: jnp.repeat(c, n, axis=axis), cache, {"k": 1, "v": 1, "segment_ids": 0})
    logits = jnp.repeat(logits, n, axis=0)
    next_pos = jnp.repeat(p - pad, n)
    rows = b * n

    def step(carry):
        i, cache, logits, out, lps, done, length, key = carry
        key, sub = jax.random.split(key)
        tok = sample_logits(logits, sub, temperature, top_p, top_k).astype(jnp.int32)
        lp = jnp.take_along_axis(jax.nn.log_softmax(logits, axis=-1), tok[:, None], axis=-1)[:, 0]
        out = out.at[:, i].set(jnp.where(done, 0, tok))
        lps = lps.at[:, i].set(jnp.where(done, 0.0, lp))
        length = length + (~done).astype(jnp.int32)
        done = done | jnp.any(tok[:, None] == stop[None, :], axis=-1)
        hidden, cache = llama.forward_cached(params, cfg, tok[:, None], (next_pos + i)[:, None],
                                             jnp.ones((rows, 1), jnp.int32), cache, p + i)
        return i + 1, cache, _logits(params, cfg, hidden[:, 0]), out, lps, done, length, key

    init = (jnp.int32(0), cache, logits, jnp.zeros((rows, max_new), jnp.int32), jnp.zeros((rows, max_new)),
            jnp.zeros(rows, bool), jnp.zeros(rows, jnp.int32), key)
    _, _, _, out, lps, done, length, _ = jax.lax.while_loop(
        lambda c: (c[0] < limit) & ~jnp.all(c[5]), step, init)
    return out, lps, length, done


def generate(params, cfg: LlamaConfig, prompts: list[list[int]], sampling: SamplingParams = SamplingParams(), *,
             n: int = 1, seed: int = 0, prompt_buckets=None, new_buckets=None) -> list[list[Sample]]:
    """Sample n continuations of every prompt (token id lists). Returns results[prompt][sample]."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    longest = max(len(p) for p in prompts)
    p_len = bucket_length(longest, prompt_buckets or default_buckets(max(longest, 16), 16))
    max_new = bucket_length(sampling.max_tokens, new_buckets or default_buckets(max(sampling.max_tokens, 16), 16))
    tokens = np.zeros((len(prompts), p_len), np.int32)
    pad = np.zeros(len(prompts), np.int32)
    for i, ids in enumerate(prompts):
        tokens[i, p_len - len(ids):] = ids
        pad[i] = p_len - len(ids)
    stop = np.full(MAX_STOP_TOKENS, -1, np.int32)
    stop[:len(sampling.stop_tokens)] = sampling.stop_tokens
    out, lps, length, stopped = jax.device_get(_generate(
        params, cfg, jnp.asarray(tokens), jnp.asarray(pad), jax.random.key(seed),
        jnp.float32(sampling.temperature), jnp.float32(sampling.top_p), jnp.int32(sampling.top_k), jnp.asarray(stop),
        jnp.int32(sampling.max_tokens), max_new=max_new, n=n))
    results = []
    for b in range(len(prompts)):
        row = []
        for j in range(n):
            r = b * n + j
            k = int(length[r])
            reason = "stop" if bool(stopped[r]) else "length"
            row.append(Sample(out[r, :k].tolist(), lps[r, :k].astype(float).tolist(), reason))
        results.append(row)
    return results
