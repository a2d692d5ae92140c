"""Model families as pure functions over parameter pytrees (Llama-3.x, Qwen2, Qwen2-VL), with HF and Orbax checkpoints.

    from sweet_jax import models
    cfg = models.load_config(hf_dir)                      # the family comes from config.json's model_type
    params = models.load_hf_params(hf_dir, cfg)          # f32 unless a dtype is given
    logits = models.forward(params, cfg, tokens)          # tokens int32 [B, T] -> [B, T, vocab]
    logits = models.forward(params, cfg, tokens, images=qwen2_vl.image_batch(*preprocess(pil_images)))  # Qwen2-VL
    models.save_hf_params(params, cfg, out_dir)
    loaded = models.load_model(path)                      # an HF directory or a training run; .tokenizer()

Outside this package, code uses these names only: `ModelConfig` is the config type of every family, and the family
registry (`models.families`) says which config parser, parameter spec, weight layout and chat format a model has.
"""

from sweet_jax.models.attention import attention, attention_mask
from sweet_jax.models.model_configs import (PRESETS, ConfigError, LlamaConfig, Qwen2Config, Qwen2VLConfig, RopeScaling,
                                     VisionConfig)
from sweet_jax.models.families import FAMILIES, ModelFamily, family, family_of, load_config, preset
from sweet_jax.models.hf_checkpoint import CheckpointError, load_hf_params, save_hf_params
from sweet_jax.models.llama import (Params, abstract_params, cache_logical_axes, forward, forward_cached,
                                    forward_hidden, forward_on_prefix, inference_logical_axes, init_cache,
                                    init_paged_cache, init_params, lm_head_weight, param_logical_axes, param_shapes,
                                    repeat_kv_heads, token_values, unstack_layers)
from sweet_jax.models.loading import LoadedModel, ModelLoadError, load_model, local_section, model_config

ModelConfig = LlamaConfig  # the config type of every family so far (Qwen2Config, Qwen2VLConfig are LlamaConfigs)

__all__ = [
    "FAMILIES", "PRESETS", "CheckpointError", "ConfigError", "LlamaConfig", "LoadedModel", "ModelConfig",
    "ModelFamily", "ModelLoadError", "Params", "Qwen2Config", "Qwen2VLConfig", "RopeScaling", "VisionConfig",
    "abstract_params", "attention",
    "attention_mask", "cache_logical_axes", "family", "family_of", "forward", "forward_cached", "forward_hidden",
    "forward_on_prefix", "inference_logical_axes", "init_cache", "init_paged_cache", "init_params", "lm_head_weight",
    "load_config", "load_hf_params", "load_model", "local_section", "model_config", "param_logical_axes",
    "param_shapes", "preset", "repeat_kv_heads", "save_hf_params", "token_values", "unstack_layers",
]
