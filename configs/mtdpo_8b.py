"""Baseline: multi-turn DPO on whole trajectories (spec section 5): the ground-truth pairs of step 1 without the
information prefix, every agent turn scored (summed), NLL 0.01. Table 5: lr 2e-7, beta 0.1, batch 8, 4 epochs."""

from sweet_jax.training.defaults import base_config


def get_config():
    c = base_config()
    c.objective = "dpo"
    c.model.hf_path = "checkpoints/Llama-3.1-8B-Instruct"
    c.model.compute_dtype = "bfloat16"
    c.model.remat_policy = "dots_no_batch"
    c.data.kind = "trajectory_pairs"
    c.data.path = "data/colbench_code_offline_15k_llama8b.jsonl"
    c.data.with_info = False
    c.data.mask_style = "official"
    c.data.score_span = "assistant"
    c.data.max_len = 16384
    c.loss.beta = 0.1
    c.loss.nll_coef = 0.01
    c.loss.nll_span = "score"
    c.loss.reduction = "sum"
    c.optim.lr = 2e-7
    c.optim.batch_size = 8
    c.optim.micro_batch_size = 1
    c.train.epochs = 4
    c.train.output_dir = "runs/mtdpo_8b"
    c.train.checkpoint_every = 200
    c.train.eval_every = 200
    return c
