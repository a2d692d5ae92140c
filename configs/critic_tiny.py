"""SWEET critic on SYNTHETIC collaborative data with a random-init tiny Llama: the embedded default job.

Runs on 2 CPU cores in about 2.5 minutes with no network. The critic sees the reference solution (training-time
information) before the conversation and learns to prefer trajectories whose final answer matches it: held-out pair
accuracy >= 0.99 (tests/test_learning_signal.py). With --config.data.with_info=False the same recipe has no way to tell
the answers apart and stays at chance (the control). Learning rate, beta, init scale and the frozen embedding are
tiny-model settings, not the 8B recipe's.
"""

import ml_collections

from sweet_jax.training.defaults import base_config


def get_config():
    c = base_config()
    c.objective = "critic"
    c.model.preset = "tiny"  # random init; the vocabulary is the Llama-3 tokenizer's
    c.model.preset_overrides = ml_collections.ConfigDict(dict(hidden_size=64, intermediate_size=176, num_layers=2,
                                                              num_heads=4, num_kv_heads=2, tie_word_embeddings=True))
    # ~1/sqrt(hidden). At the 8B's 0.02 a 64-wide model starts with near-zero attention logits, and the circuit the
    # critic needs (attend from the answer's constant to the one in the information) sits on a long plateau.
    c.model.init_std = 0.1
    c.data.kind = "trajectory_pairs"
    c.data.with_info = True
    c.data.max_len = 512
    c.data.score_span = "response"  # the final answer only: the tiny job's cost is the 128k-vocab head
    c.data.synthetic.num_tasks = 800
    c.data.synthetic.num_constants = 4
    c.data.synthetic.compact = True
    c.data.eval_fraction = 0.1
    c.loss.beta = 1.0
    c.loss.reduction = "trajectory_mean"
    c.optim.lr = 3e-3
    c.optim.batch_size = 8
    c.optim.micro_batch_size = 8
    # The random embedding (tied, so also the LM head) stays fixed: near-orthogonal rows make copying a constant from
    # the information a clean circuit, and the 128k x 64 table needs no gradient or Adam state.
    c.optim.freeze = "embed"
    c.train.epochs = 2
    c.train.output_dir = "runs/critic_tiny"
    c.train.log_every = 5
    c.train.eval_every = 60
    c.train.logprob_chunk = 128
    c.train.checkpoint_every = 50
    c.train.eval_batch_size = 32
    c.train.export_dtype = "float32"
    return c
