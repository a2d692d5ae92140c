import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sweet_jax import models
from sweet_jax.objectives import logprobs_from_hidden, token_logprobs

pytestmark = pytest.mark.kernels  # run again on the accelerators' jax (launch/test.sh)


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


def _full_gradient(hidden, w, targets, weights):
    """d/d(hidden, w) of sum(weights * log_softmax(hidden @ w)[targets]), in float64 numpy."""
    h, w64 = np.asarray(hidden, np.float64), np.asarray(w, np.float64)
    logits = np.einsum("btd,dv->btv", h, w64)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    onehot = np.eye(w64.shape[1])[np.asarray(targets)]
    dlogits = np.asarray(weights, np.float64)[..., None] * (onehot - p)
    return np.einsum("btv,dv->btd", dlogits, w64), np.einsum("btd,btv->dv", h, dlogits)


@pytest.mark.parametrize("chunk", [4, 7, 1000])
def test_chunked_gradient_matches_full_softmax_gradient(chunk):
    # Per-token weights (as every loss applies) and chunks that do not divide the sequence (padded positions).
    k1, k2, k3, k4 = jax.random.split(jax.random.key(1), 4)
    hidden = jax.random.normal(k1, (2, 9, 8))
    w = jax.random.normal(k2, (8, 33))
    targets = jax.random.randint(k3, (2, 9), 0, 33)
    weights = jax.random.normal(k4, (2, 9))
    g = jax.grad(lambda h, w: (weights * logprobs_from_hidden(h, w, targets, chunk=chunk)).sum(),
                 argnums=(0, 1))(hidden, w)
    for a, b in zip(g, _full_gradient(hidden, w, targets, weights)):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_bf16_hidden_states_give_bf16_rounded_gradients_and_an_f32_projection_gradient():
    k1, k2, k3, k4 = jax.random.split(jax.random.key(2), 4)
    hidden = jax.random.normal(k1, (2, 24, 32)).astype(jnp.bfloat16)
    w = 0.3 * jax.random.normal(k2, (32, 500))  # the f32 parameter, cast inside
    targets = jax.random.randint(k3, (2, 24), 0, 500)
    weights = jax.random.normal(k4, (2, 24))
    dh, dw = jax.grad(lambda h, w: (weights * logprobs_from_hidden(h, w, targets, chunk=16)).sum(),
                      argnums=(0, 1))(hidden, w)
    assert dh.dtype == jnp.bfloat16 and dw.dtype == jnp.float32
    ref_h, ref_w = _full_gradient(hidden.astype(jnp.float32), w.astype(jnp.bfloat16).astype(jnp.float32),
                                  targets, weights)
    # bf16 operands (8 significant bits) with f32 accumulation: about 1% of each gradient's scale.
    np.testing.assert_allclose(dh.astype(jnp.float32), ref_h, atol=0.02 * np.abs(ref_h).max())
    np.testing.assert_allclose(dw, ref_w, atol=0.02 * np.abs(ref_w).max())


def _vocabulary_dots(fn, *args, vocab):
    """(lhs dtype, rhs dtype) of every dot_general in fn's lowered program with an operand of `vocab` columns."""
    import re

    text = jax.jit(fn).lower(*args).as_text()
    found = []
    for m in re.finditer(r"stablehlo\.dot_general[^\n]*?:\s*\((tensor<[^>]*>),\s*(tensor<[^>]*>)\)", text):
        shapes = [t[len("tensor<"):-1].split("x") for t in m.groups()]
        if any(str(vocab) in s[:-1] for s in shapes):
            found.append(tuple(s[-1] for s in shapes))
    return found


def test_bf16_training_runs_every_vocabulary_matmul_on_bf16_operands():
    # The backward's two vocabulary matmuls are as large as the forward's: autodiff of an f32-output einsum would
    # run them on the f32 logits' gradient (TF32 or f32 on a GPU, at half the bf16 rate or less).
    cfg = models.LlamaConfig.preset("tiny", vocab_size=1024, compute_dtype="bfloat16")
    params = models.init_params(cfg, jax.random.key(0), std=0.2)
    tokens = jax.random.randint(jax.random.key(1), (2, 16), 0, 1024)
    dots = _vocabulary_dots(jax.grad(lambda p: token_logprobs(p, cfg, tokens, chunk=8).sum()), params, vocab=1024)
    assert len(dots) == 4, dots  # the logits, their recomputation in the backward, and the two gradients
    assert all(d == ("bf16", "bf16") for d in dots), dots


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
