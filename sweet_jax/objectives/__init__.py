"""Log-probs, masks and losses shared by the critic, DPO, RFT and ranking."""

from sweet_jax.objectives.logprobs import next_token_logprobs, token_logprobs

__all__ = ["next_token_logprobs", "token_logprobs"]
