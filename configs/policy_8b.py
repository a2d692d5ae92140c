"""SWEET-RL step 6: the actor. DPO of Llama-3.1-8B-Instruct on critic-ranked candidate pairs.

Pairs: for each state, 4 draws of a top-half vs a bottom-half candidate of the 16 ranked by the critic.
Official scoring: the sum of log-probs over the whole sequence (the prompt cancels in the DPO logit) and an NLL
term of 0.01 on the token-mean over the entire chosen sequence. Table 5: lr 2e-7, beta 0.1, batch 8, 1 epoch;
max_len 16384. --config.data.path: the ranked file from the ranking step.
"""

from sweet_jax.training.defaults import recipe_8b


def get_config():
    c = recipe_8b("dpo")
    c.data.kind = "ranked_pairs"
    c.data.path = "data/colbench_ranked.jsonl"
    c.data.num_pairs = 4
    c.data.score_span = "all"
    c.data.max_len = 16384
    # `plan --mesh fsdp=8` at 16384 tokens: 126 GiB per device with dots_no_batch, 62 GiB with qkv_proj
    c.model.remat_policy = "qkv_proj"
    c.loss.beta = 0.1
    c.loss.nll_coef = 0.01
    c.loss.nll_span = "all"
    c.loss.reduction = "sum"
    c.train.epochs = 1
    c.train.output_dir = "runs/policy_8b"
    return c
