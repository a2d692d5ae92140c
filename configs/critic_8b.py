"""SWEET-RL step 2: the critic (Llama-3.1-8B-Instruct) on ground-truth preference pairs, backend (spec section 4).

The critic sees "In light that the final answer is: <reference>." before the conversation; its trajectory reward is
beta * (mean assistant-token log-prob - the frozen initial critic's). Table 5: lr 2e-7, beta 0.1, NLL 0.01, batch 8,
4 epochs; max_len 8192. (The README's command has no NLL flag, i.e. 0: --config.loss.nll_coef=0.)
Point --config.model.hf_path and --config.data.path at your local copies.
"""

from sweet_jax.training.defaults import base_config


def get_config():
    c = base_config()
    c.objective = "critic"
    c.model.hf_path = "checkpoints/Llama-3.1-8B-Instruct"
    c.model.compute_dtype = "bfloat16"  # f32 master weights, bf16 compute
    c.model.remat_policy = "dots_no_batch"
    c.data.kind = "trajectory_pairs"
    c.data.path = "data/colbench_code_offline_15k_llama8b.jsonl"
    c.data.with_info = True
    c.data.mask_style = "official"  # header "\n\n" + content + eot of every assistant turn, as the official code
    c.data.score_span = "assistant"
    c.data.max_len = 8192
    c.loss.beta = 0.1
    c.loss.nll_coef = 0.01
    c.loss.nll_span = "score"
    c.loss.reduction = "trajectory_mean"  # official code; the paper's Eq. 2/3: "turn_mean_sum"
    c.optim.lr = 2e-7
    c.optim.batch_size = 8
    c.optim.micro_batch_size = 1
    c.train.epochs = 4
    c.train.output_dir = "runs/critic_8b"
    c.train.checkpoint_every = 200
    c.train.eval_every = 200
    return c
