"""SWEET-RL step 2: the critic (Llama-3.1-8B-Instruct) on ground-truth preference pairs, backend.

The critic sees "In light that the final answer is: <reference>." before the conversation; its trajectory reward is
beta * (mean assistant-token log-prob - the frozen initial critic's). Table 5: lr 2e-7, beta 0.1, NLL 0.01, batch 8,
4 epochs; max_len 8192. (The README's command has no NLL flag, i.e. 0: --config.loss.nll_coef=0.)
The model is the Hub id meta-llama/Llama-3.1-8B-Instruct (downloaded into the Hub cache on first use; a local
HF directory works too); point --config.data.path at your copy of the trajectories.
"""

from sweet_jax.training.defaults import recipe_8b


def get_config():
    c = recipe_8b("critic")
    c.data.kind = "trajectory_pairs"
    c.data.with_info = True
    c.data.score_span = "assistant"
    c.data.max_len = 8192
    c.loss.beta = 0.1
    c.loss.nll_coef = 0.01
    c.loss.nll_span = "score"
    c.loss.reduction = "trajectory_mean"  # the official code; the paper's Eq. 2/3 is "turn_mean_sum"
    c.train.epochs = 4
    c.train.output_dir = "runs/critic_8b"
    return c
