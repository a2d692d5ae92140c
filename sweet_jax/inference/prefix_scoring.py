"""Log-probs (or a score head's values) of several continuations of one shared prefix, the prefix computed once.

SWEET-RL's ranking step scores 16 candidate turns after the same (long) history. Scoring 16 full sequences repeats
the history 16 times. Here the history goes through the model once into a batch-1 KV cache, and the candidates run
on top of it (`models.forward_on_prefix`): every candidate reads that one cache, which is never copied per
candidate.

    lps = continuation_logprobs(params, cfg, prefix_ids, [cand_1, ..., cand_16])   # lps[i][j] = log p(cand_i[j] | ...)
    prefix_values, values = continuation_values(head_params, head_cfg, prefix_ids, [cand_1, ...])  # score heads
    answer_lps = next_token_logprobs(params, cfg, prefix_ids, [cand_1, ...], [yes_id, no_id])  # the next token

Shapes are bucketed (prefix length, candidate length, candidate count), so a ranking run compiles a few programs.
With `placement` (`inference.placement`), the programs run on its mesh, the weights placed by the rules table
(pass params from `Placement.prepare`); the results equal the one-device ones.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from sweet_jax import models
from sweet_jax.data.buckets import round_up
from sweet_jax.inference.placement import Placement
from sweet_jax.objectives.logprobs import logprobs_from_hidden


def _prefix_then_candidates(params, cfg: models.ModelConfig, prefix, prefix_len, cands, cand_seg):
    """prefix [P] (right-padded, prefix_len real tokens) through the model into a KV cache, then candidates [N, C]
    (right-padded, cand_seg 1 on real tokens) on top of it -> final hidden states (prefix [P, D], candidates
    [N, C, D])."""
    p, (n, c) = prefix.shape[0], cands.shape
    cache = models.init_cache(cfg, 1, p)
    seg = (jnp.arange(p) < prefix_len).astype(jnp.int32)[None]
    prefix_hidden, cache = models.forward_cached(params, cfg, prefix[None], jnp.arange(p)[None], seg, cache, 0)
    positions = prefix_len + jnp.broadcast_to(jnp.arange(c), (n, c))
    hidden = models.forward_on_prefix(params, cfg, cands, positions, cand_seg, cache)
    return prefix_hidden[0], hidden


def _shared_prefix_logprobs(params, cfg: models.ModelConfig, prefix, prefix_len, cands, cand_seg, *, chunk: int):
    """-> log p(cands[i, j] | prefix, cands[i, :j]) [N, C] (0 on padding)."""
    prefix_hidden, hidden = _prefix_then_candidates(params, cfg, prefix, prefix_len, cands, cand_seg)
    last = jax.lax.dynamic_index_in_dim(prefix_hidden, prefix_len - 1, axis=0, keepdims=False)  # predicts cands[:, 0]
    n = cands.shape[0]
    h = jnp.concatenate([jnp.broadcast_to(last, (n, 1, last.shape[-1])), hidden[:, :-1]], axis=1)
    lp = logprobs_from_hidden(h, models.lm_head_weight(params, cfg), cands, chunk=chunk)
    return jnp.where(cand_seg > 0, lp, 0.0)


def _shared_prefix_next_token(params, cfg: models.ModelConfig, prefix, prefix_len, cands, cand_seg):
    """-> log p(next token | prefix, cands[i]) [N, V]: the distribution after each candidate's last real token."""
    _, hidden = _prefix_then_candidates(params, cfg, prefix, prefix_len, cands, cand_seg)
    last = jnp.maximum(cand_seg.sum(-1) - 1, 0)
    h = jnp.take_along_axis(hidden, last[:, None, None], axis=1)[:, 0]  # [N, D]
    logits = jnp.einsum("nd,dv->nv", h, models.lm_head_weight(params, cfg).astype(h.dtype),
                        preferred_element_type=jnp.float32)
    return jax.nn.log_softmax(logits, axis=-1)


def _shared_prefix_values(params, cfg: models.ModelConfig, prefix, prefix_len, cands, cand_seg):
    """A score-head model's per-token values -> (prefix [P], candidates [N, C]), float32, 0 on padding."""
    prefix_hidden, hidden = _prefix_then_candidates(params, cfg, prefix, prefix_len, cands, cand_seg)
    w = params["score"].astype(hidden.dtype)
    pv = jnp.einsum("pd,d->p", prefix_hidden, w, preferred_element_type=jnp.float32)
    cv = jnp.einsum("ncd,d->nc", hidden, w, preferred_element_type=jnp.float32)
    return jnp.where(jnp.arange(prefix.shape[0]) < prefix_len, pv, 0.0), jnp.where(cand_seg > 0, cv, 0.0)


@functools.lru_cache(maxsize=64)
def _program(fn, cfg: models.ModelConfig, placement: Placement, **static):
    """`fn` jitted for a placed model: weights in by their shardings, everything else replicated."""
    abstract = jax.eval_shape(models.unstack_layers, models.abstract_params(cfg))
    rep = placement.sharding((), ())
    return jax.jit(lambda params, *args: fn(params, cfg, *args, **static),
                   in_shardings=(placement.param_shardings(abstract, cfg), rep, rep, rep, rep), out_shardings=rep)


def _run(fn, params, cfg, placement: Placement | None, args, **static):
    placement = placement or Placement.build()
    params, cfg = placement.prepare(params, cfg)
    with placement.active():
        return _program(fn, cfg, placement, **static)(params, *args)


def _padded(prefix: list[int], continuations: list[list[int]]):
    """Bucketed arrays (prefix [P], candidates [N, C], their segment ids) for one call."""
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
    return prefix_arr, np.int32(len(prefix)), cands, seg


def continuation_logprobs(params, cfg: models.ModelConfig, prefix: list[int], continuations: list[list[int]], *,
                          chunk: int = 2048, placement: Placement | None = None) -> list[np.ndarray]:
    """Per-token log-probs (float32) of each continuation given the shared prefix. `params` are best passed placed
    (`Placement.prepare`, once); others are placed for the call, a copy."""
    lp = np.asarray(_run(_shared_prefix_logprobs, params, cfg, placement, _padded(prefix, continuations),
                         chunk=chunk))
    return [lp[i, :len(cont)] for i, cont in enumerate(continuations)]


def next_token_logprobs(params, cfg: models.ModelConfig, prefix: list[int], continuations: list[list[int]],
                        targets: list[int], *, placement: Placement | None = None) -> np.ndarray:
    """log p(t | prefix + continuation) for each continuation and each token t of `targets` -> [len(continuations),
    len(targets)], float32: one vocabulary projection per continuation, at its end (an LLM judge's answer)."""
    lp = np.asarray(_run(_shared_prefix_next_token, params, cfg, placement, _padded(prefix, continuations)))
    return lp[:len(continuations)][:, np.asarray(targets)]


def continuation_values(params, cfg: models.ModelConfig, prefix: list[int], continuations: list[list[int]], *,
                        placement: Placement | None = None) -> tuple[np.ndarray, list[np.ndarray]]:
    """A score-head model's values (`models.token_values`) at every token: (the prefix's [len(prefix)], each
    continuation's after the shared prefix), the prefix computed once."""
    pv, cv = _run(_shared_prefix_values, params, cfg, placement, _padded(prefix, continuations))
    pv, cv = np.asarray(pv), np.asarray(cv)
    return pv[:len(prefix)], [cv[i, :len(cont)] for i, cont in enumerate(continuations)]
