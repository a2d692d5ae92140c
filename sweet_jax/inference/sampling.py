"""Batched sampling with a preallocated KV cache: one jitted prefill, then token-by-token decoding in a jitted
while-loop, compiled once per (batch, prompt bucket, new-token bucket, n) shape.

    params = models.unstack_layers(params)      # the inference layout, once (see there)
    results = generate(params, cfg, [prompt_ids, ...], SamplingParams(temperature=1.0, max_tokens=1024,
                       stop_tokens=(128009,)), n=16, seed=0)
    results[i][j].tokens, .logprobs, .finish_reason      # prompt i, sample j

    for deltas in generate_stream(params, cfg, prompts, sampling, segment=16):   # new tokens every 16 steps
        deltas[i][j].tokens, .finish_reason (None until the sample's last delta)

- Prompts are left-padded to a length bucket, so every row writes the same cache slot at each step; each row's RoPE
  positions count its own tokens only, and padding is invisible (segment id 0).
- The n samples of a prompt share a single prefill: the prompt's cache is computed once and broadcast to its n rows.
- Decoding runs in segments that resume from the state left on the device (cache donated, so updated in place):
  `generate` runs one segment to the end; `generate_stream` yields between segments, for streaming servers.
- Sampling controls: temperature (0 = greedy), top-p, top-k, stop tokens, max_tokens and seed. A row stops at its
  first stop token (which is kept, as vLLM does with EOS) or after max_tokens.
- `logprobs` are the model's own log-probabilities of the sampled tokens: log softmax of the raw logits (T = 1), in
  float32, whatever the sampling temperature. They are what `forward()` gives for those tokens, and what SWEET-RL
  stores as the sampler's reference term.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Iterator

import jax
import jax.numpy as jnp
import numpy as np

from sweet_jax import models
from sweet_jax.data.buckets import bucket_length, round_up

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
    finish_reason: str | None  # "stop" (a stop token, included in tokens) or "length"; None: not finished yet


def first_argmax(x):
    """jnp.argmax over the last axis (the first maximal index) as two plain reductions: XLA:CPU runs argmax's
    variadic (value, index) reduce unvectorised, 17x slower than a max over 8 x 32k logits, and decoding takes one
    per step."""
    top = jnp.max(x, axis=-1, keepdims=True)
    iota = jax.lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1)
    return jnp.minimum(jnp.min(jnp.where(x == top, iota, x.shape[-1]), axis=-1), x.shape[-1] - 1)


def sample_logits(logits, keys, temperature, top_p, top_k):
    """One token per row from logits [B, V] (float32), with per-row keys [B] and settings [B]: temperature 0 =
    argmax, top_k 0 = off, top_p 1 = off."""
    greedy = first_argmax(logits)
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
    return jnp.where(temperature > 0, categorical(keys, scaled), greedy)


def categorical(keys, logits):
    """One draw per row from softmax(logits) [B, V] (entries may be -inf), with per-row keys [B]: exact, in two
    levels. The vocabulary is cut into blocks of about sqrt(V) entries; a block is drawn with probability equal to
    its total mass, then a token within it (Gumbel-max at both levels). That takes about 2 sqrt(V) random numbers
    per row instead of V: over a 128k vocabulary, the per-entry Gumbel noise of `jax.random.categorical` was 80% of
    a sampled decode step on the CPU."""
    b, v = logits.shape
    block = 1 << math.isqrt(v - 1).bit_length()  # a power of two >= sqrt(V)
    nb = -(-v // block)
    x = jnp.pad(logits, ((0, 0), (0, nb * block - v)), constant_values=-jnp.inf).reshape(b, nb, block)
    top = jnp.max(x, axis=(1, 2), keepdims=True)
    mass = jnp.sum(jnp.exp(x - top), axis=-1)  # [B, nb], the largest block's >= 1
    outer, inner = jnp.moveaxis(jax.vmap(lambda k: jax.random.split(k))(keys), 1, 0)
    pick = first_argmax(jnp.log(mass) + jax.vmap(lambda k: jax.random.gumbel(k, (nb,)))(outer))
    chosen = jnp.take_along_axis(x, pick[:, None, None], axis=1)[:, 0]  # [B, block]
    j = first_argmax(chosen + jax.vmap(lambda k: jax.random.gumbel(k, (block,)))(inner))
    return pick * block + j


def _logits(params, cfg, hidden):
    w = models.lm_head_weight(params, cfg).astype(hidden.dtype)
    return jnp.einsum("bd,dv->bv", hidden, w, preferred_element_type=jnp.float32)


@functools.partial(jax.jit, static_argnames=("cfg", "max_new", "n"))
def _prefill(params, cfg: models.ModelConfig, tokens, pad, keys, temperature, top_p, top_k, limit, stop, *,
             max_new: int, n: int) -> dict:
    """tokens [B, P] left-padded (pad[b] leading pads), per-prompt keys and settings [B] -> the decode state of
    B*n rows after the prompts: the KV cache, the next logits, and empty outputs `out` / `lps` [B*n, max_new]. Row
    b*n + j is sample j of prompt b; it draws from fold_in(keys[b], j), so a prompt's samples do not depend on the
    other prompts of the batch. Row b*n + j runs at most limit[b] (<= max_new) steps."""
    b, p = tokens.shape
    segment_ids = (jnp.arange(p)[None] >= pad[:, None]).astype(jnp.int32)
    positions = jnp.maximum(jnp.arange(p)[None] - pad[:, None], 0)
    cache = models.init_cache(cfg, b, p + max_new)
    hidden, cache = models.forward_cached(params, cfg, tokens, positions, segment_ids, cache, 0)
    rep = lambda x: jnp.repeat(x, n, axis=0)  # noqa: E731  (the n samples of a prompt share its prefill)
    rows = b * n
    return {"i": jnp.int32(0), "cache": jax.tree.map(rep, cache), "logits": rep(_logits(params, cfg, hidden[:, -1])),
            "out": jnp.zeros((rows, max_new), jnp.int32), "lps": jnp.zeros((rows, max_new)),
            "done": jnp.zeros(rows, bool), "length": jnp.zeros(rows, jnp.int32), "prompt_end": jnp.int32(p),
            "next_pos": rep(p - pad), "keys": jax.vmap(jax.random.fold_in)(rep(keys), jnp.tile(jnp.arange(n), b)),
            "temperature": rep(temperature), "top_p": rep(top_p), "top_k": rep(top_k), "limit": rep(limit),
            "stop": stop}


@functools.partial(jax.jit, static_argnames=("cfg",), donate_argnames=("state",))
def _decode(params, cfg: models.ModelConfig, state: dict, until) -> dict:
    """Decode steps state["i"] .. until - 1 (or until every row is done), updating the state (donated, so the cache
    is written in place across calls)."""
    rows, stop = state["out"].shape[0], state["stop"]

    def step(st):
        i = st["i"]
        step_keys = jax.vmap(lambda k: jax.random.fold_in(k, i))(st["keys"])
        logits, done = st["logits"], st["done"]
        tok = sample_logits(logits, step_keys, st["temperature"], st["top_p"], st["top_k"]).astype(jnp.int32)
        lp = jnp.take_along_axis(logits, tok[:, None], axis=-1)[:, 0] - jax.nn.logsumexp(logits, axis=-1)
        length = st["length"] + (~done).astype(jnp.int32)
        hidden, cache = models.forward_cached(params, cfg, tok[:, None], (st["next_pos"] + i)[:, None],
                                             jnp.ones((rows, 1), jnp.int32), st["cache"], st["prompt_end"] + i)
        return {**st, "i": i + 1, "cache": cache, "logits": _logits(params, cfg, hidden[:, 0]), "length": length,
                "out": st["out"].at[:, i].set(jnp.where(done, 0, tok)),
                "lps": st["lps"].at[:, i].set(jnp.where(done, 0.0, lp)),
                "done": done | jnp.any(tok[:, None] == stop[None, :], axis=-1) | (length >= st["limit"])}

    return jax.lax.while_loop(lambda st: (st["i"] < until) & ~jnp.all(st["done"]), step, state)


def generate_stream(params, cfg: models.ModelConfig, prompts: list[list[int]],
                    sampling: SamplingParams | list[SamplingParams] = SamplingParams(), *, n: int = 1,
                    seed: int | list[int] = 0, segment: int = 16, prompt_buckets=None,
                    new_buckets=None) -> Iterator[list[list[Sample]]]:
    """Like `generate`, but yields as it goes: after the prefill and every `segment` decode steps, the new tokens of
    every sample, deltas[prompt][sample] (a Sample whose finish_reason is None until its last delta). Between
    yields the state stays on the device; a segment is one jitted call, compiled once per shape."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    if segment < 1:
        raise ValueError(f"segment must be >= 1, got {segment}")
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
    p_len = bucket_length(longest, prompt_buckets) if prompt_buckets else round_up(longest)
    max_new = bucket_length(most, new_buckets) if new_buckets else round_up(most)
    tokens = np.zeros((len(prompts), p_len), np.int32)
    pad = np.zeros(len(prompts), np.int32)
    for i, ids in enumerate(prompts):
        tokens[i, p_len - len(ids):] = ids
        pad[i] = p_len - len(ids)
    stop = np.full(MAX_STOP_TOKENS, -1, np.int32)
    stop[:len(stops)] = stops
    keys = jax.vmap(jax.random.key)(jnp.asarray(seeds, jnp.uint32))
    col = lambda f, dtype: jnp.asarray([f(s) for s in settings], dtype)  # noqa: E731
    params = models.unstack_layers(params)
    state = _prefill(params, cfg, jnp.asarray(tokens), jnp.asarray(pad), keys, col(lambda s: s.temperature,
                     jnp.float32), col(lambda s: s.top_p, jnp.float32), col(lambda s: s.top_k, jnp.int32),
                     col(lambda s: s.max_tokens, jnp.int32), jnp.asarray(stop), max_new=max_new, n=n)
    sent = np.zeros(len(prompts) * n, np.int64)
    finished = np.zeros(len(prompts) * n, bool)
    until = 0
    while not finished.all():
        until = min(until + segment, max_new)
        state = _decode(params, cfg, state, jnp.int32(until))
        out, lps, length, done = (np.array(x) for x in jax.device_get(
            (state["out"], state["lps"], state["length"], state["done"])))
        deltas = []
        for b in range(len(prompts)):
            row = []
            for j in range(n):
                r = b * n + j
                k, reason = int(length[r]), None
                if done[r] and not finished[r]:
                    reason = "stop" if k and int(out[r, k - 1]) in stops else "length"
                    finished[r] = True
                row.append(Sample(out[r, sent[r]:k].tolist(), lps[r, sent[r]:k].astype(float).tolist(), reason))
                sent[r] = k
            deltas.append(row)
        yield deltas


