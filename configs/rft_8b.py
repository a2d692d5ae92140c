"""Baseline: rejection fine-tuning: token-mean NLL on every agent turn of the successful
trajectories. Table 5: lr 2e-7, batch 32, 4 epochs."""

from sweet_jax.training.defaults import recipe_8b


def get_config():
    c = recipe_8b("sft")
    c.data.kind = "rft"
    c.data.score_span = "assistant"
    c.data.max_len = 16384
    # `plan --mesh fsdp=8` at 16384 tokens: 126 GiB per device with dots_no_batch, 62 GiB with qkv_proj
    c.model.remat_policy = "qkv_proj"
    c.optim.batch_size = 32
    c.train.epochs = 4
    c.train.output_dir = "runs/rft_8b"
    c.train.checkpoint_every = 400
    c.train.eval_every = 400
    return c
