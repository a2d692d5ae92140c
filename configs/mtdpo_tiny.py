"""Baseline at toy scale: multi-turn DPO on SYNTHETIC trajectory pairs with a tiny Llama (the recipe of
configs/mtdpo_8b.py: the ground-truth pairs without the information prefix, every agent turn summed, NLL 0.01).
Model size, learning rate and epochs are tiny-model settings (`recipe_tiny`)."""

from sweet_jax.training.defaults import recipe_tiny


def get_config():
    c = recipe_tiny("dpo", "mtdpo_tiny")
    c.data.kind = "trajectory_pairs"
    c.data.with_info = False
    c.data.score_span = "assistant"
    c.loss.beta = 0.1
    c.loss.nll_coef = 0.01
    c.loss.nll_span = "score"
    c.loss.reduction = "sum"
    return c
