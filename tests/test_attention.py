"""Attention dispatch, and the Pallas splash kernel (run in interpret mode on CPU) against the einsum reference."""

from importlib import import_module

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from multidevice import run_with_devices

pytestmark = pytest.mark.kernels  # run again on the accelerators' jax (launch/test.sh)

attention = import_module("sweet_jax.models.attention")  # the module (sweet_jax.models.attention is the function)


def _inputs(b=2, t=256, s=256, n=4, k=2, h=64, seed=0):
    rng = np.random.default_rng(seed)
    q = jnp.asarray(rng.normal(size=(b, t, n, h)), jnp.float32)
    kk = jnp.asarray(rng.normal(size=(b, s, k, h)), jnp.float32)
    v = jnp.asarray(rng.normal(size=(b, s, k, h)), jnp.float32)
    # row 0: two packed documents then padding; row 1: one document, no padding
    kv_seg = np.zeros((b, s), np.int32)
    kv_seg[0, :90], kv_seg[0, 90:200] = 1, 2
    kv_seg[1, :] = 1
    return q, kk, v, jnp.asarray(kv_seg[:, s - t:]), jnp.asarray(kv_seg)


def test_splash_matches_the_reference_values_and_gradients():
    q, k, v, q_seg, kv_seg = _inputs()
    ref = attention.reference_attention(q, k, v, q_seg, kv_seg)
    out = attention.splash_attention(q, k, v, q_seg, kv_seg)
    np.testing.assert_allclose(out, ref, atol=2e-5)

    def loss(fn):
        return lambda q, k, v: (fn(q, k, v, q_seg, kv_seg) * jnp.cos(jnp.arange(64.0))).sum()

    g_ref = jax.grad(loss(attention.reference_attention), (0, 1, 2))(q, k, v)
    g_out = jax.grad(loss(attention.splash_attention), (0, 1, 2))(q, k, v)
    for a, b in zip(g_out, g_ref):
        np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4)


def test_splash_queries_at_the_end_of_longer_keys():
    q, k, v, q_seg, kv_seg = _inputs(t=128, s=256)
    ref = attention.reference_attention(q, k, v, q_seg, kv_seg)
    np.testing.assert_allclose(attention.splash_attention(q, k, v, q_seg, kv_seg), ref, atol=2e-5)


def test_splash_refuses_lengths_that_are_not_whole_tiles():
    q, k, v, q_seg, kv_seg = _inputs(t=192, s=192)
    with pytest.raises(ValueError, match="multiples of 128"):
        attention.splash_attention(q, k, v, q_seg, kv_seg)


@pytest.mark.slow
def test_splash_under_a_mesh_runs_per_shard_and_matches_the_reference_model():
    out = run_with_devices("""
        import jax, jax.numpy as jnp, numpy as np
        from sweet_jax import models
        from sweet_jax.parallel import sharding
        cfg = models.LlamaConfig.preset("tiny", vocab_size=512, hidden_size=128, intermediate_size=256, num_layers=2,
                                        num_heads=4, num_kv_heads=2)
        params = models.init_params(cfg, jax.random.key(0), std=0.1)
        rng = np.random.default_rng(0)
        tokens = jnp.asarray(rng.integers(0, 512, (4, 128)), jnp.int32)
        seg = jnp.asarray((np.arange(128)[None] < np.array([[128], [100], [60], [128]])).astype(np.int32))
        pos = jnp.broadcast_to(jnp.arange(128), (4, 128)) * seg

        def loss(p, c):
            return (models.forward_hidden(p, c, tokens, pos, seg) ** 2).mean()

        ref_val, ref_grad = jax.value_and_grad(loss)(params, cfg.replace(attention_impl="reference"))
        mesh = sharding.make_mesh({"data": 2, "fsdp": 1, "tensor": 2})
        with sharding.use_mesh(mesh):
            fn = jax.jit(jax.value_and_grad(loss), static_argnums=1)
            text = fn.lower(params, cfg.replace(attention_impl="splash")).as_text()
            val, grad = fn(params, cfg.replace(attention_impl="splash"))
        assert "shard_map" in text or "sdy.manual_computation" in text or "custom_call" in text
        diff = max(float(jnp.abs(a - b).max()) for a, b in zip(jax.tree.leaves(grad), jax.tree.leaves(ref_grad)))
        print("SPLASH", abs(float(val) - float(ref_val)), diff)
    """, n=4)
    line = next(x for x in out.splitlines() if x.startswith("SPLASH"))
    dv, dg = map(float, line.split()[1:])
    assert dv < 1e-5 and dg < 1e-4, line


