"""Serving: the batching engine and the OpenAI-compatible API (`python -m sweet_jax.serve`)."""
