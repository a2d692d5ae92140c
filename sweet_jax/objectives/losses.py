"""Pure preference and likelihood losses. Each returns (per-example loss [B], metrics dict of [B] arrays).

All inputs are per-sequence scores [B] (reduced log-probs, see `reductions`). Batch-mean the outputs in the trainer.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _pairwise(chosen_reward, rejected_reward, chosen_nll, nll_coef):
    margin = chosen_reward - rejected_reward
    pref = -jax.nn.log_sigmoid(margin)
    loss = pref if chosen_nll is None or nll_coef == 0 else pref + nll_coef * chosen_nll
    metrics = {
        "loss": loss,
        "preference_loss": pref,
        "accuracy": (chosen_reward > rejected_reward).astype(jnp.float32),
        "chosen_reward": chosen_reward,
        "rejected_reward": rejected_reward,
        "margin": margin,
    }
    if chosen_nll is not None:
        metrics["chosen_nll"] = chosen_nll
    return loss, metrics


def dpo_loss(pi_chosen, pi_rejected, ref_chosen, ref_rejected, beta: float = 0.1, *, chosen_nll=None,
             nll_coef: float = 0.0):
    """DPO: -log sigmoid(beta * [(pi_c - ref_c) - (pi_r - ref_r)]) + nll_coef * chosen_nll.

    Rewards are beta * (pi - ref). chosen_nll [B] is the chosen sequence's token-mean NLL over whatever span the
    caller chose (response only, or the whole sequence as the official policy DPO does).
    """
    return _pairwise(beta * (pi_chosen - ref_chosen), beta * (pi_rejected - ref_rejected), chosen_nll, nll_coef)


def bradley_terry_loss(critic_chosen, critic_rejected, ref_chosen, ref_rejected, beta: float = 0.1, *,
                       chosen_nll=None, nll_coef: float = 0.0):
    """The SWEET critic's trajectory-level Bradley-Terry loss.

    The critic's trajectory reward is beta * (critic - ref), its reduced log-prob ratio against the frozen
    initial critic on the same (information-prefixed) text; the loss is -log sigmoid(r_chosen - r_rejected).
    """
    return _pairwise(beta * (critic_chosen - ref_chosen), beta * (critic_rejected - ref_rejected), chosen_nll,
                     nll_coef)


def reward_model_loss(chosen_score, rejected_score):
    """Pairwise loss for a scalar-head reward model (the regression-head critic ablation)."""
    return _pairwise(chosen_score, rejected_score, None, 0.0)


def value_loss(logits, labels):
    """Binary cross-entropy of a success classifier (the value-function critic ablation): logits [B] of P(success),
    labels [B] in [0, 1]. -> ([B], metrics)."""
    y = labels.astype(jnp.float32)
    loss = -(y * jax.nn.log_sigmoid(logits) + (1.0 - y) * jax.nn.log_sigmoid(-logits))
    return loss, {"loss": loss, "accuracy": ((logits > 0) == (y > 0.5)).astype(jnp.float32),
                  "prediction": jax.nn.sigmoid(logits), "label": y}


def sft_loss(logp, mask):
    """Token-mean NLL per sequence over `mask` (RFT with the multi-turn assistant mask). -> ([B], metrics)."""
    m = mask.astype(jnp.float32)
    n = jnp.maximum(m.sum(-1), 1.0)
    loss = -(logp * m).sum(-1) / n
    return loss, {"loss": loss, "tokens": m.sum(-1)}
