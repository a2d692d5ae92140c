"""The training objectives (a job's `objective` setting), each declared once with what it needs and its loss.

| objective | trains on | frozen reference | score head | loss |
|---|---|---|---|---|
| critic | pairs | yes | no | the SWEET critic's Bradley-Terry loss on (critic - reference) reduced log-probs |
| dpo | pairs | yes | no | DPO on (policy - reference), with an optional NLL term (SWEET actor, multi-turn DPO) |
| sft | examples | no | no | token-mean NLL over the score mask (RFT) |
| reward | pairs | no | yes | pairwise -log sigmoid(r_chosen - r_rejected) of the head's mean per-token value |
| value | examples | no | yes | binary cross-entropy of the head's last-token logit against `label` |

- "reward" is the regression-head critic (the backend ablation; the frontend's vision-language critic): the trajectory's
  reward is the mean of its per-token values over its tokens (`loss.reward_padding`="include": over the whole padded
  row, as the official code's mean takes in its left padding).
- "value" is the value-function critic ablation: each turn prefix labelled with its trajectory's success.

A loss takes (params, batch, model config, loss settings, log-prob chunk, dropout key, whether the reference comes
from the step) and returns the per-item loss [P] or [B], the per-item metrics, and per-item weights (None: all alike).
To add an objective: write its loss here and register an `Objective`; the job schema, the trainer and `plan` read
everything else from it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax.numpy as jnp

from sweet_jax import models, objectives
from sweet_jax.training import batch_scores as bs

PAIR_KINDS = ("trajectory_pairs", "ranked_pairs", "text_pairs")  # data kinds that give text pairs
IMAGE_PAIR_KINDS = ("image_pairs",)  # pairs with per-row images
EXAMPLE_KINDS = ("rft", "turn_values")  # data kinds that give single examples


@dataclasses.dataclass(frozen=True)
class Objective:
    name: str
    paired: bool  # trains on (chosen, rejected) pairs; else on single examples
    reference: bool  # scores against a frozen reference (cached, or recomputed)
    score_head: bool  # a scalar score head in place of the LM head
    labelled: bool  # each example carries a target (the batch's `label`)
    data_kinds: tuple[str, ...]  # the `data.kind`s it trains on
    packing: str  # what it may pack (`data.packing`): "pairs" (prefix-shared rows), "examples" (several to a row), ""
    loss: Callable
    summary: str

    @property
    def unit(self) -> str:
        return "pairs" if self.paired else "examples"


def _sft(params, batch, model_cfg, loss_cfg, chunk, reduce, dropout_key, reference_in_step):
    loss, metrics = objectives.sft_loss(bs.gathered_logprobs(params, model_cfg, batch, chunk, dropout_key),
                                        batch["gather_score"])
    w = None
    if "example_mask" in batch:  # rows of several examples: the mean over the examples they hold
        if not reduce:
            raise ValueError("per-example metrics need the plain layout (packed rows hold several examples)")
        w = batch["example_mask"].astype(jnp.float32)
    if reduce and loss_cfg.sft_mean == "token":  # each example weighs its token count: the mean over the tokens
        w = metrics["tokens"] * (1.0 if w is None else w)
    return loss, metrics, w


def _values(params, batch, model_cfg):
    return models.token_values(params, model_cfg, batch["tokens"], bs.model_positions(batch), batch["segment_ids"],
                               images=bs.batch_images(batch))


def _reward(params, batch, model_cfg, loss_cfg, chunk, reduce, dropout_key, reference_in_step):
    values = _values(params, batch, model_cfg)
    reward = objectives.masked_mean(values, (batch["segment_ids"] > 0) | (loss_cfg.reward_padding == "include"))
    p = reward.shape[0] // 2
    return (*objectives.reward_model_loss(reward[:p], reward[p:]), None)


def _value(params, batch, model_cfg, loss_cfg, chunk, reduce, dropout_key, reference_in_step):
    values = _values(params, batch, model_cfg)
    return (*objectives.value_loss(objectives.last_value(values, batch["segment_ids"]), batch["label"]), None)


def _against_reference(pair_loss):
    """The loss of a pair objective on (model - frozen reference) reduced log-probs, with the chosen side's NLL."""
    def loss(params, batch, model_cfg, loss_cfg, chunk, reduce, dropout_key, reference_in_step):
        score, lp = bs.sequence_scores(params, model_cfg, batch, loss_cfg.reduction, chunk, dropout_key=dropout_key)
        p = score.shape[0] // 2
        if lp.ndim == 3:  # packed: example 0 of each row is the chosen one
            nll = -objectives.masked_mean(lp[:, 0], batch["gather_nll"][:, 0])
        else:
            nll = -objectives.masked_mean(lp[:p], batch["gather_nll"][:p])
        ref = (bs.reference_with_adapters_off(params, model_cfg, batch, loss_cfg.reduction, chunk)
               if reference_in_step else bs.plain_order(batch["ref"]))
        return (*pair_loss(score[:p], score[p:], ref[:p], ref[p:], loss_cfg.beta, chosen_nll=nll,
                           nll_coef=loss_cfg.nll_coef), None)
    return loss


REGISTRY: dict[str, Objective] = {o.name: o for o in (
    Objective("critic", paired=True, reference=True, score_head=False, labelled=False, data_kinds=PAIR_KINDS,
              packing="pairs", loss=_against_reference(objectives.bradley_terry_loss),
              summary="the SWEET critic (Bradley-Terry)"),
    Objective("dpo", paired=True, reference=True, score_head=False, labelled=False, data_kinds=PAIR_KINDS,
              packing="pairs", loss=_against_reference(objectives.dpo_loss),
              summary="DPO: the SWEET actor, multi-turn DPO"),
    Objective("sft", paired=False, reference=False, score_head=False, labelled=False, data_kinds=EXAMPLE_KINDS,
              packing="examples", loss=_sft, summary="supervised fine-tuning: RFT"),
    Objective("reward", paired=True, reference=False, score_head=True, labelled=False,
              data_kinds=PAIR_KINDS + IMAGE_PAIR_KINDS, packing="", loss=_reward, summary="a regression-head critic"),
    Objective("value", paired=False, reference=False, score_head=True, labelled=True, data_kinds=("turn_values",),
              packing="", loss=_value, summary="a value-function critic"),
)}
NAMES = tuple(REGISTRY)


def objective(name: str) -> Objective:
    """The registered objective `name`; a ValueError that lists them otherwise."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"objective must be one of {NAMES}, got {name!r}") from None
