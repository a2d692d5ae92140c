"""Baseline at toy scale: rejection fine-tuning on the successful SYNTHETIC trajectories with a tiny Llama (the
recipe of configs/rft_8b.py: token-mean NLL on every agent turn). Model size, learning rate and epochs are tiny-model
settings, as in configs/critic_tiny.py."""

import ml_collections

from sweet_jax.training.defaults import base_config


def get_config():
    c = base_config()
    c.objective = "sft"
    c.model.preset = "tiny"
    c.model.preset_overrides = ml_collections.ConfigDict(dict(hidden_size=64, intermediate_size=176, num_layers=2,
                                                              num_heads=4, num_kv_heads=2, tie_word_embeddings=True))
    c.model.init_std = 0.1
    c.data.kind = "rft"
    c.data.score_span = "assistant"
    c.data.max_len = 512
    c.data.synthetic.num_tasks = 400
    c.data.synthetic.num_constants = 4
    c.data.synthetic.compact = True
    c.data.eval_fraction = 0.1
    c.optim.lr = 1e-3
    c.optim.batch_size = 8
    c.optim.micro_batch_size = 8
    c.train.epochs = 1
    c.train.output_dir = "runs/rft_tiny"
    c.train.log_every = 5
    c.train.checkpoint_every = 50
    c.train.eval_batch_size = 32
    c.train.logprob_chunk = 128
    c.train.export_dtype = "float32"
    return c
