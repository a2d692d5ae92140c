"""Defaults shared by every job config in configs/. A config file starts from `base_config()` and overrides fields.

Optimiser and schedule defaults are the official recipe's: AdamW (0.9, 0.95), weight decay 0,
clip 1.0, 3% warmup, cosine to 10% of lr, seed 42, the first 3% held out.
"""

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
    c = ml_collections.ConfigDict()
    c.objective = "critic"  # critic | dpo | sft
    # default: the model directory, else the bundled tokenizer of its chat format; a directory or bundled:NAME
    # (chat.tokenizers: bundled:llama3, bundled:llama3-8k)
    c.tokenizer_path = ""

    c.model = ml_collections.ConfigDict()
    c.model.hf_path = ""  # an HF checkpoint directory; empty: random init from `preset`
    c.model.preset = "tiny"
    c.model.preset_overrides = ml_collections.ConfigDict()
    c.model.init_seed = 0
    c.model.init_std = 0.02
    c.model.param_dtype = "float32"  # master weights
    c.model.compute_dtype = "float32"
    c.model.remat_policy = "none"
    c.model.attention_impl = "auto"  # auto | reference | xla | cudnn | splash (models.kernel_choice: by device)
    # auto | default | tensorfloat32 | float32: auto multiplies f32 as true f32 (on NVIDIA GPUs jax's default is TF32,
    # ~1e-3 relative), and bf16 as bf16 with f32 accumulation
    c.model.matmul_precision = "auto"

    # Low-rank adapters (models.lora): rank > 0 trains adapters on these projections (PEFT's names, comma-separated)
    # while the base model stays fixed in model.param_dtype; rank 0 trains the full model. The reference is the base
    # with the adapters off (loss.reference "recompute": in each step, from the same weights).
    c.lora = ml_collections.ConfigDict(dict(rank=0, alpha=16.0, dropout=0.0, targets="q_proj,k_proj,v_proj,o_proj"))

    c.data = ml_collections.ConfigDict()
    # trajectory_pairs | ranked_pairs | text_pairs (an official pair file: {"chosen": {"input", "output"},
    # "rejected": ...} per line, any information prefix already in the inputs) | rft | turn_values | image_pairs
    c.data.kind = "trajectory_pairs"
    c.data.path = ""  # jsonl / parquet / hub name; empty: synthetic data generated on first use
    c.data.synthetic = ml_collections.ConfigDict(dict(num_tasks=400, rollouts=3, p_correct=0.5, seed=0,
                                                          num_constants=20, compact=False))
    c.data.with_info = False  # prefix the training-time information (the critic)
    c.data.info_key = "ground_truth"
    c.data.mask_style = "content"  # content | official (also the "\n\n" after each assistant header)
    c.data.score_span = "assistant"  # assistant | response | all
    c.data.max_len = 8192
    c.data.min_bucket = 128
    c.data.eval_fraction = 0.03
    c.data.on_error = "raise"  # raise | skip
    c.data.min_best_reward = 1.0
    c.data.num_pairs = 4  # ranked pairs per state
    # Pairs go through the model as one row [common history, chosen, rejected] (sweet_jax.data.packing), when that
    # saves at least pack_min_saving of their tokens; otherwise (or pack_pairs=False) as two plain rows. SFT examples
    # go several to a row (each its own segment) when that saves pack_min_saving of the padded tokens; rows are as
    # long as the batch's longest example (its plain row), or pack_length tokens when that is longer.
    c.data.pack_pairs = True
    c.data.pack_examples = True
    c.data.pack_length = 0
    c.data.pack_min_saving = 0.1
    c.data.seed = 42
    # image pairs (data.kind "image_pairs"): images are resized to between these many pixels (0: the model's
    # preprocessor_config.json, else Qwen2-VL's defaults)
    c.data.image_min_pixels = 0
    c.data.image_max_pixels = 0
    c.data.plan_images = 2  # `sweet_jax.plan`: the images of the largest size in every planned row

    c.loss = ml_collections.ConfigDict()
    c.loss.beta = 0.1
    c.loss.nll_coef = 0.0
    c.loss.nll_span = "score"  # score | response | all
    c.loss.reduction = "trajectory_mean"  # trajectory_mean | turn_mean_sum | sum
    c.loss.reference = "cached"  # cached | recompute (every step; with LoRA, in the step with the adapters off)
    # the reward objective's mean of per-token values: over the real tokens ("exclude"), or over the whole padded row
    # ("include", as the official regression-head critic's mean takes in its left padding)
    c.loss.reward_padding = "exclude"
    # SFT: the mean of each example's token-mean NLL ("sequence", the official RFT's), or the mean over all the batch's
    # tokens ("token", HF's causal-LM loss: a long response weighs its length, so a scripted mix of short and long
    # replies keeps its proportions)
    c.loss.sft_mean = "sequence"

    c.optim = ml_collections.ConfigDict()
    c.optim.lr = 2e-7
    c.optim.b1 = 0.9
    c.optim.b2 = 0.95
    c.optim.eps = 1e-8
    c.optim.weight_decay = 0.0
    c.optim.clip = 1.0
    c.optim.warmup_frac = 0.03
    c.optim.min_lr_ratio = 0.1
    c.optim.batch_size = 8
    c.optim.micro_batch_size = 1
    c.optim.freeze = ""  # comma-separated top-level parameters that stay fixed (no gradient, no Adam state): "embed"

    # The device mesh (parallel.sharding): one size may be -1, inferred from the device count. Batches split over
    # data x fsdp, so a micro-batch must have a multiple of that many sequences (a pair is two).
    c.mesh = ml_collections.ConfigDict(dict(data=1, fsdp=-1, tensor=1))
    # Overrides of the logical-axis rules table (parallel.sharding.DEFAULT_RULES), "name=axis,...". With a tensor
    # axis, "act_seq=tensor" also splits the residual stream's sequence over it (Megatron sequence parallelism),
    # dividing the activations kept for the backward pass by the tensor size.
    c.mesh.rules = ""

    c.train = ml_collections.ConfigDict()
    c.train.epochs = 1
    c.train.seed = 42
    c.train.output_dir = "runs/default"
    c.train.log_every = 10
    c.train.eval_every = 0  # micro steps; 0: only at the end
    c.train.checkpoint_every = 500
    c.train.keep_checkpoints = 3
    c.train.eval_batch_size = 8
    c.train.logprob_chunk = 512
    c.train.tensorboard = True
    c.train.export_hf = True
    c.train.export_dtype = "bfloat16"
    return c


def recipe_8b(objective: str) -> ml_collections.ConfigDict:
    """What every Llama-3.1-8B-Instruct recipe of the paper shares (Table 5): lr 2e-7, batch 8 of
    micro-batch 1, bf16 compute over f32 master weights, the official multi-turn mask."""
    c = base_config()
    c.objective = objective
    c.model.hf_path = "checkpoints/Llama-3.1-8B-Instruct"
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
    SYNTHETIC compact data over 4 constants, batch 8, one epoch, f32, a learning rate for a 64-wide model. A few
    minutes on a laptop CPU."""
    c = base_config()
    c.objective = objective
    c.tokenizer_path = TINY_TOKENIZER
    c.model.preset = "tiny"
    c.model.preset_overrides = ml_collections.ConfigDict(dict(TINY_MODEL, tie_word_embeddings=True))
    c.model.init_std = 0.1
    c.data.max_len = 512
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
    c.model.hf_path = "checkpoints/Llama-3.1-70B-Instruct"
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
