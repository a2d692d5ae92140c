"""SWEET critic on SYNTHETIC collaborative data with a random-init tiny Llama: the embedded default job.

Runs on 2 CPU cores in under a minute with no network (44-49 s through launch/train.sh, 48-64 s on glibc's malloc,
2026-12-07). The critic sees the reference solution (training-time information) before the conversation and learns
to prefer trajectories whose final answer matches it: held-out pair accuracy 0.97 (tests/test_learning_signal.py
asks for >= 0.9). With --config.data.with_info=False the same recipe has no way to tell the answers apart and stays
at chance (the control). Learning rate, beta, init scale and the frozen embedding are tiny-model settings, not the
8B recipe's.
"""

from sweet_jax.training.defaults import recipe_tiny


def get_config():
    # The tiny Llama (random init; the Llama-3 tokenizer cut to 8k entries) with init std 0.1, ~1/sqrt(hidden). At
    # the 8B's 0.02 a 64-wide model starts with near-zero attention logits, and the circuit the critic needs (attend
    # from the answer's constant to the one in the information) sits on a long plateau.
    c = recipe_tiny("critic", "critic_tiny")
    c.data.kind = "trajectory_pairs"
    c.data.with_info = True
    c.data.score_span = "response"  # the final answer only: the tiny job's cost is the vocabulary projection
    c.data.synthetic.num_tasks = 800
    c.loss.beta = 1.0
    c.loss.reduction = "trajectory_mean"
    c.optim.lr = 3e-3
    # The random embedding (tied, so also the LM head) stays fixed: near-orthogonal rows make copying a constant from
    # the information a clean circuit, and the 8k x 64 table needs no gradient or Adam state.
    c.optim.freeze = "embed"
    c.train.epochs = 2
    c.train.eval_every = 60
    return c
