"""The paged KV cache: the model over pages equals the model over dense rows, the host's page book shares and frees
pages as it says, and the scheduler on a paged cache (even one much smaller than slots x context) gives the dense
cache's tokens and log-probs, bit for bit, under concurrency."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sweet_jax import models
from sweet_jax.inference.pages import PagePool
from sweet_jax.inference.sampling import SamplingParams
from sweet_jax.inference.scheduler import Job, Scheduler

pytestmark = pytest.mark.kernels  # run again on the accelerators' jax (launch/test.sh)

CFG = models.LlamaConfig.preset("tiny", vocab_size=300, hidden_size=64, intermediate_size=128, num_layers=2,
                                num_heads=4, num_kv_heads=2)


@pytest.fixture(scope="module")
def params():
    return models.init_params(CFG, jax.random.key(0), std=0.1)


def test_forward_over_shuffled_pages_equals_dense_rows_bit_for_bit(params):
    """Chunked prefill into three rows of different lengths, then decode steps with one row going idle: every real
    token's hidden state is the same, to the bit, whether the rows are dense or scattered over shuffled pages."""
    layered = models.unstack_layers(params)
    b, s, page = 3, 64, 16
    dense = models.init_cache(CFG, b, s)
    pages = b * s // page + 1
    paged = models.init_paged_cache(CFG, b, pages, page, s)
    paged["pages"] = jnp.asarray(np.random.default_rng(0).permutation(np.arange(1, pages)).reshape(b, s // page),
                                 jnp.int32)
    forward_cached = jax.jit(models.forward_cached, static_argnums=1, static_argnames="window")
    rng = np.random.default_rng(1)
    lengths = [20, 33, 5]
    for slot, n_tokens in enumerate(lengths):
        for c0 in range(0, n_tokens, 16):
            n = min(16, n_tokens - c0)
            tokens, seg = np.zeros((1, 16), np.int32), np.zeros((1, 16), np.int32)
            tokens[0, :n], seg[0, :n] = rng.integers(0, CFG.vocab_size, n), 1
            pos = (c0 + np.arange(16))[None].astype(np.int32)
            window = 32 if c0 < 16 else 64
            hd, dense = forward_cached(layered, CFG, tokens, pos, seg, dense, c0, window=window, row=slot)
            hp, paged = forward_cached(layered, CFG, tokens, pos, seg, paged, c0, window=window, row=slot)
            np.testing.assert_array_equal(np.asarray(hp)[0, :n], np.asarray(hd)[0, :n])
    length = np.array(lengths, np.int32)
    for step in range(8):
        tokens = rng.integers(0, CFG.vocab_size, (b, 1)).astype(np.int32)
        active = np.array([[1], [1], [int(step < 5)]], np.int32)
        hd, dense = forward_cached(layered, CFG, tokens, length[:, None], active, dense, jnp.asarray(length),
                                          window=48)
        hp, paged = forward_cached(layered, CFG, tokens, length[:, None], active, paged, jnp.asarray(length),
                                          window=48)
        live = active[:, 0] > 0
        np.testing.assert_array_equal(np.asarray(hp)[live], np.asarray(hd)[live])
        length = length + active[:, 0]


def test_page_pool_shares_whole_prompt_pages_and_copies_the_partial_one():
    pool = PagePool(pages=20, page_size=4, slots=4, max_pages=8)
    # 3 samples of a 10-token prompt growing to 14 tokens: 4 pages each; pages 0-1 (8 tokens) shared, page 2
    # (tokens 8-9) copied into each further sample's own page
    assert pool.needed(3, 10, 14, 0) == 4 + 2 * 2
    placed = pool.admit([0, 2, 3], 10, 14, [])
    first = placed.rows[0, :4].tolist()
    assert 0 not in first and len(set(first)) == 4  # scratch is never handed out
    for row in placed.rows[1:]:
        assert row[:2].tolist() == first[:2] and not set(row[2:4]) & set(first)
    assert placed.copy_src == first[2] and placed.copy_dst.tolist() == [placed.rows[1, 2], placed.rows[2, 2]]
    assert pool.available == 19 - 8
    # a later prompt reusing slot 0's first 2 pages: pinned, then slot 0 dropped, and they live on in slot 1
    shared = pool.pin(0, 2)
    pool.release(0)
    assert pool.available == 19 - 8 + 2  # slot 0's own two pages, not the shared ones
    placed = pool.admit([1], 9, 12, shared)
    assert placed.rows[0, :2].tolist() == first[:2] and placed.copy_dst.size == 0
    for slot in (1, 2, 3):
        pool.release(slot)
    assert pool.available == 19 and sorted(pool.free) == list(range(1, 20)) and not pool.refs[1:].any()


def _jobs():
    rng = np.random.default_rng(0)
    base = rng.integers(0, CFG.vocab_size, 40).tolist()
    prompts = [base + rng.integers(0, CFG.vocab_size, k).tolist() for k in (3, 9, 17, 1)]
    prompts += [rng.integers(0, CFG.vocab_size, 23).tolist(), base[:33]]
    for i, prompt in enumerate(prompts):  # greedy and seeded sampling, one and two samples, shared histories
        sampling = SamplingParams(temperature=0.0 if i % 3 == 0 else 1.0, top_p=0.9 if i % 2 else 1.0,
                                  max_tokens=10 + 3 * i)
        yield prompt, sampling, 2 if i % 2 else 1, i


def _run(params, **kwargs):
    sched = Scheduler(params, CFG, slots=4, context=128, segment=8, prefill_chunk=16, **kwargs)
    results = {}
    for i, (prompt, sampling, n, seed) in enumerate(_jobs()):
        sched.submit(Job(prompt, sampling, n, seed, on_done=lambda res, err, i=i: results.setdefault(i, res)))
    sched.run_until_idle()
    return results, dict(sched.stats)


@pytest.mark.slow
def test_a_paged_scheduler_gives_the_dense_tokens_and_logprobs_bit_for_bit(params):
    """Six jobs on four slots (jobs wait for slots and join the running batch), prefixes reused: the dense cache, a
    paged cache of the dense cache's size, and one of 12 usable pages (96 tokens, against the dense 4 x 128),
    where jobs also wait for pages. Same tokens and log-probs everywhere."""
    dense, dense_stats = _run(params)
    paged, paged_stats = _run(params, page_size=8)
    small, small_stats = _run(params, page_size=8, kv_pages=13)
    assert dense_stats["reused_tokens"] == paged_stats["reused_tokens"] > 0
    assert small_stats["page_waits"] > 0 and paged_stats["page_waits"] == 0
    assert sorted(dense) == sorted(paged) == sorted(small) == list(range(6))
    for i in dense:
        for a, b, c in zip(dense[i], paged[i], small[i], strict=True):
            assert a.tokens == b.tokens == c.tokens and a.logprobs == b.logprobs == c.logprobs, i
            assert a.finish_reason == b.finish_reason == c.finish_reason


def test_a_request_larger_than_the_paged_cache_is_refused_with_the_numbers(params):
    sched = Scheduler(params, CFG, slots=4, context=128, segment=8, prefill_chunk=16, page_size=8, kv_pages=5)
    with pytest.raises(ValueError, match=r"n=2 samples of a 20-token prompt with max_tokens=20 need 8 KV pages of 8 "
                                         r"tokens; the cache has 4"):
        sched.submit(Job(list(range(1, 21)), SamplingParams(max_tokens=20), 2, 0))


def test_the_paged_decode_step_holds_no_copy_of_the_pool():
    from sweet_jax.inference.placement import Placement
    from sweet_jax.inference.slots import SlotPrograms

    cfg = CFG.replace(vocab_size=512, hidden_size=128, intermediate_size=256)
    progs = SlotPrograms(cfg, Placement.build(), slots=8, context=1024, page_size=64, pages=65)
    abstract = jax.eval_shape(models.llama.unstack_layers, models.abstract_params(cfg))
    state = jax.eval_shape(progs._zeros)
    assert progs.cache_copies(abstract, state) == []
    assert len(progs.cache_copies(abstract, state, donate=False)) == 2 * cfg.num_layers


def test_paged_settings_are_checked():
    from sweet_jax.inference.placement import Placement
    from sweet_jax.inference.slots import SlotPrograms

    with pytest.raises(ValueError, match="page_size 24 must divide the prefill chunk"):
        SlotPrograms(CFG, Placement.build(), slots=4, context=128, chunk=16, page_size=24)


@pytest.mark.slow
def test_the_paged_decode_kernel_gives_the_dense_tokens(params):
    """The Triton paged decode kernel (the GPU decode path; here in interpret mode, `--paged-kernel on`), on pools in
    its layout: the dense cache's greedy and sampled tokens, and its log-probs to 1e-5 (the kernel's online softmax
    rounds differently from the einsum's)."""
    dense, _ = _run(params)
    kernel, stats = _run(params, page_size=8, paged_kernel="on")
    assert stats["reused_tokens"] > 0
    for i in dense:
        for a, b in zip(dense[i], kernel[i], strict=True):
            assert a.tokens == b.tokens, i
            np.testing.assert_allclose(b.logprobs, a.logprobs, atol=1e-5)


def _kernel_case(dtype=np.float32):
    """A paged cache with GQA (8 query heads over 2 KV heads), shuffled pages, ragged lengths (one key, part of a
    page, whole pages) and garbage in every page no row reads, with values exact in bf16 (the TPU kernel reads the
    cache as bf16); and the attention of each row's live keys, computed densely in float64."""
    rng = np.random.default_rng(0)
    b, n_heads, k, h, page, n, pool = 4, 8, 2, 128, 16, 4, 20
    bf16 = lambda x: np.asarray(jnp.asarray(x, jnp.bfloat16).astype(jnp.float32))
    shapes = ((b, 1, n_heads, h), (k, pool, page, h), (k, pool, page, h))
    q, k_pages, v_pages = (bf16(rng.normal(size=shape)) for shape in shapes)
    pages = rng.permutation(np.arange(1, pool))[: b * n].reshape(b, n).astype(np.int32)
    lengths = np.array([1, 5, 16, 64], np.int32)
    pages[0, 1:] = 0  # table entries past a row's length name the scratch page
    expected = np.zeros((b, 1, n_heads, h))
    for i in range(b):
        keys = k_pages[:, pages[i]].reshape(k, -1, h)[:, : lengths[i]].astype(np.float64)
        values = v_pages[:, pages[i]].reshape(k, -1, h)[:, : lengths[i]].astype(np.float64)
        for j in range(n_heads):
            s = keys[j // (n_heads // k)] @ q[i, 0, j] / np.sqrt(h)
            p = np.exp(s - s.max())
            expected[i, 0, j] = (p / p.sum()) @ values[j // (n_heads // k)]
    return (q, k_pages, v_pages, pages, lengths), expected


@pytest.mark.parametrize("device", ["a100", "l4", "h100", "tpu-v5e"])
def test_each_paged_decode_kernel_reads_only_each_rows_live_pages(device):
    """The paged decode kernel each simulated device gets, with its own blocks: the Triton kernel (interpret mode)
    on the GPUs, JAX's Mosaic kernel (TPU interpret mode) on the TPU, against a float64 reference over each row's
    live keys."""
    from sweet_jax.models import kernel_choice
    from sweet_jax.models.paged_attention import paged_decode_attention
    from sweet_jax.parallel import devices

    args, expected = _kernel_case()
    with devices.simulate(device, interpret=True):
        choice = kernel_choice.paged_decode("auto", args[1].shape[2], args[3].shape[1], args[1].shape[3])
        assert choice.kernel == ("mosaic" if device.startswith("tpu") else "triton") and choice.interpret
        out = paged_decode_attention(*(jnp.asarray(a) for a in args))
    np.testing.assert_allclose(np.asarray(out), expected, atol=2e-6)


@pytest.mark.parametrize("per_block,splits", [(1, 1), (2, 2), (1, 4), (4, 1)])
def test_the_triton_paged_kernel_with_any_blocks_and_partitions(per_block, splits):
    """Pages per block and partitions of each row's pages, every combination the table's 4 pages allow: the same
    attention (partitions that hold no live page drop out of the f32 combine)."""
    from sweet_jax.models.kernel_choice import PagedDecode
    from sweet_jax.models.paged_attention import paged_decode_attention

    args, expected = _kernel_case()
    out = paged_decode_attention(*(jnp.asarray(a) for a in args),
                                 choice=PagedDecode("triton", per_block, splits, interpret=True))
    np.testing.assert_allclose(np.asarray(out), expected, atol=2e-6)


def test_the_triton_paged_kernel_keeps_partitions_in_float32():
    """bf16 pools and queries over 4 partitions: the kernel's partition outputs, maxima and sums are f32 (JAX's own
    kernel stores each partition's unnormalised output in the query's dtype, bf16, and combines them in bf16), and
    the result is the float64 reference within 1.25 bf16 steps of each head's largest output (the probabilities meet
    the values in bf16: 1.12 measured, for 1, 2 or 4 partitions alike)."""
    from sweet_jax.models.kernel_choice import PagedDecode
    from sweet_jax.models.paged_attention import paged_decode_attention

    args, expected = _kernel_case()
    q, k_pages, v_pages, pages, lengths = (jnp.asarray(a, jnp.bfloat16) if i < 3 else jnp.asarray(a)
                                           for i, a in enumerate(args))
    choice = PagedDecode("triton", 1, 4, interpret=True)
    fn = lambda *a: paged_decode_attention(*a, choice=choice)  # noqa: E731
    jaxpr = jax.make_jaxpr(fn)(q, k_pages, v_pages, pages, lengths)
    calls = [e for e in _equations(jaxpr.jaxpr) if e.primitive.name == "pallas_call"]
    assert calls and all(v.aval.dtype == jnp.float32 for e in calls for v in e.outvars), calls
    out = np.asarray(fn(q, k_pages, v_pages, pages, lengths).astype(jnp.float32))
    step = 2.0 ** (np.floor(np.log2(np.abs(expected).max(axis=-1, keepdims=True))) - 7)  # one bf16 step
    assert np.all(np.abs(out - expected) <= 1.25 * step), float(np.max(np.abs(out - expected) / step))


def _equations(jaxpr):
    """Every equation of a jaxpr, those inside sub-jaxprs (pjit, vmap's batched calls) included."""
    for eqn in jaxpr.eqns:
        yield eqn
        for param in eqn.params.values():
            for sub in (param if isinstance(param, (tuple, list)) else (param,)):
                inner = getattr(sub, "jaxpr", None)
                if inner is not None:
                    yield from _equations(getattr(inner, "jaxpr", inner))


def test_the_paged_decode_kernel_split_over_kv_heads_equals_one_device():
    """Under a tensor=2 mesh each device runs the kernel on its KV head and its four query heads. The GPU kernel in
    interpret mode; the TPU kernel's TPU interpret mode hangs under shard_map on fake CPU devices (jax 0.10.2), and
    the wrapper around the two kernels is the same."""
    from multidevice import run_with_devices

    out = run_with_devices("""
        import numpy as np, jax, jax.numpy as jnp
        from test_paged_cache import _kernel_case
        from sweet_jax.models.kernel_choice import PagedDecode
        from sweet_jax.models.paged_attention import paged_decode_attention
        from sweet_jax.parallel import sharding
        args, expected = _kernel_case()
        mesh = sharding.make_mesh({"data": 1, "fsdp": 1, "tensor": 2})
        with sharding.use_mesh(mesh):
            q, kp, vp, pages, lengths = (jnp.asarray(a) for a in args)
            kp, vp = (jax.device_put(x, jax.NamedSharding(mesh, jax.P("tensor"))) for x in (kp, vp))
            choice = PagedDecode("triton", 1, 2, interpret=True)
            out = jax.jit(lambda *a: paged_decode_attention(*a, choice=choice))(q, kp, vp, pages, lengths)
            print(len(out.sharding.device_set), float(np.abs(np.asarray(out) - expected).max()))
    """, n=2, timeout=120)
    devices, error = out.split()
    assert devices == "2" and float(error) < 2e-6, out
