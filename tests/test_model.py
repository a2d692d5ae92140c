"""Model behaviour that needs no HF reference: attention dispatch, remat, hidden-state variant, input checks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sweet_jax import models
from sweet_jax.models.attention import attention, attention_mask

CFG = models.LlamaConfig.preset("tiny", vocab_size=211, num_layers=3)


@pytest.fixture(scope="module")
def params():
    return models.init_params(CFG, jax.random.key(0), std=0.2)


def _tokens(b=2, t=16, seed=1):
    return jax.random.randint(jax.random.key(seed), (b, t), 0, CFG.vocab_size)


def test_attention_mask_semantics():
    seg = jnp.array([[1, 1, 2, 2, 0]])
    m = np.asarray(attention_mask(seg, seg))[0, 0]
    expected = np.array([
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [0, 0, 1, 0, 0],
        [0, 0, 1, 1, 0],
        [0, 0, 0, 0, 1],
    ], bool)
    np.testing.assert_array_equal(m, expected)


def test_reference_attention_matches_naive_loop():
    k1, k2, k3 = jax.random.split(jax.random.key(2), 3)
    q = jax.random.normal(k1, (1, 5, 4, 8))
    k = jax.random.normal(k2, (1, 5, 2, 8))
    v = jax.random.normal(k3, (1, 5, 2, 8))
    seg = jnp.array([[1, 1, 1, 2, 2]])
    out = np.asarray(attention(q, k, v, seg, seg, impl="reference"))
    qn, kn, vn = map(np.asarray, (q, k, v))
    for t in range(5):
        for n in range(4):
            allowed = [s for s in range(t + 1) if seg[0, s] == seg[0, t]]
            scores = np.array([qn[0, t, n] @ kn[0, s, n // 2] for s in allowed]) / np.sqrt(8)
            p = np.exp(scores - scores.max())
            p /= p.sum()
            np.testing.assert_allclose(out[0, t, n], p @ vn[0, allowed, n // 2], atol=1e-5)


def test_decode_attention_over_a_cache_equals_the_reference():
    """One query per row against a cache of keys [B, K, H, S] and values [B, K, S, H], with padding, a cache index
    mid-way (later slots are empty and must not be seen) and grouped query heads."""
    from sweet_jax.models.attention import cached_attention

    k1, k2, k3 = jax.random.split(jax.random.key(3), 3)
    q = jax.random.normal(k1, (2, 1, 4, 8))
    k = jax.random.normal(k2, (2, 9, 2, 8))
    v = jax.random.normal(k3, (2, 9, 2, 8))
    kv_seg = jnp.array([[1, 1, 1, 1, 1, 1, 1, 1, 1], [0, 0, 0, 1, 1, 1, 1, 1, 1]])
    index = 5  # the query sits at slot 5: slots 6.. hold garbage and must be ignored
    out = cached_attention(q, k.transpose(0, 2, 3, 1), v.swapaxes(1, 2), jnp.ones((2, 1), jnp.int32), kv_seg,
                           q_offset=index, impl="reference")
    ref = attention(q, k[:, :index + 1], v[:, :index + 1], jnp.ones((2, 1), jnp.int32), kv_seg[:, :index + 1],
                    impl="reference")
    np.testing.assert_allclose(out, ref, atol=1e-6)


def test_unstacked_layers_give_the_same_forward(params):
    unstacked = models.llama.unstack_layers(params)
    assert len(unstacked["layers"]) == CFG.num_layers and models.llama.unstack_layers(unstacked) is unstacked
    tokens = _tokens()
    np.testing.assert_allclose(models.forward_hidden(unstacked, CFG, tokens), models.forward_hidden(params, CFG, tokens),
                               atol=1e-5)
    with pytest.raises(ValueError, match="unstack_layers"):
        models.llama.forward_cached(params, CFG, tokens, None, None, models.llama.init_cache(CFG, 2, 16), 0)


@pytest.mark.parametrize("t", [3, 7])
def test_xla_attention_matches_reference_square_and_not(t):
    """Square attention uses the kernel's is_causal; a query suffix (T < S, as in decoding) the explicit mask."""
    k1, k2, k3 = jax.random.split(jax.random.key(5), 3)
    q = jax.random.normal(k1, (2, t, 4, 8))
    k = jax.random.normal(k2, (2, 7, 2, 8))
    v = jax.random.normal(k3, (2, 7, 2, 8))
    kv_seg = jnp.array([[1] * 7, [0, 0, 1, 1, 1, 1, 1]])
    q_seg = kv_seg[:, 7 - t:]
    ref = attention(q, k, v, q_seg, kv_seg, impl="reference")
    np.testing.assert_allclose(attention(q, k, v, q_seg, kv_seg, impl="xla"), ref, atol=1e-5)


@pytest.mark.parametrize("t", [16, 8, 13])
def test_query_blocked_reference_attention_is_exact(t):
    """Blocks of about 4 queries (each building its own mask, causal blocks reading only the keys up to their last
    query) equal one unblocked pass, for square and suffix queries and a query count that does not split evenly
    (13; with a traced offset: padded to two blocks of 8)."""
    from sweet_jax.models.attention import reference_attention

    k1, k2, k3 = jax.random.split(jax.random.key(6), 3)
    q = jax.random.normal(k1, (2, t, 4, 8))
    k = jax.random.normal(k2, (2, 16, 2, 8))
    v = jax.random.normal(k3, (2, 16, 2, 8))
    kv_seg = jnp.array([[1] * 5 + [2] * 11, [0] * 3 + [1] * 13])
    q_seg = kv_seg[:, 16 - t:]
    whole = reference_attention(q, k, v, q_seg, kv_seg, q_block=16)
    np.testing.assert_allclose(reference_attention(q, k, v, q_seg, kv_seg, q_block=4), whole, atol=1e-6)
    # the same blocks for a traced query offset (a KV cache's write index): lax.map over padded equal blocks
    offset = jax.jit(lambda o: reference_attention(q, k, v, q_seg, kv_seg, q_block=4, q_offset=o))(16 - t)
    np.testing.assert_allclose(offset, whole, atol=1e-6)


