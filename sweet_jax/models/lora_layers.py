"""What the decoder needs of low-rank adapters (`models.lora`): their shapes and logical axes beside the base weights
they adapt, their fresh values, their term in a projection, and their input dropout.

An adapter on a stacked weight W [L, *in, *out] is A [L, *in, r] and B [L, r, *out], W's logical axes with
"lora_rank" (replicated) for r, so the rules table shards an adapter as it shards W. The params of an adapted model
hold the adapters under "lora" ({"layers": {weight: {"a", "b"}}}), in f32 over any base dtype (`DTYPE`).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from sweet_jax.models import random_draws
from sweet_jax.models.model_configs import LORA_TARGETS, LoraSettings

Params = dict
DTYPE = jnp.float32  # adapters are trained, so they keep f32 master weights over any base dtype
# PEFT's target name -> (our weight, how many of its dims after the layer axis are inputs, HF module path)
TARGETS = {
    "q_proj": ("wq", 1, "self_attn.q_proj"), "k_proj": ("wk", 1, "self_attn.k_proj"),
    "v_proj": ("wv", 1, "self_attn.v_proj"), "o_proj": ("wo", 2, "self_attn.o_proj"),
    "gate_proj": ("w_gate", 1, "mlp.gate_proj"), "up_proj": ("w_up", 1, "mlp.up_proj"),
    "down_proj": ("w_down", 1, "mlp.down_proj"),
}
assert tuple(TARGETS) == LORA_TARGETS


def adapter_shapes_of(layer_shapes: dict, s: LoraSettings) -> Params:
    """{"layers": {weight: {"a": shape, "b": shape}}} for the base's stacked layer shapes `layer_shapes`."""
    out = {}
    for t in s.targets:
        name, inputs, _ = TARGETS[t]
        layers, *dims = layer_shapes[name]
        out[name] = {"a": (layers, *dims[:inputs], s.rank), "b": (layers, s.rank, *dims[inputs:])}
    return {"layers": out}


def adapter_axes_of(layer_axes: dict, s: LoraSettings) -> Params:
    """The logical axes of `adapter_shapes_of`: each adapter's base weight's, with "lora_rank" for the rank."""
    out = {}
    for t in s.targets:
        name, inputs, _ = TARGETS[t]
        layers, *dims = layer_axes[name]
        out[name] = {"a": (layers, *dims[:inputs], "lora_rank"), "b": (layers, "lora_rank", *dims[inputs:])}
    return {"layers": out}


def init_adapters_of(shapes: Params, key: jax.Array, dtype=DTYPE) -> Params:
    """PEFT's initialisation of adapters of `shapes`: A uniform in +-1/sqrt(fan_in) (kaiming-uniform with
    a = sqrt(5)), B zero, so the adapted model starts as its base."""
    layers = shapes["layers"]
    keys = jax.random.split(key, len(layers))
    out = {}
    for k, (name, sh) in zip(keys, sorted(layers.items())):
        bound = 1.0 / math.sqrt(math.prod(sh["a"][1:-1]))
        out[name] = {"a": random_draws.uniform(k, sh["a"], dtype, -bound, bound),
                     "b": random_draws.constant(sh["b"], dtype, 0.0, key)}
    return {"layers": out}


def delta(x: jnp.ndarray, ab: Params, scale: float) -> jnp.ndarray:
    """An adapter's term of a projection, scale * (x A) B: x [..., *in] -> [..., *out], without forming A B. Its
    gradient never needs the base weight's (the frozen base gets none)."""
    a, b = ab["a"], ab["b"]
    xa = jnp.tensordot(x, a.astype(x.dtype), axes=a.ndim - 1)
    return scale * jnp.tensordot(xa, b.astype(x.dtype), axes=1)


def dropout(x: jnp.ndarray, rate: float, key: jax.Array) -> jnp.ndarray:
    """Inverted dropout of an adapter's input (PEFT's `lora_dropout`): each element zeroed with probability `rate`,
    the rest scaled by 1 / (1 - rate)."""
    keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), 0).astype(x.dtype)


def base_of(params: Params) -> Params:
    """The base model's params: the adapted params with the adapters off (the same arrays, nothing copied)."""
    return {k: v for k, v in params.items() if k != "lora"}
