"""sweet_jax: SWEET-RL and ColBench in JAX."""

__version__ = "0.1.0"
