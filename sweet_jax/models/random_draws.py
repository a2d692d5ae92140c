"""The random draws of a fresh init (`llama.init_params`, `lora_layers.init_adapters_of`), with the values of
`jax.random.normal` / `jax.random.uniform` at the weight's shape, from a few compiled programs.

Run eagerly, `jax.random.normal(key, shape)` compiles one program per shape (about 0.3 s each on a 2-core CPU: a
model has a dozen shapes, and a test suite of tiny models hundreds). With threefry's partitionable scheme (jax's
default) each value depends only on the key and its flat index, so a draw of n values is the first n of a draw of
any size N >= n, in row-major order: a draw is made at its size's bucket (a power of two), cut and reshaped on the
host, and put back on the device. The scaling and the cast are the same IEEE operations, so every value equals the
per-shape draw's bit for bit (`tests/test_random_draws.py`). Under `jit` (a sharded init), with the partitionable
scheme turned off, or past `LARGEST` values, a draw is the plain per-shape one.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

LARGEST = 1 << 24  # values: a larger draw is made at its own shape (at most 2x the values drawn below this)


def _bucket(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def eager(key: jax.Array) -> bool:
    """Whether `key` is a value, not a tracer: an init run outside `jit`, whose draws and constants come from the
    host."""
    return not isinstance(key, jax.core.Tracer)


def _from_bucket(draw, key: jax.Array, shape: tuple[int, ...]) -> np.ndarray | None:
    """`draw(key, shape)` on the host, drawn at the size's bucket and cut; None where it must be the plain draw."""
    n = int(np.prod(shape, dtype=np.int64))
    if not eager(key) or not jax.config.jax_threefry_partitionable or n > LARGEST:
        return None
    return np.asarray(draw(key, (_bucket(n),)))[:n].reshape(shape)


def normal(key: jax.Array, shape: tuple[int, ...], std: float, dtype) -> jax.Array:
    """`(std * jax.random.normal(key, shape, float32)).astype(dtype)`."""
    flat = _from_bucket(lambda k, s: jax.random.normal(k, s, jnp.float32), key, shape)
    if flat is None:
        return (std * jax.random.normal(key, shape, jnp.float32)).astype(dtype)
    return jnp.asarray((np.float32(std) * flat).astype(jnp.dtype(dtype)))


def uniform(key: jax.Array, shape: tuple[int, ...], dtype, minval: float, maxval: float) -> jax.Array:
    """`jax.random.uniform(key, shape, dtype, minval, maxval)`."""
    flat = _from_bucket(lambda k, s: jax.random.uniform(k, s, dtype, minval, maxval), key, shape)
    return jax.random.uniform(key, shape, dtype, minval, maxval) if flat is None else jnp.asarray(flat)


def constant(shape: tuple[int, ...], dtype, value: float, key: jax.Array) -> jax.Array:
    """`jnp.full(shape, value, dtype)` in an init whose draws use `key`: outside `jit`, made on the host and put on the
    device (an eager `jnp.full` compiles a program per shape)."""
    if not eager(key):
        return jnp.full(shape, value, dtype)
    return jnp.asarray(np.full(shape, value, dtype=jnp.dtype(dtype)))