def generate(params, cfg: models.ModelConfig, prompts: list[list[int]],
             sampling: SamplingParams | list[SamplingParams] = SamplingParams(), *, n: int = 1,
             seed: int | list[int] = 0, prompt_buckets=None, new_buckets=None) -> list[list[Sample]]:
    """Sample n continuations of every prompt (token id lists). `sampling` and `seed` are shared or per prompt; a
    prompt's samples depend only on its own prompt, settings and seed. Returns results[prompt][sample].

    `params` may be stacked (training layout; they are unstacked for the call, a copy) or already in the inference
    layout (`models.unstack_layers`), which repeated callers should pass."""
    results = [[Sample([], [], None) for _ in range(n)] for _ in prompts]
    for deltas in generate_stream(params, cfg, prompts, sampling, n=n, seed=seed, segment=1 << 30,
                                  prompt_buckets=prompt_buckets, new_buckets=new_buckets):
        add_deltas(results, deltas)
    return results


def add_deltas(results: list[list[Sample]], deltas: list[list[Sample]]) -> None:
    """Append streamed deltas[prompt][sample] to the accumulated results (in place; extra delta rows, such as a
    padded batch's, are ignored)."""
    for row, drow in zip(results, deltas):
        for sample, delta in zip(row, drow):
            sample.tokens += delta.tokens
            sample.logprobs += delta.logprobs
            sample.finish_reason = sample.finish_reason or delta.finish_reason
