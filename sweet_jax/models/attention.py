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


def attention_mask(q_segment_ids: jnp.ndarray, kv_segment_ids: jnp.ndarray, causal: bool = True) -> jnp.ndarray:
    """Boolean mask [B, 1, T, S]: True where query t may attend key s."""
    t, s = q_segment_ids.shape[1], kv_segment_ids.shape[1]
    mask = q_segment_ids[:, :, None] == kv_segment_ids[:, None, :]
    if causal:
        # Queries are the last t of the s keys (t == s for a full forward).
        q_idx = jnp.arange(t)[:, None] + (s - t)
        mask = mask & (q_idx >= jnp.arange(s)[None, :])[None]
    return mask[:, None]


def reference_attention(q, k, v, mask, scale: float, q_block: int = 2048):
    """q [B,T,N,H], k/v [B,S,K,H], mask [B,1,T,S] bool -> [B,T,N,H]. Softmax in f32.

    Queries are processed `q_block` at a time, so the f32 scores take O(q_block * S) memory, not O(T * S).
    """
    t = q.shape[1]
    if t > q_block and t % q_block == 0:
        nb = t // q_block
        qb = jnp.moveaxis(q.reshape(q.shape[0], nb, q_block, *q.shape[2:]), 1, 0)
        mb = jnp.moveaxis(mask.reshape(mask.shape[0], 1, nb, q_block, mask.shape[-1]), 2, 0)
        out = jax.lax.map(lambda a: _attend(a[0], k, v, a[1], scale), (qb, mb))
        return jnp.moveaxis(out, 0, 1).reshape(q.shape)
    return _attend(q, k, v, mask, scale)


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
        return reference_attention(q, k, v, attention_mask(q_segment_ids, kv_segment_ids, causal), scale)
    if impl in ("xla", "cudnn"):
        # Let the kernel apply causality itself (cuDNN then skips the upper triangle); the segment mask goes in as a
        # mask (cuDNN folds it into a bias). jax's is_causal aligns queries at the top-left, so it is only used for
        # square attention; otherwise the full mask carries causality.
        square = q.shape[1] == k.shape[1]
        mask = attention_mask(q_segment_ids, kv_segment_ids, causal=causal and not square)
        return jax.nn.dot_product_attention(q, k, v, mask=mask, scale=scale, is_causal=causal and square,
                                            implementation=impl).astype(q.dtype)
    raise ValueError(f"unknown attention implementation {impl!r}")
