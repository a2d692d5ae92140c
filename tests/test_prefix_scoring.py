"""Continuations scored on one shared-prefix KV cache (log-probs, or a score head's values) equal scoring each full
sequence."""

import jax
import jax.numpy as jnp
import numpy as np

from sweet_jax import models
from sweet_jax.inference.prefix_scoring import continuation_logprobs, continuation_values, next_token_logprobs

CFG = models.LlamaConfig.preset("tiny", vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2,
                                num_heads=4, num_kv_heads=2)


def test_shared_prefix_scores_equal_full_sequence_scores():
    params = models.init_params(CFG, jax.random.key(0), std=0.1)
    rng = np.random.default_rng(0)
    prefix = rng.integers(0, 512, 37).tolist()
    conts = [rng.integers(0, 512, k).tolist() for k in (1, 5, 20, 9, 33)]
    got = continuation_logprobs(params, CFG, prefix, conts, chunk=16)
    worst = 0.0
    for cont, lp in zip(conts, got):
        seq = prefix + cont
        ref = jax.nn.log_softmax(models.forward(params, CFG, jnp.asarray([seq]))[0], axis=-1)
        expected = np.asarray([ref[len(prefix) - 1 + j, t] for j, t in enumerate(cont)])
        assert lp.shape == (len(cont),)
        worst = max(worst, float(np.abs(lp - expected).max()))
    assert worst <= 1e-5, worst


def test_shared_prefix_values_equal_full_sequence_values():
    cfg = CFG.replace(score_head=True)
    params = models.init_params(cfg, jax.random.key(1), std=0.1)
    rng = np.random.default_rng(1)
    prefix = rng.integers(0, 512, 21).tolist()
    conts = [rng.integers(0, 512, k).tolist() for k in (3, 1, 17)]
    prefix_values, got = continuation_values(params, cfg, prefix, conts)
    for cont, v in zip(conts, got):
        ref = np.asarray(models.token_values(params, cfg, jnp.asarray([prefix + cont]))[0])
        np.testing.assert_allclose(prefix_values, ref[:len(prefix)], atol=1e-5)
        np.testing.assert_allclose(v, ref[len(prefix):], atol=1e-5)


def test_next_token_logprobs_equal_the_full_sequence_distribution():
    params = models.init_params(CFG, jax.random.key(2), std=0.1)
    rng = np.random.default_rng(2)
    prefix = rng.integers(0, 512, 15).tolist()
    conts = [rng.integers(0, 512, k).tolist() for k in (4, 1, 11)]
    targets = [3, 77, 500]
    got = next_token_logprobs(params, CFG, prefix, conts, targets)
    assert got.shape == (3, 3)
    for cont, row in zip(conts, got):
        ref = jax.nn.log_softmax(models.forward(params, CFG, jnp.asarray([prefix + cont]))[0, -1])
        np.testing.assert_allclose(row, np.asarray(ref)[targets], atol=1e-5)
