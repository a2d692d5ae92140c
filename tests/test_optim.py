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


def _tiny_step_inputs():
    import jax

    from sweet_jax import models
    cfg = models.LlamaConfig.preset("tiny", vocab_size=64, hidden_size=16, intermediate_size=32, num_layers=1,
                                    num_heads=2, num_kv_heads=1, tie_word_embeddings=True)
    params = models.init_params(cfg, jax.random.key(0), std=0.1)
    tokens = np.asarray(jax.random.randint(jax.random.key(1), (2, 8), 0, 64), np.int32)
    batch = {"tokens": tokens, "positions": np.tile(np.arange(8, dtype=np.int32), (2, 1)),
             "segment_ids": np.ones((2, 8), np.int32), "gather_pos": np.tile(np.arange(1, 8, dtype=np.int32), (2, 1)),
             "gather_score": np.ones((2, 7), bool), "gather_nll": np.ones((2, 7), bool),
             "gather_turn": np.zeros((2, 7), np.int32)}
    return cfg, params, batch


def test_freeze_keeps_named_params_fixed_and_out_of_the_optimiser():
    import jax
    import pytest

    from sweet_jax.training import steps
    cfg, params, batch = _tiny_step_inputs()
    tx = optax.adam(1e-2)
    for freeze in ((), ("embed",)):
        trainable = steps.split_params(params, freeze)[0]
        step = steps.make_train_step(tx, freeze, objective="sft", model_cfg=cfg, loss_cfg=None, chunk=4)
        state = {"params": jax.tree.map(jnp.copy, params), "opt_state": tx.init(trainable),
                 "step": jnp.zeros((), jnp.int32)}
        state, _ = step(state, batch)
        embed_moved = not np.array_equal(np.asarray(state["params"]["embed"]), np.asarray(params["embed"]))
        assert embed_moved == (freeze == ())
        assert not np.array_equal(np.asarray(state["params"]["layers"]["wq"]), np.asarray(params["layers"]["wq"]))
        shapes = {tuple(x.shape) for x in jax.tree.leaves(state["opt_state"])}
        assert ((64, 16) in shapes) == (freeze == ())
    with pytest.raises(ValueError, match="lm_head"):
        steps.split_params(params, ("lm_head",))
