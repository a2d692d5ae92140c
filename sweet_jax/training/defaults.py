"""What the job configs in configs/ start from: every setting at its default (`base_config()`, from the schema in
`training.job_config`), the paper's 8B recipe, the toy-scale recipe, and their 70B and LoRA variants."""

from __future__ import annotations

import ml_collections

# The toy-scale jobs' tokenizer: the Llama-3 tokenizer cut down to its first 8,192 entries (special tokens included,
# `chat.tokenizers.cut_vocabulary`). A tiny model's step time goes to its vocabulary projection, and 8k entries cost
# a sixteenth of the full 128k; every text still encodes, about 20% longer.
TINY_TOKENIZER = "bundled:llama3-8k"
TINY_VOCAB = 8192
TINY_MODEL = dict(hidden_size=64, intermediate_size=176, num_layers=2, num_heads=4, num_kv_heads=2,
                  vocab_size=TINY_VOCAB)


def base_config() -> ml_collections.ConfigDict:
    """Every job setting at its default (`training.job_config.JobConfig`, where each is declared with its meaning),
    as the ConfigDict a config file overrides."""
    from sweet_jax.training.job_config import JobConfig

    return JobConfig().to_config_dict()


def recipe_8b(objective: str) -> ml_collections.ConfigDict:
    """What every Llama-3.1-8B-Instruct recipe of the paper shares (Table 5): lr 2e-7, batch 8 of
    micro-batch 1, bf16 compute over f32 master weights, the official multi-turn mask."""
    c = base_config()
    c.objective = objective
    c.model.hf_path = "meta-llama/Llama-3.1-8B-Instruct"
    c.model.preset = "llama3.1-8b"  # the architecture for `sweet_jax.plan` when hf_path is not at hand
    c.model.compute_dtype = "bfloat16"
    c.model.remat_policy = "dots_no_batch"
    c.data.path = "data/colbench_code_offline_15k_llama8b.jsonl"
    c.data.mask_style = "official"  # header "\n\n" + content + eot of every assistant turn, as the official code
    c.optim.lr = 2e-7
    c.optim.batch_size = 8
    c.optim.micro_batch_size = 1
    c.train.checkpoint_every = 200
    c.train.eval_every = 200
    return c


def recipe_tiny(objective: str, name: str) -> ml_collections.ConfigDict:
    """What the toy-scale jobs share (configs/critic_tiny.py, rft_tiny.py, mtdpo_tiny.py): a random-init tiny model
    (64 wide, 2 layers, tied embeddings, init std 0.1) with the cut-down Llama-3 tokenizer (`TINY_TOKENIZER`),
    SYNTHETIC compact data over 4 constants, one shape for the job's splits, batch 8, one epoch, f32, a learning rate
    for a 64-wide model. A few minutes on a laptop CPU."""
    c = base_config()
    c.objective = objective
    c.tokenizer_path = TINY_TOKENIZER
    c.model.preset = "tiny"
    c.model.preset_overrides = ml_collections.ConfigDict(dict(TINY_MODEL, tie_word_embeddings=True))
    c.model.init_std = 0.1
    c.data.max_len = 512
    c.data.shapes = "job"  # one shape for the job's splits: a tiny job's time is mostly compiling
    c.data.synthetic.num_tasks = 400
    c.data.synthetic.num_constants = 4
    c.data.synthetic.compact = True
    c.data.eval_fraction = 0.1
    c.optim.lr = 1e-3
    c.optim.batch_size = 8
    c.optim.micro_batch_size = 8
    c.train.epochs = 1
    c.train.output_dir = f"runs/{name}"
    c.train.log_every = 5
    c.train.checkpoint_every = 50
    c.train.eval_batch_size = 32
    c.train.logprob_chunk = 128
    c.train.export_dtype = "float32"
    return c


def derived_from(config_file: str, sibling: str) -> ml_collections.ConfigDict:
    """Load `get_config()` of another config file in the same directory (e.g. a 70B variant of an 8B recipe)."""
    import importlib.util
    import os

    path = os.path.join(os.path.dirname(os.path.abspath(config_file)), sibling)
    spec = importlib.util.spec_from_file_location(os.path.splitext(sibling)[0], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def to_70b(c: ml_collections.ConfigDict, name: str) -> ml_collections.ConfigDict:
    """The same recipe on Llama-3.1-70B-Instruct (Table 4), with full rematerialisation."""
    c.model.hf_path = "meta-llama/Llama-3.1-70B-Instruct"
    c.model.preset = "llama3.1-70b"
    c.model.remat_policy = "full"
    c.train.output_dir = f"runs/{name}"
    return c


def with_lora(c: ml_collections.ConfigDict, name: str, rank: int = 16) -> ml_collections.ConfigDict:
    """The same recipe training low-rank adapters (`models.lora`) on every projection: alpha 2 x rank, no dropout,
    the base frozen in bf16, the reference the base with the adapters off (the cached pass, which measured faster
    than recomputing it in every step: bench/dpo_step.py --lora; no second copy either way), and a learning rate for
    adapters (1e-5: they start at zero; untuned, not the paper's)."""
    c.lora.rank = rank
    c.lora.alpha = 2.0 * rank
    c.lora.dropout = 0.0
    c.lora.targets = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
    c.model.param_dtype = "bfloat16"
    c.optim.lr = 1e-5
    c.train.output_dir = f"runs/{name}"
    return c
