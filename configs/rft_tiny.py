"""Baseline at toy scale: rejection fine-tuning on the successful SYNTHETIC trajectories with a tiny Llama (the
recipe of configs/rft_8b.py: token-mean NLL on every agent turn). Model size, learning rate and epochs are tiny-model
settings (`recipe_tiny`)."""

from sweet_jax.training.defaults import recipe_tiny


def get_config():
    c = recipe_tiny("sft", "rft_tiny")
    c.data.kind = "rft"
    c.data.score_span = "assistant"
    return c
