"""Baseline at toy scale: multi-turn DPO on SYNTHETIC trajectory pairs with a tiny Llama (the recipe of
configs/mtdpo_8b.py: the ground-truth pairs without the information prefix, every agent turn summed, NLL 0.01).
Model size, learning rate and epochs are tiny-model settings, as in configs/critic_tiny.py."""

import ml_collections

from sweet_jax.training.defaults import base_config


def get_config():
    c = base_config()
    c.objective = "dpo"
    c.model.preset = "tiny"
    c.model.preset_overrides = ml_collections.ConfigDict(dict(hidden_size=64, intermediate_size=176, num_layers=2,
                                                              num_heads=4, num_kv_heads=2, tie_word_embeddings=True))
    c.model.init_std = 0.1
    c.data.kind = "trajectory_pairs"
    c.data.with_info = False
    c.data.score_span = "assistant"
    c.data.max_len = 512
    c.data.synthetic.num_tasks = 400
    c.data.synthetic.num_constants = 4
    c.data.synthetic.compact = True
    c.data.eval_fraction = 0.1
    c.loss.beta = 0.1
    c.loss.nll_coef = 0.01
    c.loss.nll_span = "score"
    c.loss.reduction = "sum"
    c.optim.lr = 1e-3
    c.optim.batch_size = 8
    c.optim.micro_batch_size = 8
    c.train.epochs = 1
    c.train.output_dir = "runs/mtdpo_tiny"
    c.train.log_every = 5
    c.train.checkpoint_every = 50
    c.train.eval_batch_size = 32
    c.train.logprob_chunk = 128
    c.train.export_dtype = "float32"
    return c
