"""Rotary position embeddings in HF's half-split layout (`rotate_half`), with Llama-3 frequency scaling, and Qwen2-VL's
multimodal RoPE (M-RoPE: each section of the frequencies turns by the temporal, height or width position in turn)."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from sweet_jax.models.model_configs import LlamaConfig


def inverse_frequencies(cfg: LlamaConfig) -> np.ndarray:
    """[head_dim // 2] float32 inverse frequencies, computed in f32 the way HF does so logits match to ~1e-6."""
    dim = cfg.head_dim
    exponents = np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim)
    inv = (np.float32(1.0) / np.power(np.float32(cfg.rope_theta), exponents)).astype(np.float32)
    s = cfg.rope_scaling
    if s is None:
        return inv
    old_len = s.original_max_position_embeddings
    low_freq_wavelen = old_len / s.low_freq_factor
    high_freq_wavelen = old_len / s.high_freq_factor
    wavelen = (np.float32(2 * math.pi) / inv).astype(np.float32)
    scaled = np.where(wavelen > low_freq_wavelen, inv / np.float32(s.factor), inv).astype(np.float32)
    smooth = ((old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)).astype(np.float32)
    smoothed = ((1 - smooth) * scaled / np.float32(s.factor) + smooth * scaled).astype(np.float32)
    is_medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return np.where(is_medium, smoothed, scaled).astype(np.float32)


def rope_tables(cfg: LlamaConfig, positions: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
    """cos, sin of shape [B, T, head_dim // 2] in float32 for integer positions [B, T], or, for a config with an
    `mrope_section` (Qwen2-VL), for (temporal, height, width) positions [3, B, T]: frequency j turns by row
    (its section's index mod 3) of the positions, as HF's `mrope_section` split does."""
    inv = jnp.asarray(inverse_frequencies(cfg))
    angles = positions.astype(jnp.float32)[..., None] * inv
    sections = getattr(cfg, "mrope_section", None)
    if positions.ndim == 3:
        if not sections or sum(sections) != inv.shape[0]:
            raise ValueError(f"positions [3, B, T] need an mrope_section summing to head_dim // 2, got {sections}")
        rows = np.repeat(np.arange(len(sections)) % 3, sections)  # the position row of each frequency
        angles = jnp.moveaxis(angles[rows, :, :, np.arange(inv.shape[0])], 0, -1)
    return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x: jnp.ndarray, cos: jnp.ndarray, sin: jnp.ndarray) -> jnp.ndarray:
    """Rotate x [B, T, heads, head_dim] (half-split pairs (i, i + head_dim/2)); math in f32, result in x.dtype."""
    half = x.shape[-1] // 2
    xf = x.astype(jnp.float32)
    x1, x2 = xf[..., :half], xf[..., half:]
    c, s = cos[:, :, None, :], sin[:, :, None, :]
    return jnp.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1).astype(x.dtype)
