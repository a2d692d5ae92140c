"""Baseline: rejection fine-tuning (spec section 5): token-mean NLL on every agent turn of the successful
trajectories. Table 5: lr 2e-7, batch 32, 4 epochs."""

from sweet_jax.training.defaults import base_config


def get_config():
    c = base_config()
    c.objective = "sft"
    c.model.hf_path = "checkpoints/Llama-3.1-8B-Instruct"
    c.model.compute_dtype = "bfloat16"
    c.model.remat_policy = "dots_no_batch"
    c.data.kind = "rft"
    c.data.path = "data/colbench_code_offline_15k_llama8b.jsonl"
    c.data.mask_style = "official"
    c.data.score_span = "assistant"
    c.data.max_len = 16384
    c.optim.lr = 2e-7
    c.optim.batch_size = 32
    c.optim.micro_batch_size = 1
    c.train.epochs = 4
    c.train.output_dir = "runs/rft_8b"
    c.train.checkpoint_every = 400
    c.train.eval_every = 400
    return c
