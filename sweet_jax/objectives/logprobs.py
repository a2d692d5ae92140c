"""Per-token log-probs from final hidden states, in chunks: full [B, T, V] logits never exist.

Each chunk of `chunk` tokens computes its logits in f32, a log-sum-exp and the target's logit. The backward pass
is written out (`_chunked_logprobs`): it keeps only each token's log-sum-exp from the forward, recomputes a chunk's
logits, and runs its two vocabulary matmuls in the hidden states' dtype with f32 accumulation, summing the
projection's gradient over chunks in f32. Peak memory is O(chunk * V) in both directions.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from sweet_jax.models import ModelConfig, Params, forward_hidden, lm_head_weight
from sweet_jax.parallel.sharding import constrain

DEFAULT_CHUNK = 512


def logprobs_from_hidden(hidden: jnp.ndarray, lm_head: jnp.ndarray, targets: jnp.ndarray, *,
                         chunk: int = DEFAULT_CHUNK) -> jnp.ndarray:
    """log softmax(hidden @ lm_head)[target] in float32.

    hidden [B, T, D], lm_head [D, V], targets int [B, T] -> [B, T]. About `chunk` tokens are processed at a time.
    """
    b, t, d = hidden.shape
    # Chunks run along the sequence, `chunk // B` positions of every row at a time, so the batch dimension (sharded
    # over data/fsdp on a mesh) is never merged into the chunk dimension; at least one position per row.
    c = max(1, min(t, chunk // b))
    pad = -t % c
    h = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0))).reshape(b, -1, c, d).swapaxes(0, 1)  # [n, B, c, D]
    y = jnp.pad(targets, ((0, 0), (0, pad))).reshape(b, -1, c).swapaxes(0, 1)
    with jax.named_scope("logprob"):  # the ops' names say so (`bench/profile_step.py` groups by them)
        out = _chunked_logprobs(h, lm_head, y)  # [n, B, c]
    return out.swapaxes(0, 1).reshape(b, -1)[:, :t]


def _projection(lm_head: jnp.ndarray, dtype) -> jnp.ndarray:
    """The [D, V] projection in the hidden states' dtype, all-gathered over the hidden dimension before use, as FSDP
    does with every weight."""
    return constrain(lm_head.astype(dtype), ("act_embed", "vocab"))


def _chunk_logits(hc: jnp.ndarray, w: jnp.ndarray) -> jnp.ndarray:
    """One chunk's f32 logits [B, c, V] from hc [B, c, D] and the projection `w` (`_projection`)."""
    hc = constrain(hc, ("batch", "seq", "act_embed"))
    return jnp.einsum("bcd,dv->bcv", hc, w, preferred_element_type=jnp.float32)


def _chunks_forward(h, lm_head, y):
    """Log-probs [n, B, c] and each token's log-sum-exp (the backward pass's residual)."""

    w = _projection(lm_head, h.dtype)

    def one(args):
        hc, yc = args
        logits = _chunk_logits(hc, w)
        lse = jax.nn.logsumexp(logits, axis=-1)
        return jnp.take_along_axis(logits, yc[..., None], axis=-1)[..., 0] - lse, lse

    return jax.lax.map(one, (h, y))


@jax.custom_vjp
def _chunked_logprobs(h, lm_head, y):
    """h [n, B, c, D], lm_head [D, V], y int [n, B, c] -> log-probs f32 [n, B, c]."""
    return _chunks_forward(h, lm_head, y)[0]


def _chunked_logprobs_fwd(h, lm_head, y):
    out, lse = _chunks_forward(h, lm_head, y)
    return out, (h, lm_head, y, lse)


def _chunked_logprobs_bwd(res, g):
    """d logp / d logits = onehot(y) - softmax: formed per chunk, cast to the matmuls' dtype (as autodiff's own
    backward would not: it would run both vocabulary matmuls in f32), and contracted with the projection (into dh)
    and the hidden states (into the projection's f32 gradient, carried over chunks)."""
    h, lm_head, y, lse = res
    vocab = lm_head.shape[-1]
    w = _projection(lm_head, h.dtype)

    def one(dw, args):
        hc, yc, lc, gc = args
        logits = _chunk_logits(hc, w)
        onehot = jnp.arange(vocab, dtype=yc.dtype) == yc[..., None]
        dlogits = (gc[..., None] * (onehot - jnp.exp(logits - lc[..., None]))).astype(hc.dtype)
        dh = jnp.einsum("bcv,dv->bcd", dlogits, w, preferred_element_type=jnp.float32).astype(hc.dtype)
        dw = dw + jnp.einsum("bcd,bcv->dv", hc, dlogits, preferred_element_type=jnp.float32)
        return dw, dh

    dw0 = constrain(jnp.zeros(lm_head.shape, jnp.float32), ("act_embed", "vocab"))
    dw, dh = jax.lax.scan(one, dw0, (h, y, lse, g))
    return dh, dw.astype(lm_head.dtype), None


_chunked_logprobs.defvjp(_chunked_logprobs_fwd, _chunked_logprobs_bwd)


def token_logprobs(params: Params, cfg: ModelConfig, tokens: jnp.ndarray, targets_mask: jnp.ndarray | None = None, *,
                   positions=None, segment_ids=None, chunk: int = DEFAULT_CHUNK) -> jnp.ndarray:
    """float32 [B, T] aligned with `tokens`: entry t is log p(tokens[t] | tokens[:t]); entry 0 is 0.

    targets_mask [B, T] (optional): entries where it is 0 are set to 0 (their value is still computed).
    """
    hidden = forward_hidden(params, cfg, tokens, positions, segment_ids)
    lp = logprobs_from_hidden(hidden[:, :-1], lm_head_weight(params, cfg), tokens[:, 1:], chunk=chunk)
    lp = jnp.pad(lp, ((0, 0), (1, 0)))
    if targets_mask is not None:
        lp = jnp.where(targets_mask.astype(bool), lp, 0.0)
    return lp


def gathered_logprobs(params: Params, cfg: ModelConfig, tokens: jnp.ndarray, gather_pos: jnp.ndarray, *,
                      gather_src: jnp.ndarray | None = None, positions=None, segment_ids=None, branch_ids=None,
                      chunk: int = DEFAULT_CHUNK, dropout_key=None) -> jnp.ndarray:
    """log p(tokens[b, p] | context) for p = gather_pos[b, ...] (all >= 1) -> float32 with gather_pos's shape.

    The context is the hidden state at gather_src[b, ...], by default p - 1 (a plain row). Prefix-shared rows
    ([history, chosen, rejected], `data.packing`) pass it: the first token of the rejected turn is predicted from the
    last history token, not from the token before it in the row. gather_pos may be [B, S] or [B, K, S] (K examples
    per row); the lookups stay within each row, so the batch dimension keeps its sharding.

    Only the gathered positions go through the vocabulary projection: a critic that scores assistant turns pays
    the [D, V] matmul and log-sum-exp for those tokens alone. dropout_key: adapter dropout in training
    (`models.forward_hidden`).
    """
    hidden = forward_hidden(params, cfg, tokens, positions, segment_ids, branch_ids, dropout_key=dropout_key)
    shape = gather_pos.shape
    pos = gather_pos.reshape(shape[0], -1)
    src = pos - 1 if gather_src is None else gather_src.reshape(shape[0], -1)
    h = jnp.take_along_axis(hidden, src[..., None], axis=1)
    targets = jnp.take_along_axis(tokens, pos, axis=1)
    return logprobs_from_hidden(h, lm_head_weight(params, cfg), targets, chunk=chunk).reshape(shape)
