"""Low-rank adapters (LoRA) for the decoder's projections, in PEFT's format in and out.

An adapter on a projection W (our layout, e.g. wq [L, D, N, H]) is a pair A, B with W' = W + (alpha / rank) * A B:
A spans W's input dimensions and the rank, B the rank and W's output dimensions, each stacked over the layers like
W, and each carrying W's logical axis names with "lora_rank" (replicated) for the rank, so the rules table shards
an adapter as it shards its base weight:

    wq: a [L, D, r] ("layers", "embed", "lora_rank")    b [L, r, N, H] ("layers", "lora_rank", "q_heads", "head_dim")
    wo: a [L, N, H, r] ("layers", "q_heads", "head_dim", "lora_rank")    b [L, r, D] ("layers", "lora_rank", "embed")

Targets are named as PEFT names them (the HF module names): q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj,
down_proj. A model config with `lora` settings (`models.model_configs.LoraSettings`) has the adapters in its params, under
"lora": the forward adds each projection's (x A) B term (`lora_layers`) and training updates them alone, the base
fixed. `merge` gives plain adapted parameters instead, for inference and export. PEFT's adapter
directory is `adapter_config.json` + `adapter_model.safetensors` with `lora_A.weight` [r, in] and `lora_B.weight`
[out, r] per module (`save_peft_adapter`, `load_peft_adapter`); like PEFT, a fresh adapter has B = 0, so it starts
as the base model.
"""

from __future__ import annotations

import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np

from sweet_jax.models.model_configs import ConfigError, LlamaConfig, LoraSettings
from sweet_jax.models.lora_layers import (DTYPE, TARGETS, adapter_axes_of, adapter_shapes_of, base_of,  # noqa: F401
                                          init_adapters_of)

Params = dict
CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
class AdapterError(ConfigError):
    """An adapter that does not fit the model or is not a LoRA adapter; the message names the file and field."""


def _layers(cfg: LlamaConfig):
    """(shapes, logical axes) of the base's stacked layers, from the model-family seam: every registered family."""
    from sweet_jax.models.families import family_of

    fam, base = family_of(cfg), cfg.replace(lora=None)
    return fam.param_shapes(base)["layers"], fam.param_logical_axes(base)["layers"]


def adapter_shapes(cfg: LlamaConfig, s: LoraSettings) -> Params:
    return adapter_shapes_of(_layers(cfg)[0], s)


def adapter_logical_axes(cfg: LlamaConfig, s: LoraSettings) -> Params:
    return adapter_axes_of(_layers(cfg)[1], s)


def init_adapters(cfg: LlamaConfig, s: LoraSettings, key: jax.Array, dtype=DTYPE) -> Params:
    """Fresh adapters as PEFT makes them (`lora_layers.init_adapters_of`: B = 0, so the model is its base)."""
    return init_adapters_of(adapter_shapes(cfg, s), key, dtype)


def merged(params: Params, cfg: LlamaConfig) -> Params:
    """Params holding adapters (a "lora" entry, `cfg.lora`) as plain params with the adapters merged in; params
    without adapters as they are. For inference and export, where the adapted weights are used as they are."""
    if "lora" not in params:
        return params
    if cfg.lora is None:
        raise AdapterError("the params hold adapters (a 'lora' entry) but the model config has no lora settings")
    return merge(base_of(params), params["lora"], cfg.lora)


def merge(params: Params, adapters: Params, s: LoraSettings) -> Params:
    """The adapted parameters: every adapted weight W + scale * A B, in W's dtype (the rest shared, not copied)."""
    layers = dict(params["layers"])
    for name, ab in adapters["layers"].items():
        w = layers[name]
        a, b = ab["a"].astype(jnp.float32), ab["b"].astype(jnp.float32)
        delta = jnp.einsum("lir,lro->lio", a.reshape(a.shape[0], -1, a.shape[-1]),
                           b.reshape(b.shape[0], b.shape[1], -1))
        layers[name] = (w.astype(jnp.float32) + s.scale * delta.reshape(w.shape)).astype(w.dtype)
    return {**params, "layers": layers}


# --------------------------------------------------------------------------------------------- PEFT's format
def _peft_name(target: str, layer: int, half: str) -> str:
    return f"base_model.model.model.layers.{layer}.{TARGETS[target][2]}.lora_{half}.weight"


