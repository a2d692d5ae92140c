"""A job's `model` and `lora` settings, typed (`cli.schema.Section`): which checkpoint or preset a job starts from
and how it runs. `models.model_config` turns them into a model config; a training run's config.json holds them."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import model_validator

from sweet_jax.cli.schema import Section, setting
from sweet_jax.models.model_configs import ATTENTION_IMPLS, DTYPES, LORA_TARGETS, MATMUL_PRECISIONS, REMAT_POLICIES


class ModelSettings(Section):
    where = "model."

    hf_path: str = setting("", "an HF checkpoint directory or a Hub id (owner/name[@revision], downloaded into the "
                               "Hub cache, read from it offline); empty: random init from `preset`")
    preset: str = setting("tiny", "the architecture when hf_path is empty (`models.preset`: tiny, llama3.1-8b, ...)")
    preset_overrides: dict[str, Any] = setting(meaning="config fields changed from the preset's "
                                                       "(hidden_size=64, vocab_size=8192, ...)", factory=dict)
    init_seed: int = setting(0, "the random init's seed (and the fresh adapters')")
    init_std: float = setting(0.02, "the random init's standard deviation")
    param_dtype: Literal[DTYPES] = setting("float32", "the master weights' dtype")
    compute_dtype: Literal[DTYPES] = setting("float32", "the activations' and products' dtype")
    remat_policy: Literal[REMAT_POLICIES] = setting("none", "what each layer keeps for the backward pass")
    attention_impl: Literal[ATTENTION_IMPLS] = setting(
        "auto", "the attention kernel; auto: the best the device runs (`models.kernel_choice`)")
    matmul_precision: Literal[MATMUL_PRECISIONS] = setting(
        "auto", "auto: f32 products as true f32 (an NVIDIA GPU's default is TF32), bf16 as bf16 with f32 "
                "accumulation")


class AdapterSettings(Section):
    where = "lora."

    rank: int = setting(0, "low-rank adapters (`models.lora`) of this rank train on a frozen base; 0: the full model")
    alpha: float = setting(16.0, "the adapters' scale is alpha / rank")
    dropout: float = setting(0.0, "dropout on the adapters' input while training")
    targets: str = setting("q_proj,k_proj,v_proj,o_proj", "the adapted projections, PEFT's names, comma-separated")

    @model_validator(mode="after")
    def _check(self):
        if self.rank < 0:
            raise ValueError(f"lora.rank must be >= 0 (0: no adapters), got {self.rank}")
        if self.rank and not 0 <= self.dropout < 1:
            raise ValueError(f"lora.dropout must be in [0, 1), got {self.dropout}")
        names = [t.strip() for t in self.targets.split(",") if t.strip()]
        if self.rank and (not names or not set(names) <= set(LORA_TARGETS) or len(set(names)) != len(names)):
            raise ValueError(f"lora.targets must be distinct names among {', '.join(LORA_TARGETS)}, got "
                             f"{self.targets!r}")
        return self
