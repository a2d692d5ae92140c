"""The offline trainer: defaults, optimiser, data pipeline, jitted steps and the loop (`python -m sweet_jax.train`)."""
