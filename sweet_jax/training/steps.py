"""The pieces of training: the loss for each objective, the sequence scorer, the train step. `partitioning.Layout`
compiles them (and the eval and score steps) for a device mesh.

Objectives (config `objective`):
- "critic": the SWEET critic's Bradley-Terry loss on (critic - frozen reference) reduced log-probs of chosen vs
  rejected trajectories (the information prefix is in the text).
- "dpo":    DPO on (policy - frozen reference) with an optional NLL term (SWEET actor, multi-turn DPO).
- "sft":    token-mean NLL over the score mask (rejection fine-tuning).
- "reward": the regression-head critic (the backend ablation; the frontend's vision-language critic): a scalar head
            on the last hidden state (`ModelConfig.score_head`), the trajectory's reward the mean of its per-token
            values over its tokens (`loss.reward_padding`="include": over the whole padded row, as the official
            code's mean takes in its left padding), pairwise -log sigmoid(r_chosen - r_rejected).
- "value":  the value-function critic ablation: the same head read at the last token as the logit of P(success),
            binary cross-entropy against `label` (each turn prefix labelled with its trajectory's success).

A batch of a vision-language model may hold per-row images (`IMAGE_INPUTS`, `training.image_pairs`); its positions are
then M-RoPE positions [B, 3, T].

A pair batch holds P chosen examples followed by their P rejected examples; `ref` [2P] carries the cached frozen
reference scores (critic and dpo only). A packed pair batch (`data.packing`) holds P rows [history, chosen, rejected]:
its gather arrays are [P, 2, S] (the chosen then the rejected example of each row), `branch_ids` and `gather_src`
come with it, and `ref` is [P, 2]. The objectives reduce each example in place and then see the scores in the plain
order, so both layouts give the same losses. A packed SFT batch holds R rows of up to K whole examples each:
gathers [R, K, S], and `example_mask` [R, K] marks the slots holding one; its loss is the mean over those examples.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import optax

from sweet_jax import models, objectives
from sweet_jax.models import lora
from sweet_jax.models.loading import SCORE_HEAD_OBJECTIVES
from sweet_jax.models.qwen2_vl import Images

OBJECTIVES = ("critic", "dpo", "sft", "reward", "value")
PAIRED = ("critic", "dpo", "reward")  # objectives trained on (chosen, rejected) pairs
WITH_REFERENCE = ("critic", "dpo")  # objectives that score against a frozen reference
SCORE_HEAD = SCORE_HEAD_OBJECTIVES  # objectives of a model with a scalar score head instead of the LM head
MODEL_INPUTS = ("tokens", "positions", "segment_ids", "gather_pos", "gather_score", "gather_nll", "gather_turn")
PACKED_INPUTS = ("branch_ids", "gather_src")  # present in packed pair batches only
IMAGE_INPUTS = ("pixels", "patch_positions", "patch_segments")  # per-row images (`models.qwen2_vl.Images`)
REWARD_PADDING = ("exclude", "include")
SFT_MEANS = ("sequence", "token")


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


def _gathered_logprobs(params, model_cfg: models.ModelConfig, batch, chunk: int, dropout_key=None):
    return objectives.gathered_logprobs(params, model_cfg, batch["tokens"], batch["gather_pos"],
                                        gather_src=batch.get("gather_src"), positions=batch["positions"],
                                        segment_ids=batch["segment_ids"], branch_ids=batch.get("branch_ids"),
                                        chunk=chunk, dropout_key=dropout_key)


def sequence_scores(params, model_cfg: models.ModelConfig, batch, reduction: str, chunk: int, max_turns: int = 32,
                    dropout_key=None):
    """(reduced score [B], gathered log-probs [B, S]); a packed batch gives [K * P] scores in the plain order and
    log-probs [P, K, S]."""
    lp = _gathered_logprobs(params, model_cfg, batch, chunk, dropout_key)
    score = objectives.reduce_logprobs(lp, batch["gather_score"], reduction, batch["gather_turn"], max_turns)
    return (plain_order(score) if lp.ndim == 3 else score), lp


def reference_with_adapters_off(params, model_cfg: models.ModelConfig, batch, reduction: str, chunk: int):
    """The frozen reference's scores [2P] in the plain order, computed in the step: the same base weights with the
    adapters off (`lora.base_of`), no gradient. No second copy of the model exists."""
    if "lora" not in params:
        raise ValueError("a reference computed in the step needs adapters (lora.rank > 0): without them the "
                         "reference is a second copy of the model")
    return jax.lax.stop_gradient(sequence_scores(lora.base_of(params), model_cfg, batch, reduction, chunk)[0])


def in_step_reference(objective: str, loss_cfg, model_cfg: models.ModelConfig) -> bool:
    """Whether a job computes its reference inside the step (`loss.reference="recompute"` with adapters: the same
    base with them off, `reference_with_adapters_off`), not from a frozen copy or a cached pass."""
    return objective in WITH_REFERENCE and loss_cfg.reference == "recompute" and model_cfg.lora is not None


def loss_fn(params, batch, *, objective: str, model_cfg: models.ModelConfig, loss_cfg, chunk: int, reduce: bool = True,
            dropout_key=None, reference_in_step: bool = False):
    """Mean loss and mean metrics over the batch (reduce=False: metrics per pair / example, [P] or [B]).
    dropout_key: this step's adapter dropout (training with `model_cfg.lora`). reference_in_step: the critic's and
    DPO's reference scores come from `reference_with_adapters_off`, not from the batch's cached `ref`. The products
    run at the model's matmul precision (`models.ModelConfig.precision`), the log-probs' included."""
    with jax.default_matmul_precision(model_cfg.precision):
        return _loss(params, batch, objective=objective, model_cfg=model_cfg, loss_cfg=loss_cfg, chunk=chunk,
                     reduce=reduce, dropout_key=dropout_key, reference_in_step=reference_in_step)


def _loss(params, batch, *, objective: str, model_cfg: models.ModelConfig, loss_cfg, chunk: int, reduce: bool,
          dropout_key, reference_in_step: bool):
    if "pixels" in batch and objective not in SCORE_HEAD:
        raise ValueError(f"batches with images train the reward objective only, not {objective!r}")
    if objective == "sft":
        loss, metrics = objectives.sft_loss(_gathered_logprobs(params, model_cfg, batch, chunk, dropout_key),
                                            batch["gather_score"])
        sft_mean = (loss_cfg or {}).get("sft_mean", "sequence")
        if sft_mean not in SFT_MEANS:
            raise ValueError(f"loss.sft_mean must be one of {SFT_MEANS}, got {sft_mean!r}")
        w = None
        if "example_mask" in batch:  # rows of several examples: the mean over the examples they hold
            if not reduce:
                raise ValueError("per-example metrics need the plain layout (packed rows hold several examples)")
            w = batch["example_mask"].astype(jnp.float32)
        if reduce and sft_mean == "token":  # each example weighs its token count: the mean over the batch's tokens
            w = metrics["tokens"] * (1.0 if w is None else w)
        if w is not None:
            n = jnp.maximum(w.sum(), 1.0)
            return (loss * w).sum() / n, jax.tree.map(lambda v: (v * w).sum() / n, metrics)
    elif objective in SCORE_HEAD:
        values = models.token_values(params, model_cfg, batch["tokens"], model_positions(batch), batch["segment_ids"],
                                     images=batch_images(batch))
        if objective == "value":
            loss, metrics = objectives.value_loss(objectives.last_value(values, batch["segment_ids"]), batch["label"])
        else:
            padding = loss_cfg.get("reward_padding", "exclude")
            if padding not in REWARD_PADDING:
                raise ValueError(f"loss.reward_padding must be one of {REWARD_PADDING}, got {padding!r}")
            reward = objectives.masked_mean(values, (batch["segment_ids"] > 0) | (padding == "include"))
            p = reward.shape[0] // 2
            loss, metrics = objectives.reward_model_loss(reward[:p], reward[p:])
    else:
        score, lp = sequence_scores(params, model_cfg, batch, loss_cfg.reduction, chunk, dropout_key=dropout_key)
        p = score.shape[0] // 2
        if lp.ndim == 3:  # packed: example 0 of each row is the chosen one
            nll = -objectives.masked_mean(lp[:, 0], batch["gather_nll"][:, 0])
        else:
            nll = -objectives.masked_mean(lp[:p], batch["gather_nll"][:p])
        ref = (reference_with_adapters_off(params, model_cfg, batch, loss_cfg.reduction, chunk) if reference_in_step
               else plain_order(batch["ref"]))
        fn = objectives.bradley_terry_loss if objective == "critic" else objectives.dpo_loss
        loss, metrics = fn(score[:p], score[p:], ref[:p], ref[p:], loss_cfg.beta, chosen_nll=nll,
                           nll_coef=loss_cfg.nll_coef)
    if not reduce:
        return loss.mean(), jax.tree.map(lambda v: jnp.broadcast_to(v, loss.shape), metrics)
    return loss.mean(), jax.tree.map(jnp.mean, metrics)


def split_params(params: dict, freeze: tuple[str, ...] = ()) -> tuple[dict, dict]:
    """(trainable, frozen): the top-level entries named in `freeze` (e.g. "embed", which with tied embeddings is the
    LM head too) get no gradient and no optimiser state."""
    unknown = sorted(set(freeze) - set(params))
    if unknown:
        raise ValueError(f"optim.freeze names {unknown}, but the parameters are {sorted(params)}")
    return ({k: v for k, v in params.items() if k not in freeze}, {k: v for k, v in params.items() if k in freeze})


def frozen_names(freeze: str, model_cfg: models.ModelConfig) -> tuple[str, ...]:
    """The top-level params that get no gradient: those `optim.freeze` names (comma-separated), and with adapters
    (`model_cfg.lora`) every one but the adapters."""
    names = {name for name in freeze.split(",") if name}
    if model_cfg.lora is not None:
        names |= set(models.param_shapes(model_cfg)) - {"lora"}
    return tuple(sorted(names))


def make_train_step(tx: optax.GradientTransformation, freeze: tuple[str, ...] = (), *, jit: bool = True,
                    dropout_seed: int | None = None, **loss_kw):
    """state {params, opt_state (of the trainable part, see `split_params`), step} -> (state, metrics), jitted with
    the state donated (jit=False: the plain function, for `partitioning.Layout` to compile for a mesh). With
    `dropout_seed`, adapter dropout (`model_cfg.lora.dropout` > 0; otherwise the key goes unused) draws its masks
    from (seed, step): a resumed run draws the same ones."""
    loss = functools.partial(loss_fn, **loss_kw)
    grad_fn = jax.value_and_grad(lambda trainable, frozen, batch, key: loss({**trainable, **frozen}, batch,
                                                                            dropout_key=key), has_aux=True)

    def train_step(state, batch):
        trainable, frozen = split_params(state["params"], freeze)
        key = None if dropout_seed is None else jax.random.fold_in(jax.random.key(dropout_seed), state["step"])
        (_, metrics), grads = grad_fn(trainable, frozen, batch, key)
        updates, opt_state = tx.update(grads, state["opt_state"], trainable)
        params = {**frozen, **optax.apply_updates(trainable, updates)}
        metrics["grad_norm"] = optax.global_norm(grads)
        return {"params": params, "opt_state": opt_state, "step": state["step"] + 1}, metrics

    return jax.jit(train_step, donate_argnums=(0,)) if jit else train_step
