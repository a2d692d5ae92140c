"""Losses and reductions against independent NumPy implementations, closed forms, and finite differences."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sweet_jax import models, objectives

RNG = np.random.RandomState(0)


def np_log_sigmoid(x):
    x = np.asarray(x, np.float64)
    return -np.logaddexp(0.0, -x)


def np_reduce(logp, mask, kind, turn_ids=None):
    out = []
    for b in range(logp.shape[0]):
        sel = mask[b] > 0
        if kind == "sum":
            out.append(logp[b][sel].sum())
        elif kind == "trajectory_mean":
            out.append(logp[b][sel].mean() if sel.any() else 0.0)
        else:
            total = 0.0
            for k in sorted(set(turn_ids[b][sel].tolist())):
                total += logp[b][sel & (turn_ids[b] == k)].mean()
            out.append(total)
    return np.array(out)


@pytest.mark.parametrize("kind", ["sum", "trajectory_mean", "turn_mean_sum"])
def test_reductions_match_numpy(kind):
    b, t = 5, 40
    logp = RNG.randn(b, t)
    turn_ids = np.full((b, t), -1)
    mask = np.zeros((b, t))
    for i in range(b):
        start = 3
        for k in range(i % 4 + 1):  # 1..4 assistant turns of varying lengths
            n = RNG.randint(1, 6)
            turn_ids[i, start:start + n] = k
            mask[i, start:start + n] = 1
            start += n + RNG.randint(1, 4)
    out = objectives.reduce_logprobs(jnp.asarray(logp, jnp.float32), jnp.asarray(mask), kind, jnp.asarray(turn_ids))
    np.testing.assert_allclose(out, np_reduce(logp, mask, kind, turn_ids), rtol=1e-6, atol=1e-6)


def test_turn_mean_sum_differs_from_trajectory_mean_by_construction():
    logp = jnp.array([[-1.0, -1.0, -1.0, -4.0]])
    mask = jnp.ones((1, 4))
    turns = jnp.array([[0, 0, 0, 1]])
    assert float(objectives.reduce_logprobs(logp, mask, "trajectory_mean")[0]) == pytest.approx(-7 / 4)
    assert float(objectives.reduce_logprobs(logp, mask, "turn_mean_sum", turns)[0]) == pytest.approx(-1 - 4)
    with pytest.raises(ValueError, match="needs turn_ids"):
        objectives.reduce_logprobs(logp, mask, "turn_mean_sum")


@pytest.mark.parametrize("beta, coef", [(0.1, 0.0), (0.5, 0.01), (2.0, 1.0)])
def test_dpo_and_bradley_terry_match_numpy(beta, coef):
    pc, pr, rc, rr = (RNG.randn(16) * 3 for _ in range(4))
    nll = np.abs(RNG.randn(16))
    logits = beta * ((pc - rc) - (pr - rr))
    expected = -np_log_sigmoid(logits) + coef * nll
    for fn in (objectives.dpo_loss, objectives.bradley_terry_loss):
        loss, m = fn(*(jnp.asarray(x, jnp.float32) for x in (pc, pr, rc, rr)), beta,
                     chosen_nll=jnp.asarray(nll, jnp.float32), nll_coef=coef)
        np.testing.assert_allclose(loss, expected, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(m["chosen_reward"], beta * (pc - rc), rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(m["rejected_reward"], beta * (pr - rr), rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(m["margin"], logits, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(m["accuracy"], (logits > 0).astype(np.float32))


def test_closed_forms():
    z = jnp.zeros(3)
    loss, m = objectives.dpo_loss(z + 1.5, z + 1.5, z - 2.0, z - 2.0, 0.1)
    np.testing.assert_allclose(loss, math.log(2), rtol=1e-7)  # equal log-probs -> log 2
    assert float(m["accuracy"].sum()) == 0  # a tie is not a win
    loss, _ = objectives.bradley_terry_loss(z, z, z, z, 0.1)
    np.testing.assert_allclose(loss, math.log(2), rtol=1e-7)
    loss, _ = objectives.reward_model_loss(jnp.array([0.0]), jnp.array([0.0]))
    np.testing.assert_allclose(loss, math.log(2), rtol=1e-7)
    # Large margins: no overflow, loss -> 0 or -> |margin|.
    big, _ = objectives.dpo_loss(jnp.array([1e4, -1e4]), jnp.zeros(2), jnp.zeros(2), jnp.zeros(2), 1.0)
    np.testing.assert_allclose(big, [0.0, 1e4], rtol=1e-6)


def test_sft_loss_matches_numpy():
    logp = -np.abs(RNG.randn(4, 10))
    mask = (RNG.rand(4, 10) > 0.4).astype(np.float32)
    mask[2] = 0
    loss, m = objectives.sft_loss(jnp.asarray(logp, jnp.float32), jnp.asarray(mask))
    expected = [-(logp[i] * mask[i]).sum() / max(mask[i].sum(), 1) for i in range(4)]
    np.testing.assert_allclose(loss, expected, rtol=1e-6)
    assert float(loss[2]) == 0.0


@pytest.mark.slow
def test_dpo_gradient_through_tiny_model_matches_finite_differences():
    """d(loss)/d(params) along a random direction, against central differences on the full pipeline:
    chunked log-probs -> masked trajectory-mean -> Bradley-Terry/DPO with NLL."""
    cfg = models.LlamaConfig.preset("tiny", vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2,
                                    num_heads=4, num_kv_heads=2)
    params = models.init_params(cfg, jax.random.key(0), std=0.3)
    tokens = jax.random.randint(jax.random.key(1), (4, 10), 0, 64)  # rows: chosen, rejected, chosen, rejected
    mask = jnp.zeros((4, 10)).at[:, 4:].set(1)
    ref = jnp.array([-4.0, -4.2, -3.9, -4.1])

    def loss_fn(p):
        lp = objectives.token_logprobs(p, cfg, tokens, mask, chunk=8)
        score = objectives.reduce_logprobs(lp, mask, "trajectory_mean")
        nll = -score[0::2]
        loss, _ = objectives.dpo_loss(score[0::2], score[1::2], ref[0::2], ref[1::2], 0.5, chosen_nll=nll,
                                      nll_coef=0.1)
        return loss.mean()

    grad = jax.grad(loss_fn)(params)
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(2), len(leaves))
    direction = jax.tree.unflatten(treedef, [jax.random.normal(k, x.shape) for k, x in zip(keys, leaves)])
    norm = jnp.sqrt(sum(jnp.sum(d * d) for d in jax.tree.leaves(direction)))
    direction = jax.tree.map(lambda d: d / norm, direction)
    analytic = sum(jnp.sum(g * d) for g, d in zip(jax.tree.leaves(grad), jax.tree.leaves(direction)))
    eps = 1e-2
    plus = loss_fn(jax.tree.map(lambda p, d: p + eps * d, params, direction))
    minus = loss_fn(jax.tree.map(lambda p, d: p - eps * d, params, direction))
    numeric = (plus - minus) / (2 * eps)
    assert abs(float(analytic)) > 1e-3
    np.testing.assert_allclose(float(analytic), float(numeric), rtol=2e-3)
