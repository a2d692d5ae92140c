"""SWEET actor DPO on SYNTHETIC ranked candidates with a random-init tiny Llama (CPU, a few minutes, no network).

The ranked file is generated on first use: final-answer states of scripted synthetic collaborations, 16 candidate
answers each, with synthetic judge scores. Otherwise the official policy recipe: sum log-probs over the whole
sequence, NLL 0.01 over the whole chosen sequence. Learning rate is a tiny-model setting.
"""

import ml_collections

from sweet_jax.training.defaults import TINY_MODEL, TINY_TOKENIZER, base_config


def get_config():
    c = base_config()
    c.objective = "dpo"
    c.tokenizer_path = TINY_TOKENIZER  # the Llama-3 tokenizer cut down to 8k entries
    c.model.preset = "tiny"  # random init
    c.model.preset_overrides = ml_collections.ConfigDict(TINY_MODEL)
    c.data.kind = "ranked_pairs"
    c.data.synthetic.num_tasks = 150
    c.data.num_pairs = 4
    c.data.score_span = "response"  # the prompt cancels in the DPO logit; scoring the response is cheaper
    c.data.max_len = 512
    c.data.shapes = "job"  # one shape for the job's splits: a tiny job's time is mostly compiling
    c.data.eval_fraction = 0.1
    c.loss.beta = 0.1
    c.loss.nll_coef = 0.01
    c.loss.nll_span = "response"
    c.loss.reduction = "sum"
    c.optim.lr = 1e-3
    c.optim.batch_size = 8
    c.optim.micro_batch_size = 8
    c.train.epochs = 1
    c.train.output_dir = "runs/policy_tiny"
    c.train.log_every = 5
    c.train.checkpoint_every = 20
    c.train.eval_batch_size = 32
    c.train.logprob_chunk = 128
    c.train.export_dtype = "float32"
    return c
