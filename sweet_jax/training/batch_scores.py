"""What every objective reads from a training batch: its model inputs, positions and images, and each example's
reduced log-prob score (`sequence_scores`), plain or packed.

A pair batch holds P chosen examples followed by their P rejected examples. A packed pair batch (`data.packing`)
holds P rows [history, chosen, rejected]: its gather arrays are [P, 2, S] (the chosen then the rejected example of
each row), and `branch_ids` and `gather_src` come with it. Scores are reduced per example in place and then put in
the plain order (`plain_order`), so both layouts give the same losses. A batch of a vision-language model may hold
per-row images (`IMAGE_INPUTS`, `training.image_pairs`); its positions are then M-RoPE positions [B, 3, T].
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from sweet_jax import models, objectives
from sweet_jax.models import lora
from sweet_jax.models.qwen2_vl import Images

MODEL_INPUTS = ("tokens", "positions", "segment_ids", "gather_pos", "gather_score", "gather_nll", "gather_turn")
PACKED_INPUTS = ("branch_ids", "gather_src")  # present in packed pair batches only
IMAGE_INPUTS = ("pixels", "patch_positions", "patch_segments")  # per-row images (`models.qwen2_vl.Images`)


def model_inputs(batch: dict) -> dict:
    """The arrays of `batch` that the model and the log-prob gather read (the plain or the packed set)."""
    return {k: batch[k] for k in MODEL_INPUTS + PACKED_INPUTS + IMAGE_INPUTS if k in batch}


def model_positions(batch: dict):
    """The batch's RoPE positions as the model takes them: [B, T], or M-RoPE [3, B, T] from a batch's [B, 3, T]."""
    positions = batch["positions"]
    return jnp.moveaxis(positions, 1, 0) if positions.ndim == 3 else positions


def batch_images(batch: dict):
    """The batch's per-row images (`models.qwen2_vl.Images`), or None."""
    return Images(*(batch[k] for k in IMAGE_INPUTS)) if "pixels" in batch else None


def plain_order(x):
    """A packed batch's per-row, per-example values [P, K, ...] in the plain batch's order [K * P, ...]: every row's
    first example (chosen), then every row's second (rejected). Plain batches' arrays pass through."""
    return x.swapaxes(0, 1).reshape(-1, *x.shape[2:]) if x.ndim >= 2 else x


def gathered_logprobs(params, model_cfg: models.ModelConfig, batch, chunk: int, dropout_key=None):
    """The log-probs of the batch's gathered positions: [B, S], or [P, K, S] for a packed batch."""
    return objectives.gathered_logprobs(params, model_cfg, batch["tokens"], batch["gather_pos"],
                                        gather_src=batch.get("gather_src"), positions=batch["positions"],
                                        segment_ids=batch["segment_ids"], branch_ids=batch.get("branch_ids"),
                                        chunk=chunk, dropout_key=dropout_key)


def sequence_scores(params, model_cfg: models.ModelConfig, batch, reduction: str, chunk: int, max_turns: int = 32,
                    dropout_key=None):
    """(reduced score [B], gathered log-probs [B, S]); a packed batch gives [K * P] scores in the plain order and
    log-probs [P, K, S]."""
    lp = gathered_logprobs(params, model_cfg, batch, chunk, dropout_key)
    score = objectives.reduce_logprobs(lp, batch["gather_score"], reduction, batch["gather_turn"], max_turns)
    return (plain_order(score) if lp.ndim == 3 else score), lp


def reference_with_adapters_off(params, model_cfg: models.ModelConfig, batch, reduction: str, chunk: int):
    """The frozen reference's scores [2P] in the plain order, computed in the step: the same base weights with the
    adapters off (`lora.base_of`), no gradient. No second copy of the model exists."""
    if "lora" not in params:
        raise ValueError("a reference computed in the step needs adapters (lora.rank > 0): without them the "
                         "reference is a second copy of the model")
    return jax.lax.stop_gradient(sequence_scores(lora.base_of(params), model_cfg, batch, reduction, chunk)[0])
