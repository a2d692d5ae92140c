"""Reduce per-token log-probs [B, T] under a mask to one score per sequence [B].

- "trajectory_mean": one mean over all masked tokens of the sequence (the official SWEET-RL code, `--mean_log_prob`).
- "turn_mean_sum":   the mean over each assistant turn's masked tokens, summed over turns (the paper's Eq. 2/3).
- "sum":             the plain sum (the "without normalisation" ablation; the policy DPO score).
"""

from __future__ import annotations

import jax.numpy as jnp

REDUCTIONS = ("trajectory_mean", "turn_mean_sum", "sum")


def reduce_logprobs(logp: jnp.ndarray, mask: jnp.ndarray, kind: str, turn_ids: jnp.ndarray | None = None,
                    max_turns: int = 32) -> jnp.ndarray:
    """logp, mask [..., T]; turn_ids int [..., T] (assistant-turn index, -1 elsewhere) for "turn_mean_sum" -> [...] f32.

    A sequence with no masked tokens scores 0. Turns numbered >= max_turns raise no error but are ignored, so pick
    max_turns above the data's turn count (ColBench has at most 10 agent turns).
    """
    m = mask.astype(jnp.float32)
    lp = logp.astype(jnp.float32) * m
    if kind == "sum":
        return lp.sum(-1)
    if kind == "trajectory_mean":
        return lp.sum(-1) / jnp.maximum(m.sum(-1), 1.0)
    if kind == "turn_mean_sum":
        if turn_ids is None:
            raise ValueError("reduction 'turn_mean_sum' needs turn_ids")
        onehot = (turn_ids[..., None] == jnp.arange(max_turns)).astype(jnp.float32) * m[..., None]  # [..., T, K]
        sums = jnp.einsum("...t,...tk->...k", lp, onehot)
        counts = onehot.sum(-2)
        return jnp.where(counts > 0, sums / jnp.maximum(counts, 1.0), 0.0).sum(-1)
    raise ValueError(f"unknown reduction {kind!r}; expected one of {REDUCTIONS}")


def last_value(x: jnp.ndarray, segment_ids: jnp.ndarray) -> jnp.ndarray:
    """x [B, T] at each row's last real token (segment_ids > 0; rows right-padded) -> [B]: the pooling of HF's
    `*ForSequenceClassification` models."""
    last = jnp.maximum((segment_ids > 0).sum(-1) - 1, 0)
    return jnp.take_along_axis(x, last[:, None], axis=1)[:, 0]


def masked_mean(x: jnp.ndarray, mask: jnp.ndarray) -> jnp.ndarray:
    """Mean of x [B, T] over mask, per row -> [B] (0 for an empty mask)."""
    return reduce_logprobs(x, mask, "trajectory_mean")
