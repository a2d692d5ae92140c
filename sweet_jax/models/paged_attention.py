"""Decode attention over a paged KV cache: one new query per row, reading only each row's live pages.

The pools are in the kernel layout, keys and values [K, P, page, H] (`models.init_paged_cache(kernel=True)`); a row
names its pages in its page-table row and its live keys by its length. `kernel_choice.paged_decode` says which
kernel runs and with which blocks:
- "triton" (NVIDIA GPUs from sm80): `_triton_paged`, flash decoding. Each program takes one row, one KV head with
  its query heads (padded to 16, the dot's smallest tile) and one of `k_splits` partitions of the row's pages, and
  walks its live pages a block at a time with a running softmax. The partial outputs, maxima and sums stay in f32
  until the partitions are combined (JAX's own kernel stores each partition's output in the query's dtype, bf16,
  before the combine). A block is at most 128 tokens, and fits shared memory on every GPU it is chosen for.
- "mosaic" (TPUs): JAX's Mosaic paged-attention kernel, which reads the cache as bf16.
On a CPU the Triton kernel runs in Pallas interpret mode, and the Mosaic kernel in TPU interpret mode under a
simulated TPU (`parallel.devices.simulate(..., interpret=True)`): slow, for tests.
"""

from __future__ import annotations

import contextlib
import functools
import math

import jax
import jax.numpy as jnp

from sweet_jax.models import kernel_choice
from sweet_jax.parallel import sharding

QUERY_BLOCK = 16  # query heads per kernel program: the Triton dot's smallest tile
MASKED = -0.7 * float(jnp.finfo(jnp.float32).max)  # a dead key's score: finite, so no inf - inf arises


def paged_decode_attention(q, k_pages, v_pages, pages, lengths, *, choice: kernel_choice.PagedDecode | None = None):
    """q [B, 1, N, H] over each row's live keys (positions < lengths [B]) in the pools k_pages / v_pages [K, P, page,
    H] through page-table rows `pages` [B, n]. `choice`: the kernel and its blocks (default: the device's, as
    `kernel_choice.paged_decode("on", ...)` gives it). Under a mesh it runs per shard of KV heads (`jax.shard_map`),
    each with its own query heads. Returns [B, 1, N, H] in q's dtype."""
    b, _, n_heads, h = q.shape
    n = pages.shape[1]
    choice = choice or kernel_choice.paged_decode("on", k_pages.shape[2], n, h)
    if choice.kernel is None:
        raise ValueError(f"no paged decode kernel was chosen ({choice.note}); gather the pages instead")

    def local(q, k_pages, v_pages, pages, lengths):
        q = q * jnp.asarray(h ** -0.5, q.dtype)
        if choice.kernel == "mosaic":
            return _mosaic_paged(q, k_pages, v_pages, pages, lengths, choice)
        return _triton_paged(q, k_pages, v_pages, pages, lengths, choice)

    qs, lengths = q[:, 0], lengths.astype(jnp.int32)
    active = sharding.active()
    if active is None:
        return local(qs, k_pages, v_pages, pages, lengths)[:, None]
    mesh, rules = active
    qspec = sharding.logical_to_spec((None, "q_heads", None), rules, mesh, qs.shape)
    kspec = sharding.logical_to_spec(("kv_heads", None, None, None), rules, mesh, k_pages.shape)
    if qspec[1] != kspec[0]:
        raise ValueError(f"paged decode attention under this mesh would split {n_heads} query heads as {qspec[1]} "
                         f"but {k_pages.shape[0]} kv heads as {kspec[0]}")
    rep = jax.sharding.PartitionSpec()
    out = jax.shard_map(local, mesh=mesh, in_specs=(qspec, kspec, kspec, rep, rep), out_specs=qspec,
                        check_vma=False)(qs, k_pages, v_pages, pages, lengths)
    return out[:, None]


def _mosaic_paged(q, k_pages, v_pages, pages, lengths, choice):
    from jax.experimental.pallas import tpu as pltpu
    from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention as tpu_kernel

    mode = pltpu.force_tpu_interpret_mode() if choice.interpret else contextlib.nullcontext()
    with mode:
        out = tpu_kernel(q, k_pages, v_pages, lengths, pages, pages_per_compute_block=choice.pages_per_block)
    return out.astype(q.dtype)