def _plain_softmax_attention(q, k, v, mask, scale):
    """The textbook formula, left to autodiff: the independent reference for `_attend`'s hand-written backward."""
    b, t, n, h = q.shape
    kv = k.shape[2]
    k = jnp.repeat(k, n // kv, axis=2)
    v = jnp.repeat(v, n // kv, axis=2)
    scores = jnp.einsum("btnh,bsnh->bnts", q, k) * scale
    scores = jnp.where(mask, scores, -1e30)
    return jnp.einsum("bnts,bsnh->btnh", jax.nn.softmax(scores, axis=-1), v)


@pytest.mark.parametrize("t,q_block,offset", [(13, 64, None), pytest.param(13, 4, None, marks=pytest.mark.slow),
                                              (13, 4, "traced")])  # 13-4-None: 20 s in a full run
def test_reference_attention_values_and_gradients_match_plain_softmax(t, q_block, offset):
    """One block, static causal blocks, and equal blocks at a traced offset (a KV cache), over packed segments,
    padding and prefix-sharing branches; GQA with 2 query heads per key head."""
    s = 16
    q, k, v, _, kv_seg = _inputs(b=2, t=t, s=s, n=4, k=2, h=8, seed=3)
    kv_seg = np.zeros((2, s), np.int32)
    kv_seg[0, :7], kv_seg[0, 7:14] = 1, 2  # two documents, then 2 pads
    kv_seg[1, :] = 1
    branch = np.zeros((2, s), np.int32)
    branch[1, 8:12], branch[1, 12:] = 1, 2  # row 1: [history, chosen, rejected]
    kv_seg, branch = jnp.asarray(kv_seg), jnp.asarray(branch)
    q_seg, q_branch = kv_seg[:, s - t:], branch[:, s - t:]
    w = jnp.asarray(np.random.default_rng(4).normal(size=q.shape), jnp.float32)
    scale = 8 ** -0.5
    mask = attention.attention_mask(q_seg, kv_seg, q_branch_ids=q_branch, kv_branch_ids=branch)

    def ours(q, k, v, off):
        out = attention.reference_attention(q, k, v, q_seg, kv_seg, q_block=q_block, q_offset=off,
                                            q_branch_ids=q_branch, kv_branch_ids=branch)
        return (out * w).sum(), out

    def plain(q, k, v):
        out = _plain_softmax_attention(q, k, v, mask, scale)
        return (out * w).sum(), out

    if offset == "traced":
        fn = jax.jit(lambda q, k, v, off: jax.value_and_grad(ours, argnums=(0, 1, 2), has_aux=True)(q, k, v, off))
        (_, got), grads = fn(q, k, v, jnp.asarray(s - t))
    else:
        (_, got), grads = jax.value_and_grad(ours, argnums=(0, 1, 2), has_aux=True)(q, k, v, None)
    (_, want), want_grads = jax.value_and_grad(plain, argnums=(0, 1, 2), has_aux=True)(q, k, v)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5)
    for name, a, b in zip("qkv", grads, want_grads):
        assert float(jnp.abs(b).max()) > 1e-2, name
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, err_msg=name)


def test_static_query_blocks_run_one_at_a_time_in_both_directions():
    """The compiled forward + backward of 4,096 causal queries (8 static blocks of 512) keeps no more temporaries than
    the traced-offset path, whose rematerialised lax.map holds one block by construction. Were the blocks free to
    run side by side, XLA would hold every block's [512, S] scores at once (2.7x: 179 MiB against 65 MiB, when the
    backward's first product did not wait for its output gradient)."""
    shape = jax.ShapeDtypeStruct((1, 4096, 2, 16), jnp.float32)
    kv = jax.ShapeDtypeStruct((1, 4096, 1, 16), jnp.float32)
    seg = jax.ShapeDtypeStruct((1, 4096), jnp.int32)

    def temporaries(offset):
        def loss(q, k, v, s):
            return attention.reference_attention(q, k, v, s, s, q_offset=offset()).sum()
        compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(shape, kv, kv, seg).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    one_block_scores = 2 * 512 * 4096 * 4
    static, mapped = temporaries(lambda: None), temporaries(lambda: jnp.int32(0))
    assert static <= 1.25 * mapped and static < 5 * one_block_scores, (static, mapped)


# ------------------------------------------------------------------ fused attention over segments (xla and cuDNN)
_SEGMENTS = jnp.array([[1, 1, 2, 2, 2, 0],   # packed, then padding
                       [1, 1, 1, 1, 1, 1],   # one segment
                       [0, 0, 1, 1, 1, 1],   # left padding: the runs alone do not say what attends to what
                       [3, 3, 3, 0, 0, 0],   # one segment, then padding
                       [0, 0, 0, 0, 0, 0],   # padding only
                       [1, 2, 3, 4, 5, 6]])  # more segments than the packed path takes (4 here)


def test_segment_layout_by_hand():
    layout = attention.segment_layout(_SEGMENTS, max_segments=4)
    assert layout.offsets.tolist() == [[0, 2, -1, -1, -1], [0, -1, -1, -1, -1], [2, -1, -1, -1, -1],
                                       [0, -1, -1, -1, -1], [-1, -1, -1, -1, -1], [0, 1, 2, 3, 4]]
    assert layout.lengths.tolist() == [[2, 3, -1, -1], [6, -1, -1, -1], [4, -1, -1, -1], [3, -1, -1, -1],
                                       [-1, -1, -1, -1], [1, 1, 1, 1]]
    assert layout.count.tolist() == [2, 1, 1, 1, 0, 6]
    assert layout.runs_ok.tolist() == [True, True, False, True, True, True]


