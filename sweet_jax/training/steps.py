"""The train step: the loss of a job's objective (`objective_registry`) at the model's matmul precision, reduced
over the batch, its gradient on the trainable params and the optimiser's update. `partitioning.Layout` compiles it
(and the eval and score steps) for a device mesh.

A pair batch holds P chosen examples followed by their P rejected examples; `ref` [2P] carries the cached frozen
reference scores (objectives with a reference only), [P, 2] in a packed pair batch (`batch_scores`). A packed SFT
batch holds R rows of up to K whole examples each: gathers [R, K, S], and `example_mask` [R, K] marks the slots
holding one; its loss is the mean over those examples.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import optax

from sweet_jax import models
from sweet_jax.training import objective_registry
from sweet_jax.training.job_config import LossSettings


def in_step_reference(objective: str, loss_cfg, model_cfg: models.ModelConfig) -> bool:
    """Whether a job computes its reference inside the step (`loss.reference="recompute"` with adapters: the same
    base with them off, `batch_scores.reference_with_adapters_off`), not from a frozen copy or a cached pass."""
    return (objective_registry.objective(objective).reference and LossSettings.of(loss_cfg).reference == "recompute"
            and model_cfg.lora is not None)


def loss_fn(params, batch, *, objective: str, model_cfg: models.ModelConfig, loss_cfg, chunk: int, reduce: bool = True,
            dropout_key=None, reference_in_step: bool = False):
    """Mean loss and mean metrics over the batch (reduce=False: metrics per pair / example, [P] or [B]).
    loss_cfg: the job's `loss` settings (`job_config.LossSettings`, a mapping of some of them, or None: the defaults).
    dropout_key: this step's adapter dropout (training with `model_cfg.lora`). reference_in_step: the critic's and
    DPO's reference scores come from `batch_scores.reference_with_adapters_off`, not from the batch's cached `ref`.
    The products run at the model's matmul precision (`models.ModelConfig.precision`), the log-probs' included."""
    spec = objective_registry.objective(objective)
    if "pixels" in batch and not spec.score_head:
        raise ValueError(f"batches with images train the reward objective only, not {objective!r}")
    with jax.default_matmul_precision(model_cfg.precision):
        loss, metrics, w = spec.loss(params, batch, model_cfg, LossSettings.of(loss_cfg), chunk, reduce, dropout_key,
                                     reference_in_step)
        if w is not None:
            n = jnp.maximum(w.sum(), 1.0)
            return (loss * w).sum() / n, jax.tree.map(lambda v: (v * w).sum() / n, metrics)
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
