import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sweet_jax import models
from sweet_jax.objectives import next_token_logprobs, token_logprobs


def _full_reference(hidden, w, targets):
    logits = np.einsum("btd,dv->btv", np.asarray(hidden, np.float64), np.asarray(w, np.float64))
    logits -= logits.max(-1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    return np.take_along_axis(logp, np.asarray(targets)[..., None], -1)[..., 0]


@pytest.mark.parametrize("chunk", [1, 7, 64, 10_000])
def test_chunked_logprobs_match_full_log_softmax(chunk):
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    hidden = jax.random.normal(k1, (3, 21, 16))
    w = jax.random.normal(k2, (16, 97))
    targets = jax.random.randint(k3, (3, 21), 0, 97)
    out = token_logprobs(hidden, w, targets, chunk_size=chunk)
    assert out.shape == (3, 21) and out.dtype == jnp.float32
    np.testing.assert_allclose(out, _full_reference(hidden, w, targets), atol=2e-5)


def test_chunked_gradient_matches_unchunked():
    k1, k2, k3 = jax.random.split(jax.random.key(1), 3)
    hidden = jax.random.normal(k1, (2, 9, 8))
    w = jax.random.normal(k2, (8, 33))
    targets = jax.random.randint(k3, (2, 9), 0, 33)

    def full(h, w):
        return jnp.take_along_axis(jax.nn.log_softmax(h @ w), targets[..., None], -1).sum()

    g_ref = jax.grad(full, argnums=(0, 1))(hidden, w)
    g = jax.grad(lambda h, w: token_logprobs(h, w, targets, chunk_size=4).sum(), argnums=(0, 1))(hidden, w)
    for a, b in zip(g, g_ref):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_next_token_logprobs_align_with_tokens():
    cfg = models.LlamaConfig.preset("tiny", vocab_size=300)
    params = models.init_params(cfg, jax.random.key(0), std=0.2)
    tokens = jax.random.randint(jax.random.key(1), (2, 12), 0, 300)
    lp = next_token_logprobs(params, cfg, tokens, chunk_size=5)
    logits = np.asarray(models.forward(params, cfg, tokens), np.float64)
    logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) - logits.max(
        -1, keepdims=True)
    expected = np.take_along_axis(logp[:, :-1], np.asarray(tokens)[:, 1:, None], -1)[..., 0]
    assert np.all(np.asarray(lp[:, 0]) == 0)
    np.testing.assert_allclose(lp[:, 1:], expected, atol=2e-5)
