import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sweet_jax import models
from sweet_jax.objectives import logprobs_from_hidden, token_logprobs


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
    out = logprobs_from_hidden(hidden, w, targets, chunk=chunk)
    assert out.shape == (3, 21) and out.dtype == jnp.float32
    np.testing.assert_allclose(out, _full_reference(hidden, w, targets), atol=1e-5)


def test_chunked_gradient_matches_unchunked():
    k1, k2, k3 = jax.random.split(jax.random.key(1), 3)
    hidden = jax.random.normal(k1, (2, 9, 8))
    w = jax.random.normal(k2, (8, 33))
    targets = jax.random.randint(k3, (2, 9), 0, 33)

    def full(h, w):
        return jnp.take_along_axis(jax.nn.log_softmax(h @ w), targets[..., None], -1).sum()

    g_ref = jax.grad(full, argnums=(0, 1))(hidden, w)
    g = jax.grad(lambda h, w: logprobs_from_hidden(h, w, targets, chunk=4).sum(), argnums=(0, 1))(hidden, w)
    for a, b in zip(g, g_ref):
        np.testing.assert_allclose(a, b, atol=1e-5)


@pytest.mark.parametrize("tied", [False, True])
def test_token_logprobs_equal_naive_full_logits_path(tied):
    cfg = models.LlamaConfig.preset("tiny", vocab_size=300, tie_word_embeddings=tied)
    params = models.init_params(cfg, jax.random.key(0), std=0.2)
    tokens = jax.random.randint(jax.random.key(1), (2, 12), 0, 300)
    lp = token_logprobs(params, cfg, tokens, chunk=5)
    logits = models.forward(params, cfg, tokens)  # the naive path: full logits, then log_softmax
    expected = jnp.take_along_axis(jax.nn.log_softmax(logits[:, :-1], -1), tokens[:, 1:, None], -1)[..., 0]
    assert np.all(np.asarray(lp[:, 0]) == 0)
    np.testing.assert_allclose(lp[:, 1:], expected, atol=1e-5)
    mask = jnp.zeros((2, 12)).at[:, 5:9].set(1)
    masked = token_logprobs(params, cfg, tokens, mask, chunk=5)
    np.testing.assert_array_equal(masked, np.where(mask > 0, lp, 0))


def test_gathered_logprobs_equal_full_at_those_positions():
    from sweet_jax.objectives import gathered_logprobs

    cfg = models.LlamaConfig.preset("tiny", vocab_size=300)
    params = models.init_params(cfg, jax.random.key(0), std=0.2)
    tokens = jax.random.randint(jax.random.key(1), (2, 12), 0, 300)
    full = token_logprobs(params, cfg, tokens)
    pos = jnp.array([[1, 4, 5, 11], [3, 3, 7, 8]])
    np.testing.assert_allclose(gathered_logprobs(params, cfg, tokens, pos, chunk=3),
                               jnp.take_along_axis(full, pos, 1), atol=1e-6)