@pytest.mark.parametrize("rows,path", [((1,), "WHOLE_ROWS"), ((1, 1), "WHOLE_ROWS"), ((1, 3, 4), "ONE_SEGMENT"),
                                       ((0, 1, 3), "PACKED"), ((0, 2), "MASKED"), ((0, 5), "MASKED")])
def test_fused_path_by_layout(rows, path):
    """Rows of one segment: the kernel's own causal mask (with the rows' lengths where there is padding); packed
    rows: a packed kernel's offsets; left padding or more than `max_segments` segments in any row: a kernel that
    reads segment ids (or the explicit mask)."""
    layout = attention.segment_layout(_SEGMENTS[jnp.array(rows)], max_segments=4)
    assert int(attention.fused_path(layout, max_segments=4)) == getattr(attention, path)


def test_packed_layout_describes_the_segment_mask():
    """What a packed kernel computes from offsets and lengths (`layout_mask`) is the segment mask, for every real
    query of random packings (segments of 1-9 tokens, padding after)."""
    rng = np.random.default_rng(0)
    for _ in range(20):
        rows = []
        for _ in range(3):
            lengths = rng.integers(1, 10, size=rng.integers(0, 6))
            row = np.concatenate([np.full(n, i + 1) for i, n in enumerate(lengths)] + [np.zeros(0, int)])
            rows.append(np.pad(row[:40], (0, 40 - len(row[:40]))))
        seg = jnp.asarray(np.stack(rows), jnp.int32)
        layout = attention.segment_layout(seg)
        assert bool(layout.runs_ok.all())
        real = np.asarray(seg > 0)[:, None, :, None]
        np.testing.assert_array_equal(np.asarray(attention.layout_mask(layout, 40)) & real,
                                      np.asarray(attention.attention_mask(seg, seg)) & real)


@pytest.mark.parametrize("rows", [(1, 1), (1, 3), (1, 3, 4), (0, 1), (2, 3)])
def test_segment_attention_values_and_gradients_match_the_reference(rows):
    """xla's kernel through the segment dispatch (one-segment rows without a mask, the rest with it) against the
    reference, on every real token and in the gradients of a loss over real tokens."""
    seg = jnp.repeat(_SEGMENTS[jnp.array(rows)], 4, axis=1)  # 24 tokens
    q, k, v, _, _ = _inputs(b=len(rows), t=24, s=24, n=4, k=2, h=16, seed=3)
    real = (seg > 0)[:, :, None, None]
    weights = jnp.cos(jnp.arange(16.0))

    def loss(impl):
        return lambda q, k, v: jnp.sum(jnp.where(real, attention.attention(q, k, v, seg, seg, impl=impl), 0) * weights)

    out = attention.attention(q, k, v, seg, seg, impl="xla")
    ref = attention.attention(q, k, v, seg, seg, impl="reference")
    assert bool(jnp.isfinite(out).all())
    np.testing.assert_allclose(jnp.where(real, out, 0), jnp.where(real, ref, 0), atol=1e-5)
    for a, b in zip(jax.grad(loss("xla"), (0, 1, 2))(q, k, v), jax.grad(loss("reference"), (0, 1, 2))(q, k, v)):
        np.testing.assert_allclose(a, b, atol=1e-5)


@pytest.mark.parametrize("device,cudnn_calls", [("h100", 3), ("a100", 2)])
def test_cudnn_segment_attention_lowers_for_each_gpu_with_no_mask(device, cudnn_calls):
    """The cuDNN paths, built for a simulated GPU from this CPU (jax's own checks answer for it): forward and backward
    lower to cuDNN's fused attention for whole rows and one segment with lengths (and packed offsets on the H100),
    and to the Triton flash kernel for the layouts cuDNN takes no other way; no kernel takes a [B, 1, T, T] mask."""
    from sweet_jax.models import kernel_choice
    from sweet_jax.parallel import devices

    q, k, v, _, _ = _inputs(b=2, t=32, s=32, n=4, k=2, h=64)
    q, k, v = (x.astype(jnp.bfloat16) for x in (q, k, v))
    seg = jnp.repeat(_SEGMENTS[:2], 6, axis=1)[:, :32]
    loss = lambda q, k, v: attention.attention(q, k, v, seg, seg, impl="cudnn").astype(jnp.float32).sum()  # noqa
    with devices.simulate(device):
        text = jax.jit(jax.grad(loss, (0, 1, 2))).trace(q, k, v).lower(lowering_platforms=("cuda",)).as_text()
    calls = kernel_choice.kernel_calls(text)
    forward = [c for c in calls if c.family == "cudnn" and "Backward" not in c.target]
    assert len(forward) == cudnn_calls and len([c for c in calls if c.family == "cudnn"]) == 2 * cudnn_calls
    assert {c.name for c in calls if c.family == "triton"} == {"mha_forward", "mha_backward",
                                                               "mha_preprocess_backward"}
    assert sum(c.packed_segments > 1 for c in forward) == (device == "h100")
    assert kernel_choice.square_operands(text, 32) == []