@pytest.mark.parametrize("impl", ["xla"])
def test_attention_implementations_agree(params, impl):
    tokens = _tokens()
    seg = jnp.array([[1] * 6 + [2] * 10, [0] * 4 + [1] * 12])
    pos = jnp.array([list(range(6)) + list(range(10)), [0] * 4 + list(range(12))])
    ref = models.forward(params, CFG.replace(attention_impl="reference"), tokens, pos, seg)
    out = models.forward(params, CFG.replace(attention_impl=impl), tokens, pos, seg)
    np.testing.assert_allclose(out, ref, atol=1e-5)


@pytest.mark.parametrize("policy", ["full", "dots", "dots_no_batch", "qkv_proj"])
def test_remat_policies_keep_values_and_gradients(params, policy):
    tokens = _tokens()

    def loss(p, cfg):
        return jnp.mean(models.forward(p, cfg, tokens) ** 2)

    base_l, base_g = jax.value_and_grad(loss)(params, CFG)
    l, g = jax.jit(jax.value_and_grad(loss), static_argnums=1)(params, CFG.replace(remat_policy=policy))
    np.testing.assert_allclose(l, base_l, rtol=1e-6)
    for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(base_g)):
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-4)


def test_forward_is_hidden_times_lm_head(params):
    tokens = _tokens()
    hidden = models.forward_hidden(params, CFG, tokens)
    assert hidden.shape == (2, 16, CFG.hidden_size)
    logits = models.forward(params, CFG, tokens)
    np.testing.assert_allclose(logits, hidden @ models.lm_head_weight(params, CFG), atol=1e-5)


def test_tied_model_has_no_lm_head():
    cfg = CFG.replace(tie_word_embeddings=True)
    p = models.init_params(cfg, jax.random.key(0))
    assert "lm_head" not in p
    np.testing.assert_array_equal(models.lm_head_weight(p, cfg), p["embed"].T)


def test_causality(params):
    a = _tokens(1, 12, seed=3)
    b = a.at[0, 8:].set((a[0, 8:] + 1) % CFG.vocab_size)
    la, lb = models.forward(params, CFG, a), models.forward(params, CFG, b)
    np.testing.assert_allclose(la[0, :8], lb[0, :8], atol=1e-6)
    assert np.abs(np.asarray(la[0, 8:] - lb[0, 8:])).max() > 1e-3


def test_bad_input_shapes_are_reported(params):
    with pytest.raises(ValueError, match="tokens must be int"):
        models.forward(params, CFG, jnp.zeros((4,), jnp.int32))
    with pytest.raises(ValueError, match="positions must have"):
        models.forward(params, CFG, _tokens(), positions=jnp.zeros((2, 3), jnp.int32))


def test_params_tree_matches_logical_axes_and_shapes(params):
    axes = models.param_logical_axes(CFG)
    is_names = lambda x: isinstance(x, tuple) and all(isinstance(n, str) for n in x)  # noqa: E731
    flat_axes = jax.tree.leaves(axes, is_leaf=is_names)
    flat_params = jax.tree.leaves(params)
    assert jax.tree.structure(axes, is_leaf=is_names).num_leaves == len(flat_params)
    for names, p in zip(flat_axes, flat_params):
        assert len(names) == p.ndim
    abstract = models.abstract_params(CFG)
    assert jax.tree.map(lambda a: (a.shape, a.dtype), abstract) == jax.tree.map(lambda a: (a.shape, a.dtype), params)


@pytest.mark.parametrize("dtype,tol", [(jnp.float32, 1e-6), (jnp.bfloat16, 2e-2)])
def test_swiglu_gradient_matches_autodiff_of_the_formula(dtype, tol):
    """The MLP gate's hand-written backward (it keeps only g and u, and works in f32) against autodiff of
    silu(g) * u in the same dtype, over gates far into both tails of the sigmoid; gradients keep the input dtypes."""
    from sweet_jax.models.llama import swiglu

    rng = np.random.default_rng(0)
    g, u, w = (jnp.asarray(rng.normal(size=(2, 5, 16)) * s, jnp.float32) for s in (6.0, 1.0, 1.0))

    def loss(fn, g, u):
        return (fn(g.astype(dtype), u.astype(dtype)).astype(jnp.float32) * w).sum()

    ours = jax.grad(lambda g, u: loss(swiglu, g, u), argnums=(0, 1))(g, u)
    want = jax.grad(lambda g, u: loss(lambda a, b: jax.nn.silu(a) * b, g, u), argnums=(0, 1))(g, u)
    np.testing.assert_allclose(swiglu(g, u), jax.nn.silu(g) * u, rtol=0, atol=0)
    for a, b in zip(ours, want):
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol)
    assert ours[0].dtype == jnp.float32
    _, vjp = jax.vjp(swiglu, g.astype(dtype), u.astype(dtype))
    assert all(x.dtype == dtype for x in vjp(jnp.ones(g.shape, dtype)))
