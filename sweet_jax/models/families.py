"""Model families: the registry from an HF `model_type` to what the rest of the code needs of a family.

    family = families.family("llama")        # or family_of(cfg), or load_config(hf_dir) to parse one
    family.config_class.preset("tiny")        # its config: parsed from config.json, presets
    family.param_shapes(cfg), family.param_logical_axes(cfg)   # the parameter spec
    family.hf_weight_layout(cfg)              # where each weight lives in an HF checkpoint
    family.chat_format                        # the name of its chat format (`sweet_jax.chat`)

A new family registers a `ModelFamily` here, and its chat format in `chat.formats.FAMILY_FORMATS`; loading, saving,
sharding and the chat format then follow from it.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

from sweet_jax.chat.formats import FAMILY_FORMATS
from sweet_jax.models import llama, qwen2_vl
from sweet_jax.models.model_configs import PRESETS, ConfigError, LlamaConfig, Qwen2Config, Qwen2VLConfig, read_hf_config


@dataclasses.dataclass(frozen=True)
class ModelFamily:
    model_type: str  # HF config.json "model_type"
    config_class: type  # from_hf_dict(hf, source, **overrides), preset(name, **overrides), to_hf_dict()
    param_shapes: Callable[[Any], dict]  # cfg -> pytree of shapes
    param_logical_axes: Callable[[Any], dict]  # cfg -> pytree of logical axis names (`parallel.sharding`)
    hf_weight_layout: Callable[[Any], dict]  # cfg -> {our leaf path: (HF name, to ours, to HF)}
    chat_format: str  # `sweet_jax.chat.get_format` name
    # an HF name -> its name in the family's other checkpoint naming, which loading also reads (saving writes the
    # layout's names)
    alternate_hf_name: Callable[[str], str] | None = None


FAMILIES: dict[str, ModelFamily] = {
    "llama": ModelFamily("llama", LlamaConfig, llama.param_shapes, llama.param_logical_axes, llama.hf_weight_layout,
                         chat_format=FAMILY_FORMATS["llama"]),
    # Qwen2 is the Llama decoder with q/k/v biases (`Qwen2Config.qkv_bias`): the same functions run it.
    "qwen2": ModelFamily("qwen2", Qwen2Config, llama.param_shapes, llama.param_logical_axes, llama.hf_weight_layout,
                         chat_format=FAMILY_FORMATS["qwen2"]),
    # Qwen2-VL is that decoder with M-RoPE and a vision tower (`models.qwen2_vl`), both run by the same functions
    # from the config's `mrope_section` and `vision`. Saved in the published naming (`model.layers.*`, `visual.*`).
    "qwen2_vl": ModelFamily("qwen2_vl", Qwen2VLConfig, llama.param_shapes, llama.param_logical_axes,
                            llama.hf_weight_layout, chat_format=FAMILY_FORMATS["qwen2_vl"],
                            alternate_hf_name=qwen2_vl.alternate_hf_name),
}


def family(model_type: str) -> ModelFamily:
    if model_type not in FAMILIES:
        raise ConfigError(f"model_type {model_type!r} is not supported; the supported families are "
                          f"{', '.join(sorted(FAMILIES))}")
    return FAMILIES[model_type]


def family_of(cfg) -> ModelFamily:
    """The family of a model config."""
    return family(cfg.model_type)


def load_config(path: str | os.PathLike, **overrides: Any):
    """The model config of an HF `config.json` (a file, or the directory holding one), parsed by its family.
    Unsupported settings raise ConfigError naming the file and field."""
    hf, file = read_hf_config(path)
    try:
        fam = family(hf.get("model_type", "llama"))
    except ConfigError as e:
        raise ConfigError(f"{file}: field 'model_type': {e}") from None
    return fam.config_class.from_hf_dict(hf, source=file, **overrides)



def preset(name: str, **overrides: Any):
    """A named architecture preset of any family (`models.model_configs.PRESETS`)."""
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; known: {sorted(PRESETS)}")
    return PRESETS[name].replace(**overrides)
