"""The optimiser of the official recipe: AdamW (0.9, 0.95), weight decay 0, global-norm clip 1.0, linear warmup over
ceil(3%) of the updates, then cosine decay to 10% of the peak learning rate; gradient accumulation via MultiSteps."""

from __future__ import annotations

import math

import optax


def schedule(lr: float, total_updates: int, warmup_frac: float = 0.03, min_lr_ratio: float = 0.1) -> optax.Schedule:
    warmup = max(1, math.ceil(warmup_frac * total_updates))
    decay = max(1, total_updates - warmup)
    return optax.join_schedules(
        [optax.linear_schedule(0.0, lr, warmup),
         optax.cosine_decay_schedule(lr, decay, alpha=min_lr_ratio)],
        boundaries=[warmup])


def make_optimizer(cfg, total_updates: int, accumulation: int) -> optax.GradientTransformation:
    """cfg: the `optim` section (lr, b1, b2, weight_decay, clip, warmup_frac, min_lr_ratio)."""
    tx = optax.chain(
        optax.clip_by_global_norm(cfg.clip),
        optax.adamw(schedule(cfg.lr, total_updates, cfg.warmup_frac, cfg.min_lr_ratio), b1=cfg.b1, b2=cfg.b2,
                    eps=cfg.eps, weight_decay=cfg.weight_decay),
    )
    return optax.MultiSteps(tx, every_k_schedule=accumulation) if accumulation > 1 else tx
