"""The typed schema of a training job (`python -m sweet_jax.train`, `plan`): every setting, its default and its
meaning, and the rules between them, checked when the config loads (`JobConfig.load`), before any data is read or any
device touched. Config files start from `JobConfig().to_config_dict()` (`training.defaults.base_config`).

The defaults are the official recipe's where it has one: AdamW (0.9, 0.95), weight decay 0, clip 1.0, 3% warmup,
cosine to 10% of lr, seed 42, the first 3% held out. The settings reference in docs/settings.md is generated from
this module (`python -m sweet_jax.config docs`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import model_validator

from sweet_jax.cli.schema import Section, section, setting
from sweet_jax.models.model_configs import DTYPES
from sweet_jax.models.settings import AdapterSettings, ModelSettings
from sweet_jax.parallel import sharding
from sweet_jax.training.objective_registry import EXAMPLE_KINDS, NAMES, objective
from sweet_jax.training.splits import KINDS as DATA_KINDS


class SyntheticDataSettings(Section):
    num_tasks: int = setting(400, "SYNTHETIC trajectories' tasks (when data.path is empty)")
    rollouts: int = setting(3, "trajectories per task")
    p_correct: float = setting(0.5, "the chance a trajectory's answer is right")
    seed: int = setting(0, "the generator's seed")
    num_constants: int = setting(20, "the constants a task's answer draws from")
    compact: bool = setting(False, "short dialogues (the toy-scale jobs)")


class DataSettings(Section):
    kind: Literal[DATA_KINDS] = setting(
        "trajectory_pairs", "the data's form; text_pairs: an official pair file ({\"chosen\": {\"input\", \"output\"}, "
                            "\"rejected\": ...} per line, any information prefix already in the inputs)")
    path: str = setting("", "jsonl / parquet / Hub dataset name; empty: SYNTHETIC data generated on first use")
    synthetic: SyntheticDataSettings = section(SyntheticDataSettings, "the SYNTHETIC data made when path is empty")
    with_info: bool = setting(False, "prefix the training-time information (the critic)")
    info_key: str = setting("ground_truth", "the task field holding the training-time information")
    mask_style: Literal["content", "official"] = setting(
        "content", "content | official (also the \"\\n\\n\" after each assistant header)")
    score_span: Literal["assistant", "response", "all"] = setting("assistant", "the tokens an example is scored on")
    max_len: int = setting(8192, "the longest example in tokens (longer ones keep their final turn)")
    min_bucket: int = setting(128, "the shortest length bucket")
    shapes: Literal["batch", "split", "job"] = setting(
        "batch", "batch: each batch padded to the length buckets of its own longest row and gather; split: every "
                 "batch of a split to those of the split's longest (one compiled step per split, what short jobs "
                 "that mostly compile want); job: every batch to those of the longest of the training and held-out "
                 "splits (the reference scores of both one program: the tiny recipes); rows of several packed SFT "
                 "examples keep their own")
    eval_fraction: float = setting(0.03, "the share of tasks held out")
    on_error: Literal["raise", "skip"] = setting("raise", "a bad record stops the job, or is skipped and counted")
    min_best_reward: float = setting(1.0, "the reward a trajectory needs to count as a success")
    num_pairs: int = setting(4, "ranked pairs per state")
    pack_pairs: bool = setting(True, "a pair as one row [common history, chosen, rejected] when that saves "
                                     "pack_min_saving of its tokens")
    pack_examples: bool = setting(True, "several SFT examples to a row when that saves pack_min_saving of the "
                                        "padded tokens")
    pack_length: int = setting(0, "packed example rows' length; 0: the batch's longest example")
    pack_min_saving: float = setting(0.1, "the share of tokens packing must save")
    seed: int = setting(42, "the held-out split's and the ranked pairs' seed")
    image_min_pixels: int = setting(0, "image pairs' images are resized to at least this many pixels; 0: the "
                                       "model's preprocessor_config.json, else Qwen2-VL's default")
    image_max_pixels: int = setting(0, "and to at most this many; 0: as above")
    plan_images: int = setting(2, "`sweet_jax.plan`: the images of the largest size in every planned row")


class LossSettings(Section):
    where = "loss."

    beta: float = setting(0.1, "the Bradley-Terry / DPO temperature")
    nll_coef: float = setting(0.0, "the weight of the chosen side's NLL (DPO)")
    nll_span: Literal["score", "response", "all"] = setting("score", "the tokens of that NLL")
    reduction: Literal["trajectory_mean", "turn_mean_sum", "sum"] = setting(
        "trajectory_mean", "how per-token log-probs become a sequence's score")
    reference: Literal["cached", "recompute"] = setting(
        "cached", "the frozen reference's scores: computed once and cached, or in every step (with LoRA, the base "
                  "with the adapters off)")
    reward_padding: Literal["exclude", "include"] = setting(
        "exclude", "the reward objective's mean over the real tokens, or over the padded row (the official "
                   "regression-head critic's)")
    sft_mean: Literal["sequence", "token"] = setting(
        "sequence", "SFT: the mean of each example's token-mean NLL (the official RFT's), or over all the batch's "
                    "tokens (HF's causal-LM loss)")


class OptimSettings(Section):
    lr: float = setting(2e-7, "the peak learning rate")
    b1: float = setting(0.9, "Adam's beta1")
    b2: float = setting(0.95, "Adam's beta2")
    eps: float = setting(1e-8, "Adam's epsilon")
    weight_decay: float = setting(0.0, "AdamW's weight decay")
    clip: float = setting(1.0, "the global gradient-norm clip")
    warmup_frac: float = setting(0.03, "the linear warm-up's share of the updates")
    min_lr_ratio: float = setting(0.1, "the cosine schedule's end, as a share of lr")
    batch_size: int = setting(8, "items (pairs or examples) per update")
    micro_batch_size: int = setting(1, "items per forward/backward pass; the update accumulates batch_size / it")
    freeze: str = setting("", "comma-separated top-level parameters that stay fixed (no gradient, no Adam state)")


class MeshSettings(Section):
    data: int = setting(1, "the data-parallel axis' size (-1: what the devices leave)")
    fsdp: int = setting(-1, "the fully-sharded axis' size (-1: what the devices leave)")
    tensor: int = setting(1, "the tensor-parallel axis' size (-1: what the devices leave)")
    rules: str = setting("", "logical-axis rule overrides, \"name=axis,...\" (\"act_seq=tensor\": sequence "
                             "parallelism)")

    @model_validator(mode="after")
    def _check(self):
        sizes = {axis: getattr(self, axis) for axis in sharding.MESH_AXES}
        if any(v < 1 and v != -1 for v in sizes.values()) or list(sizes.values()).count(-1) > 1:
            raise ValueError(f"mesh sizes must be >= 1, one of them may be -1 (inferred), got {sizes}")
        sharding.parse_rules(self.rules)
        return self


class TrainSettings(Section):
    epochs: int = setting(1, "passes over the training items")
    seed: int = setting(42, "the batch order's and the adapters' dropout seed")
    output_dir: str = setting("runs/default", "the run directory: checkpoints, logs, metrics, the export")
    log_every: int = setting(10, "micro steps between logged training metrics")
    eval_every: int = setting(0, "micro steps between held-out evaluations; 0: only at the end")
    checkpoint_every: int = setting(500, "micro steps between checkpoints")
    keep_checkpoints: int = setting(3, "the checkpoints kept")
    eval_batch_size: int = setting(8, "items per held-out and reference batch")
    logprob_chunk: int = setting(512, "tokens per chunk of the log-prob projection (never the whole [B, T, V])")
    tensorboard: bool = setting(True, "TensorBoard scalars under tb/")
    export_hf: bool = setting(True, "export the final params as an HF checkpoint under hf/")
    export_dtype: Literal[("",) + DTYPES] = setting("bfloat16", "the export's dtype; empty: the params' own")

    @model_validator(mode="after")
    def _check(self):
        for name in ("log_every", "checkpoint_every", "keep_checkpoints", "eval_batch_size", "logprob_chunk"):
            if getattr(self, name) < 1:
                raise ValueError(f"train.{name} must be >= 1, got {getattr(self, name)}")
        return self


class JobConfig(Section):
    objective: Literal[NAMES] = setting("critic", "what the job trains (`training.objective_registry`)")
    tokenizer_path: str = setting("", "an HF tokenizer directory or bundled:NAME; empty: the model's own, else the "
                                      "bundled tokenizer of its chat format")
    model: ModelSettings = section(ModelSettings, "the model a job starts from, and how it runs")
    lora: AdapterSettings = section(AdapterSettings, "low-rank adapters on a frozen base")
    data: DataSettings = section(DataSettings, "the training data")
    loss: LossSettings = section(LossSettings, "the objective's loss")
    optim: OptimSettings = section(OptimSettings, "the optimiser and its schedule")
    mesh: MeshSettings = section(MeshSettings, "the device mesh (`parallel.sharding`)")
    train: TrainSettings = section(TrainSettings, "the loop, checkpoints and the export")

    @model_validator(mode="after")
    def _check(self):
        spec = objective(self.objective)
        if self.data.kind not in spec.data_kinds:
            other = "single examples" if self.data.kind in EXAMPLE_KINDS else "pairs"
            raise ValueError(f"objective {spec.name!r} trains on {spec.unit} of data.kind "
                             f"{' or '.join(map(repr, spec.data_kinds))}, but data.kind={self.data.kind!r} gives "
                             f"{other}")
        micro, batch = self.optim.micro_batch_size, self.optim.batch_size
        if micro < 1 or batch < 1 or batch % micro:
            raise ValueError(f"optim.batch_size={batch} must be a multiple of optim.micro_batch_size={micro} "
                             f"(both >= 1)")
        if self.lora.rank and spec.score_head:
            raise ValueError(f"LoRA (lora.rank={self.lora.rank}) trains the log-prob objectives; objective "
                             f"{spec.name!r} trains a new score head: set lora.rank=0")
        if spec.packing == "examples" and self.data.pack_examples and self.data.pack_length > self.data.max_len:
            raise ValueError(f"data.pack_length={self.data.pack_length} is over data.max_len={self.data.max_len}: "
                             f"packed rows are at most max_len tokens (raise data.max_len, which also lets longer "
                             f"examples in)")
        return self

    @property
    def spec(self):
        """The objective's registry entry (`objective_registry.Objective`)."""
        return objective(self.objective)
