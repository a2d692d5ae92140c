"""Continuations scored on one shared-prefix KV cache equal scoring each full sequence."""

import jax
import jax.numpy as jnp
import numpy as np

from sweet_jax import models
from sweet_jax.prefix_scoring import continuation_logprobs

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