def save_peft_adapter(out_dir: str | os.PathLike, adapters: Params, cfg: LlamaConfig, s: LoraSettings,
                      base_model: str = "") -> str:
    """Write `adapters` as a PEFT LoRA adapter directory (float32 tensors), which `peft.PeftModel.from_pretrained`
    loads onto the HF base model; returns the directory."""
    from sweet_jax.files.atomic import write_text
    from sweet_jax.models.safetensors_format import write_safetensors

    out_dir = os.fspath(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    tensors = {}
    for t in s.targets:
        name = TARGETS[t][0]
        a = np.asarray(adapters["layers"][name]["a"], np.float32)
        b = np.asarray(adapters["layers"][name]["b"], np.float32)
        for i in range(cfg.num_layers):
            tensors[_peft_name(t, i, "A")] = a[i].reshape(-1, s.rank).T  # [r, in]
            tensors[_peft_name(t, i, "B")] = b[i].reshape(s.rank, -1).T  # [out, r]
    write_safetensors(os.path.join(out_dir, WEIGHTS_FILE), dict(sorted(tensors.items())))
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": s.rank, "lora_alpha": s.alpha,
              "lora_dropout": s.dropout, "target_modules": sorted(s.targets), "bias": "none", "use_rslora": False,
              "use_dora": False, "fan_in_fan_out": False, "base_model_name_or_path": base_model or None,
              "inference_mode": True}
    write_text(os.path.join(out_dir, CONFIG_FILE), json.dumps(config, indent=2, sort_keys=True) + "\n")
    return out_dir


def load_peft_adapter(adapter_dir: str | os.PathLike, cfg: LlamaConfig) -> tuple[Params, LoraSettings]:
    """A PEFT LoRA adapter directory as (adapters in our layout, float32; its settings)."""
    from sweet_jax.models.safetensors_format import SafetensorsFile

    adapter_dir = os.fspath(adapter_dir)
    path = os.path.join(adapter_dir, CONFIG_FILE)
    try:
        with open(path) as fh:
            conf = json.load(fh)
    except (OSError, json.JSONDecodeError) as e:
        raise AdapterError(f"{path}: not a readable adapter config ({e})") from None
    if conf.get("peft_type") != "LORA":
        raise AdapterError(f"{path}: field 'peft_type': only LORA adapters load, got {conf.get('peft_type')!r}")
    for field, plain in (("use_rslora", False), ("use_dora", False), ("fan_in_fan_out", False), ("bias", "none")):
        if conf.get(field, plain) != plain:
            raise AdapterError(f"{path}: field '{field}': {conf[field]!r} is not supported (only {plain!r})")
    targets = conf.get("target_modules")
    targets = [targets] if isinstance(targets, str) else list(targets or [])
    try:
        s = LoraSettings(rank=int(conf["r"]), alpha=float(conf["lora_alpha"]),
                         dropout=float(conf.get("lora_dropout", 0.0)), targets=tuple(sorted(targets)))
    except KeyError as e:
        raise AdapterError(f"{path}: field {e}: missing") from None
    except ConfigError as e:
        raise AdapterError(f"{path}: {e}") from None
    weights = SafetensorsFile(os.path.join(adapter_dir, WEIGHTS_FILE))
    present = set(weights.keys())
    shapes = adapter_shapes(cfg, s)["layers"]
    out = {}
    for t in s.targets:
        name = TARGETS[t][0]
        halves = {}
        for half, key in (("A", "a"), ("B", "b")):
            per_layer = []
            for i in range(cfg.num_layers):
                tensor = _peft_name(t, i, half)
                if tensor not in present:
                    raise AdapterError(f"{weights.path}: tensor '{tensor}' missing (target {t}, layer {i})")
                x = np.asarray(weights.get(tensor), np.float32)
                want = (s.rank, math.prod(shapes[name]["a"][1:-1])) if half == "A" else (
                    math.prod(shapes[name]["b"][2:]), s.rank)
                if x.shape != want:
                    raise AdapterError(f"{weights.path}: tensor '{tensor}': shape {x.shape}, the model needs {want}")
                per_layer.append(x.T.reshape(shapes[name][key][1:]))
            halves[key] = jnp.asarray(np.stack(per_layer))
        out[name] = halves
    return {"layers": out}, s
