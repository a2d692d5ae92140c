"""Small layers that more than one vision tower uses (CLIP's, Qwen2-VL's): LayerNorm and QuickGELU."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def layer_norm(x, w, b, eps: float):
    """LayerNorm over the last axis, computed in f32 and cast back to x's dtype."""
    xf = x.astype(jnp.float32)
    mean = xf.mean(-1, keepdims=True)
    var = ((xf - mean) ** 2).mean(-1, keepdims=True)
    return ((xf - mean) * jax.lax.rsqrt(var + eps) * w + b).astype(x.dtype)


def quick_gelu(x):
    """x * sigmoid(1.702 x), CLIP's and Qwen2-VL's vision MLP activation."""
    return x * jax.nn.sigmoid(1.702 * x)
