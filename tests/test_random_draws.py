"""A fresh init's draws (`models.random_draws`) equal jax's per-shape draws bit for bit, from one compiled program per
size bucket: the init of a model (and of its adapters) is the one the plain per-leaf `jax.random` calls give."""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sweet_jax.models import init_params, param_shapes, random_draws
from sweet_jax.models.model_configs import LlamaConfig, LoraSettings

SHAPES = [(1,), (7,), (3, 5, 7), (64, 176), (2, 64, 176), (2, 4, 16, 64), (1000, 3), (8192, 64)]


def bits(x) -> np.ndarray:
    x = np.asarray(x)
    return x.view(np.uint16 if x.dtype.itemsize == 2 else np.uint32)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
def test_a_normal_draw_is_the_per_shape_draw(dtype):
    for i, shape in enumerate(SHAPES):
        k = jax.random.fold_in(jax.random.key(7), i)
        want = (0.02 * jax.random.normal(k, shape, jnp.float32)).astype(dtype)
        got = random_draws.normal(k, shape, 0.02, dtype)
        assert got.shape == want.shape and got.dtype == want.dtype, shape
        np.testing.assert_array_equal(bits(got), bits(want), err_msg=str(shape))


def test_a_uniform_draw_and_a_constant_are_jaxs():
    for i, shape in enumerate(SHAPES):
        k = jax.random.fold_in(jax.random.key(8), i)
        want = jax.random.uniform(k, shape, jnp.float32, -0.125, 0.125)
        np.testing.assert_array_equal(bits(random_draws.uniform(k, shape, jnp.float32, -0.125, 0.125)), bits(want))
    ones = random_draws.constant((2, 3), jnp.bfloat16, 1.0, jax.random.key(0))
    assert ones.dtype == jnp.bfloat16 and np.array_equal(np.asarray(ones, np.float32), np.ones((2, 3)))


def test_under_jit_a_draw_is_traced_as_jaxs():
    def plain(k):
        return (0.5 * jax.random.normal(k, (3, 4), jnp.float32)).astype(jnp.bfloat16), jnp.ones((2,), jnp.float32)

    def ours(k):
        return random_draws.normal(k, (3, 4), 0.5, jnp.bfloat16), random_draws.constant((2,), jnp.float32, 1.0, k)

    k = jax.random.key(3)
    for a, b in zip(jax.jit(ours)(k), jax.jit(plain)(k)):
        np.testing.assert_array_equal(bits(a), bits(b))


def _is_shape(x) -> bool:
    return isinstance(x, tuple)


def _shapes_by_path(tree) -> list[tuple[str, tuple]]:
    return [(jax.tree_util.keystr(p), s) for p, s in jax.tree_util.tree_flatten_with_path(tree, is_leaf=_is_shape)[0]]


def test_init_params_is_the_per_leaf_init_and_draws_at_a_few_sizes(caplog):
    cfg = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=80, num_layers=2, num_heads=4, num_kv_heads=2,
                      head_dim=8, param_dtype="bfloat16", lora=LoraSettings(rank=4, targets=("q_proj", "down_proj")))
    key = jax.random.key(11)
    params = init_params(cfg, key, std=0.05)
    # the init as plain jax calls, one per leaf, in llama.init_params's and lora_layers.init_adapters_of's order
    shapes = param_shapes(cfg)
    base = {k: v for k, v in shapes.items() if k != "lora"}
    leaves = _shapes_by_path(base)
    want = [jnp.ones(shape, jnp.bfloat16) if "norm" in path else
            (0.05 * jax.random.normal(k, shape, jnp.float32)).astype(jnp.bfloat16)
            for (path, shape), k in zip(leaves, jax.random.split(key, len(leaves)))]
    got = jax.tree.leaves({k: v for k, v in params.items() if k != "lora"})
    assert len(got) == len(want) == 12  # embed, lm_head, final_norm and 9 stacked layer weights
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_array_equal(bits(g), bits(w))
    adapters = shapes["lora"]["layers"]
    for k, (name, sh) in zip(jax.random.split(jax.random.fold_in(key, 1), len(adapters)), sorted(adapters.items())):
        bound = 1.0 / np.sqrt(np.prod(sh["a"][1:-1]))
        np.testing.assert_array_equal(bits(params["lora"]["layers"][name]["a"]),
                                      bits(jax.random.uniform(k, sh["a"], jnp.float32, -bound, bound)))
        assert params["lora"]["layers"][name]["b"].shape == sh["b"] and not np.any(params["lora"]["layers"][name]["b"])

    # a model of other shapes draws at the sizes' buckets: programs only for the buckets the first model had not
    other = cfg.replace(vocab_size=80, hidden_size=24, intermediate_size=72, head_dim=6, lora=None)

    def buckets(c):
        return {1 << (int(np.prod(s)) - 1).bit_length() for p, s in _shapes_by_path(param_shapes(c)) if "norm" not in p}

    new = buckets(other) - buckets(cfg.replace(lora=None))
    assert len(new) < len(_shapes_by_path(param_shapes(other))) - 3  # fewer than its shapes
    with jax.log_compiles(True), caplog.at_level(logging.DEBUG, logger="jax"):
        init_params(other, jax.random.key(12), std=0.05)
    compiled = [r.getMessage() for r in caplog.records if "Finished XLA compilation of jit(_normal)" in r.getMessage()]
    assert len(compiled) == len(new), (compiled, new)
