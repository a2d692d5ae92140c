"""Log-probs of several continuations of one shared prefix, with the prefix computed once.

SWEET-RL's ranking step scores 16 candidate turns after the same (long) history. Scoring 16 full sequences repeats
the history 16 times. Here the history goes through the model once into a KV cache. The cache is broadcast to the
candidates, which then run on top of it.

    lps = continuation_logprobs(params, cfg, prefix_ids, [cand_1, ..., cand_16])   # lps[i][j] = log p(cand_i[j] | ...)

Shapes are bucketed (prefix length, candidate length, candidate count), so a ranking run compiles a few programs.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from sweet_jax.data.batching import round_up
from sweet_jax.models import llama
from sweet_jax.models.config import LlamaConfig
from sweet_jax.objectives.logprobs import logprobs_from_hidden


@functools.partial(jax.jit, static_argnames=("cfg", "chunk"))
def _shared_prefix_logprobs(params, cfg: LlamaConfig, prefix, prefix_len, cands, cand_seg, *, chunk: int):
    """prefix [P] (right-padded, prefix_len real tokens), cands [N, C] (right-padded, cand_seg 1 on real tokens)
    -> log p(cands[i, j] | prefix, cands[i, :j]) [N, C] (0 on padding)."""
    p, (n, c) = prefix.shape[0], cands.shape
    cache = llama.init_cache(cfg, 1, p + c)
    seg = (jnp.arange(p) < prefix_len).astype(jnp.int32)[None]
    hidden, cache = llama.forward_cached(params, cfg, prefix[None], jnp.arange(p)[None], seg, cache, 0)
    last = jax.lax.dynamic_index_in_dim(hidden[0], prefix_len - 1, axis=0, keepdims=False)  # predicts cands[:, 0]
    cache = jax.tree.map(lambda x: jnp.repeat(x, n, axis=0), cache)
    positions = prefix_len + jnp.broadcast_to(jnp.arange(c), (n, c))
    hidden, _ = llama.forward_cached(params, cfg, cands, positions, cand_seg, cache, p)
    h = jnp.concatenate([jnp.broadcast_to(last, (n, 1, last.shape[-1])), hidden[:, :-1]], axis=1)
    lp = logprobs_from_hidden(h, llama.lm_head_weight(params, cfg), cands, chunk=chunk)
    return jnp.where(cand_seg > 0, lp, 0.0)


def continuation_logprobs(params, cfg: LlamaConfig, prefix: list[int], continuations: list[list[int]], *,
                          chunk: int = 2048) -> list[np.ndarray]:
    """Per-token log-probs (float32) of each continuation given the shared prefix. `params` are best passed in the
    inference layout (`llama.unstack_layers`, once); stacked params are unstacked for the call, a copy."""
    if not prefix or not continuations or any(len(c) == 0 for c in continuations):
        raise ValueError("a non-empty prefix and non-empty continuations are needed")
    p, c = round_up(len(prefix)), round_up(max(map(len, continuations)))
    n = 1 << (len(continuations) - 1).bit_length()
    prefix_arr = np.zeros(p, np.int32)
    prefix_arr[:len(prefix)] = prefix
    cands = np.zeros((n, c), np.int32)
    seg = np.zeros((n, c), np.int32)
    for i, cont in enumerate(continuations):
        cands[i, :len(cont)] = cont
        seg[i, :len(cont)] = 1
    lp = np.asarray(_shared_prefix_logprobs(llama.unstack_layers(params), cfg, jnp.asarray(prefix_arr),
                                            jnp.int32(len(prefix)), jnp.asarray(cands), jnp.asarray(seg), chunk=chunk))
    return [lp[i, :len(cont)] for i, cont in enumerate(continuations)]
