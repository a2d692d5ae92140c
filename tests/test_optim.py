import math

import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from sweet_jax.training.optim import make_optimizer, schedule


def test_schedule_warmup_then_cosine_to_ten_percent():
    lr, total = 2e-7, 1000
    s = schedule(lr, total)
    warm = math.ceil(0.03 * total)  # 30
    assert float(s(0)) == 0.0
    np.testing.assert_allclose(float(s(warm // 2)), lr * (warm // 2) / warm, rtol=1e-6)
    np.testing.assert_allclose(float(s(warm)), lr, rtol=1e-6)
    mid = warm + (total - warm) // 2
    np.testing.assert_allclose(float(s(mid)), lr * (0.1 + 0.9 * 0.5), rtol=1e-3)
    np.testing.assert_allclose(float(s(total)), 0.1 * lr, rtol=1e-6)


def test_accumulation_applies_one_update_per_k_micro_steps():
    cfg = ml_collections.ConfigDict(dict(lr=1e-2, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.0, clip=1.0,
                                         warmup_frac=0.03, min_lr_ratio=0.1))
    tx = make_optimizer(cfg, total_updates=10, accumulation=4)
    params = {"w": jnp.ones(3)}
    state = tx.init(params)
    changes = []
    for _ in range(8):
        updates, state = tx.update({"w": jnp.ones(3)}, state, params)
        params = optax.apply_updates(params, updates)
        changes.append(bool(jnp.any(updates["w"] != 0)))
    # Updates land every 4th micro step; the first is exactly zero because warmup starts at lr 0.
    assert changes == [False] * 7 + [True]
    assert int(state.gradient_step) == 2 and int(state.mini_step) == 0
