"""Baseline: multi-turn DPO on whole trajectories: the ground-truth pairs of step 1 without the
information prefix, every agent turn scored (summed), NLL 0.01. Table 5: lr 2e-7, beta 0.1, batch 8, 4 epochs."""

from sweet_jax.training.defaults import recipe_8b


def get_config():
    c = recipe_8b("dpo")
    c.data.kind = "trajectory_pairs"
    c.data.with_info = False
    c.data.score_span = "assistant"
    c.data.max_len = 16384
    # `plan --mesh fsdp=8` at 16384 tokens: 126 GiB per device with dots_no_batch, 62 GiB with qkv_proj
    c.model.remat_policy = "qkv_proj"
    c.loss.beta = 0.1
    c.loss.nll_coef = 0.01
    c.loss.nll_span = "score"
    c.loss.reduction = "sum"
    c.train.epochs = 4
    c.train.output_dir = "runs/mtdpo_8b"
    return c
