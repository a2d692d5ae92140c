"""Low-rank adapters (LoRA) for the decoder's projections, in PEFT's format in and out.

An adapter on a projection W (our layout, e.g. wq [L, D, N, H]) is a pair A, B with W' = W + (alpha / rank) * A B:
A spans W's input dimensions and the rank, B the rank and W's output dimensions, each stacked over the layers like
W, and each carrying W's logical axis names with "lora_rank" (replicated) for the rank, so the rules table shards
an adapter as it shards its base weight:

    wq: a [L, D, r] ("layers", "embed", "lora_rank")    b [L, r, N, H] ("layers", "lora_rank", "q_heads", "head_dim")
    wo: a [L, N, H, r] ("layers", "q_heads", "head_dim", "lora_rank")    b [L, r, D] ("layers", "lora_rank", "embed")

Targets are named as PEFT names them (the HF module names): q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj,
down_proj. `merge` gives the adapted parameters, which every forward function takes as they are. PEFT's adapter
directory is `adapter_config.json` + `adapter_model.safetensors` with `lora_A.weight` [r, in] and `lora_B.weight`
[out, r] per module (`save_peft_adapter`, `load_peft_adapter`); like PEFT, a fresh adapter has B = 0, so it starts
as the base model.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np

from sweet_jax.models.config import LlamaConfig

Params = dict
CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
# PEFT's target name -> (our weight, how many of its leading dims after the layer axis are inputs, HF module path)
TARGETS = {
    "q_proj": ("wq", 1, "self_attn.q_proj"), "k_proj": ("wk", 1, "self_attn.k_proj"),
    "v_proj": ("wv", 1, "self_attn.v_proj"), "o_proj": ("wo", 2, "self_attn.o_proj"),
    "gate_proj": ("w_gate", 1, "mlp.gate_proj"), "up_proj": ("w_up", 1, "mlp.up_proj"),
    "down_proj": ("w_down", 1, "mlp.down_proj"),
}


class AdapterError(ValueError):
    """An adapter that does not fit the model or is not a LoRA adapter; the message names the file and field."""


@dataclasses.dataclass(frozen=True)
class LoraSettings:
    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")

    def __post_init__(self):
        unknown = [t for t in self.targets if t not in TARGETS]
        if unknown or not self.targets:
            raise AdapterError(f"LoRA targets must be some of {', '.join(TARGETS)}, got {list(self.targets)}")
        if self.rank < 1 or not 0 <= self.dropout < 1:
            raise AdapterError(f"LoRA rank must be >= 1 and dropout in [0, 1), got rank={self.rank}, "
                               f"dropout={self.dropout}")

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


def _split(cfg: LlamaConfig, target: str) -> tuple[str, tuple, tuple, tuple, tuple]:
    """(our weight, input shape, input axes, output shape, output axes) of a target, past the layer axis."""
    from sweet_jax.models.families import family_of  # the model-family seam: every registered family's decoder

    fam = family_of(cfg)
    name, inputs, _ = TARGETS[target]
    shape, axes = fam.param_shapes(cfg)["layers"][name][1:], fam.param_logical_axes(cfg)["layers"][name][1:]
    return name, shape[:inputs], axes[:inputs], shape[inputs:], axes[inputs:]


def adapter_shapes(cfg: LlamaConfig, s: LoraSettings) -> Params:
    out = {}
    for t in s.targets:
        name, in_shape, _, out_shape, _ = _split(cfg, t)
        out[name] = {"a": (cfg.num_layers, *in_shape, s.rank), "b": (cfg.num_layers, s.rank, *out_shape)}
    return {"layers": out}


def adapter_logical_axes(cfg: LlamaConfig, s: LoraSettings) -> Params:
    out = {}
    for t in s.targets:
        name, _, in_axes, _, out_axes = _split(cfg, t)
        out[name] = {"a": ("layers", *in_axes, "lora_rank"), "b": ("layers", "lora_rank", *out_axes)}
    return {"layers": out}


def init_adapters(cfg: LlamaConfig, s: LoraSettings, key: jax.Array, dtype=jnp.float32) -> Params:
    """PEFT's initialisation: A uniform in +-1/sqrt(fan_in) (kaiming-uniform with a = sqrt(5)), B zero."""
    shapes = adapter_shapes(cfg, s)["layers"]
    keys = jax.random.split(key, len(shapes))
    out = {}
    for k, (name, sh) in zip(keys, sorted(shapes.items())):
        fan_in = math.prod(sh["a"][1:-1])
        bound = 1.0 / math.sqrt(fan_in)
        out[name] = {"a": jax.random.uniform(k, sh["a"], dtype, -bound, bound), "b": jnp.zeros(sh["b"], dtype)}
    return {"layers": out}


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
    except AdapterError as e:
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
