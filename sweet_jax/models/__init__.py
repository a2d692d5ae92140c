"""Llama-3.x as pure functions over parameter pytrees.

    from sweet_jax import models
    cfg = models.LlamaConfig.from_pretrained(hf_dir)
    params = models.load_hf_params(hf_dir, cfg)          # f32 unless a dtype is given
    logits = models.forward(params, cfg, tokens)          # tokens int32 [B, T] -> [B, T, vocab]
    models.save_hf_params(params, cfg, out_dir)
"""

from sweet_jax.models.attention import attention, attention_mask
from sweet_jax.models.config import PRESETS, ConfigError, LlamaConfig, RopeScaling
from sweet_jax.models.hf_checkpoint import CheckpointError, load_hf_params, save_hf_params
from sweet_jax.models.llama import (
    abstract_params,
    forward,
    forward_hidden,
    init_params,
    lm_head_weight,
    param_logical_axes,
    param_shapes,
    token_values,
)

__all__ = [
    "PRESETS", "CheckpointError", "ConfigError", "LlamaConfig", "RopeScaling", "abstract_params", "attention",
    "attention_mask", "forward", "forward_hidden", "init_params", "lm_head_weight", "load_hf_params",
    "param_logical_axes", "param_shapes", "save_hf_params", "token_values",
]