def _triton_paged(q, k_pages, v_pages, pages, lengths, choice):
    """q [B, N, H] (already scaled) -> [B, N, H]: the per-row kernel under vmap, then the partitions combined in
    f32."""
    b, n_heads, h = q.shape
    kv = k_pages.shape[0]
    group = n_heads // kv
    padded = -(-group // QUERY_BLOCK) * QUERY_BLOCK
    qg = q.reshape(b, kv, group, h)
    if padded != group:
        qg = jnp.pad(qg, ((0, 0), (0, 0), (0, padded - group), (0, 0)))
    row = functools.partial(_triton_paged_row, choice=choice)
    o, l, m = jax.vmap(row, in_axes=(0, None, None, 0, 0))(qg, k_pages, v_pages, pages, lengths[:, None])
    # o [B, splits, K, padded, H], l and m [B, splits, K, padded], all f32
    m_all = m.max(axis=1, keepdims=True)
    scale = jnp.exp(m - m_all)
    total = (l * scale).sum(axis=1)
    out = (o * scale[..., None]).sum(axis=1) / jnp.maximum(total, jnp.finfo(jnp.float32).tiny)[..., None]
    return out[:, :, :group].reshape(b, n_heads, h).astype(q.dtype)


def _triton_paged_row(q, k_pages, v_pages, table, length, *, choice):
    """One row: q [K, G', H], pools [K, P, page, H], its page table [n] and length [1] -> the partitions' unnormalised
    outputs [splits, K, G', H], sums and maxima [splits, K, G'] (f32)."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plgpu

    kv, padded, h = q.shape
    page = k_pages.shape[2]
    n = table.shape[0]
    splits, per_block = choice.k_splits, choice.pages_per_block
    per_split = n // splits
    kernel = functools.partial(_paged_kernel, pages_per_block=per_block, page_size=page)
    f32 = jnp.float32
    return pl.pallas_call(
        kernel,
        grid=(kv, splits),
        in_specs=[
            pl.BlockSpec((None, padded, h), lambda k, s: (k, 0, 0)),
            pl.BlockSpec((None, k_pages.shape[1], page, h), lambda k, s: (k, 0, 0, 0)),
            pl.BlockSpec((None, v_pages.shape[1], page, h), lambda k, s: (k, 0, 0, 0)),
            pl.BlockSpec((per_split,), lambda k, s: (s,)),
            pl.BlockSpec((1,), lambda k, s: (0,)),
        ],
        out_specs=[
            pl.BlockSpec((None, None, padded, h), lambda k, s: (s, k, 0, 0)),
            pl.BlockSpec((None, None, padded), lambda k, s: (s, k, 0)),
            pl.BlockSpec((None, None, padded), lambda k, s: (s, k, 0)),
        ],
        out_shape=[jax.ShapeDtypeStruct((splits, kv, padded, h), f32),
                   jax.ShapeDtypeStruct((splits, kv, padded), f32),
                   jax.ShapeDtypeStruct((splits, kv, padded), f32)],
        compiler_params=plgpu.CompilerParams(num_warps=choice.num_warps, num_stages=choice.num_stages),
        interpret=choice.interpret,
        name=f"sweet_jax_paged_decode_{page}x{per_block}",
    )(q, k_pages, v_pages, table, length)


def _paged_kernel(q_ref, k_ref, v_ref, table_ref, length_ref, o_ref, l_ref, m_ref, *, pages_per_block: int,
                  page_size: int):
    """One (KV head, partition) of a row: the partition's live pages, `pages_per_block` at a time."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plgpu

    split = pl.program_id(1)
    per_split = table_ref.shape[0]
    block = pages_per_block * page_size
    padded, h = q_ref.shape
    q = q_ref[...]
    first_page = split * per_split
    length = length_ref[0]
    live_pages = jnp.clip(pl.cdiv(length, page_size) - first_page, 0, per_split)
    steps = pl.cdiv(live_pages, pages_per_block)

    def body(i, carry):
        o, m, l = carry
        ids = table_ref[pl.ds(i * pages_per_block, pages_per_block)]
        k = k_ref[ids].reshape(block, h)
        v = v_ref[ids].reshape(block, h)
        s = plgpu.dot(q, k, trans_b=True)  # [padded, block] in f32
        position = (first_page + i * pages_per_block) * page_size + jnp.arange(block)
        s = jnp.where((position < length)[None, :], s, MASKED)
        m_next = jnp.maximum(m, s.max(axis=1))
        rescale = jnp.exp2((m - m_next) * math.log2(math.e))
        p = jnp.exp2((s - m_next[:, None]) * math.log2(math.e))
        o = o * rescale[:, None] + plgpu.dot(p.astype(v.dtype), v)
        return o, m_next, l * rescale + p.sum(axis=1)

    init = (jnp.zeros((padded, h), jnp.float32), jnp.full((padded,), jnp.finfo(jnp.float32).min, jnp.float32),
            jnp.zeros((padded,), jnp.float32))
    o, m, l = jax.lax.fori_loop(0, steps, body, init)
    o_ref[...] = o
    l_ref[...] = l
    m_ref[...] = m
