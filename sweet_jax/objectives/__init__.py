"""Log-probs, reductions and losses shared by the critic, DPO, RFT and ranking. All pure and jit-able."""

from sweet_jax.objectives.logprobs import DEFAULT_CHUNK, gathered_logprobs, logprobs_from_hidden, token_logprobs
from sweet_jax.objectives.losses import bradley_terry_loss, dpo_loss, reward_model_loss, sft_loss, value_loss
from sweet_jax.objectives.reductions import REDUCTIONS, last_value, masked_mean, reduce_logprobs

__all__ = [
    "DEFAULT_CHUNK", "REDUCTIONS", "bradley_terry_loss", "dpo_loss", "gathered_logprobs", "last_value",
    "logprobs_from_hidden", "masked_mean", "reduce_logprobs", "reward_model_loss", "sft_loss", "token_logprobs",
    "value_loss",
]
