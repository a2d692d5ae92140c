"""Attention behind one dispatch function.

Implementations (chosen by `LlamaConfig.attention_impl`):
- "reference": grouped-query einsum with an explicit boolean mask and f32 softmax. The CPU path and the ground truth.
- "xla": `jax.nn.dot_product_attention(implementation="xla")`.
- "cudnn": `jax.nn.dot_product_attention(implementation="cudnn")` (GPU, bf16/fp16 only).
- "auto": cudnn on GPU when the compute dtype allows it, otherwise the reference.

Masking: token i attends to token j iff j <= i (by array index) and segment_ids[i] == segment_ids[j]. Segment ids thus
express both padding (pad = 0, real = 1) and packed sequences (1, 1, 2, 2, 2, 0). Every token can at least attend to
itself, so no row is ever fully masked and no NaNs arise on padding.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def attention_mask(q_segment_ids: jnp.ndarray, kv_segment_ids: jnp.ndarray, causal: bool = True,
                   q_offset=None) -> jnp.ndarray:
    """Boolean mask [B, 1, T, S]: True where query t may attend key s.

    Query t sits at key index q_offset + t; by default the queries are the last T of the S keys (T == S for a
    full forward).
    """
    t, s = q_segment_ids.shape[1], kv_segment_ids.shape[1]
    mask = q_segment_ids[:, :, None] == kv_segment_ids[:, None, :]
    if causal:
        q_idx = jnp.arange(t)[:, None] + (s - t if q_offset is None else q_offset)
        mask = mask & (q_idx >= jnp.arange(s)[None, :])[None]
    return mask[:, None]


def reference_attention(q, k, v, q_segment_ids, kv_segment_ids, *, causal: bool = True, scale: float | None = None,
                        q_block: int = 2048):
    """q [B,T,N,H], k/v [B,S,K,H], segment ids [B,T] / [B,S] -> [B,T,N,H]. Softmax in f32.

    Queries are processed `q_block` at a time and each block builds its own mask, so memory is O(q_block * S),
    not O(T * S), in the forward and the backward pass.
    """
    b, t = q.shape[:2]
    s = k.shape[1]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if t <= q_block or t % q_block:
        return _attend(q, k, v, attention_mask(q_segment_ids, kv_segment_ids, causal), scale)
    nb = t // q_block
    qb = jnp.moveaxis(q.reshape(b, nb, q_block, *q.shape[2:]), 1, 0)
    segb = jnp.moveaxis(q_segment_ids.reshape(b, nb, q_block), 1, 0)
    offsets = jnp.arange(nb) * q_block + (s - t)

    # Each block is rematerialised in the backward pass, so the gradient keeps no [q_block, S] probabilities either.
    @jax.checkpoint
    def block(args):
        qi, seg, off = args
        return _attend(qi, k, v, attention_mask(seg, kv_segment_ids, causal, q_offset=off), scale)

    out = jax.lax.map(block, (qb, segb, offsets))
    return jnp.moveaxis(out, 0, 1).reshape(q.shape)


def _attend(q, k, v, mask, scale: float):
    b, t, n, h = q.shape
    kv = k.shape[2]
    qg = q.reshape(b, t, kv, n // kv, h)
    scores = jnp.einsum("btkgh,bskh->bkgts", qg, k, preferred_element_type=jnp.float32) * scale
    scores = jnp.where(mask[:, :, None], scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    out = jnp.einsum("bkgts,bskh->btkgh", probs, v)
    return out.reshape(b, t, n, h)


def resolve_impl(impl: str, dtype) -> str:
    if impl != "auto":
        return impl
    if jax.default_backend() == "gpu" and jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16):
        return "cudnn"
    return "reference"


def attention(q, k, v, q_segment_ids, kv_segment_ids, *, impl: str = "auto", causal: bool = True):
    """Dispatch: q [B,T,N,H], k/v [B,S,K,H], segment ids [B,T] / [B,S] -> [B,T,N,H] in q.dtype."""
    scale = q.shape[-1] ** -0.5
    impl = resolve_impl(impl, q.dtype)
    if impl == "reference":
        return reference_attention(q, k, v, q_segment_ids, kv_segment_ids, causal=causal, scale=scale)
    if impl in ("xla", "cudnn"):
        # Let the kernel apply causality itself (cuDNN then skips the upper triangle); the segment mask goes in as a
        # mask (cuDNN folds it into a bias). jax's is_causal aligns queries at the top-left, so it is only used for
        # square attention; otherwise the full mask carries causality.
        square = q.shape[1] == k.shape[1]
        mask = attention_mask(q_segment_ids, kv_segment_ids, causal=causal and not square)
        return jax.nn.dot_product_attention(q, k, v, mask=mask, scale=scale, is_causal=causal and square,
                                            implementation=impl).astype(q.dtype)
    raise ValueError(f"unknown attention implementation {impl!r}")
