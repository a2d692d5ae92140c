"""Attention behind one dispatch function.

Implementations (chosen by `LlamaConfig.attention_impl`):
- "reference": grouped-query einsum with an explicit boolean mask and f32 softmax, in static causal query blocks,
  with a hand-written backward from the saved log-sum-exp (`_attend`). The CPU path, and tested against autodiff
  of the plain formula.
- "xla": `jax.nn.dot_product_attention(implementation="xla")`.
- "cudnn": `jax.nn.dot_product_attention(implementation="cudnn")` (GPU, bf16/fp16 only).
  For square causal self-attention both go through `segment_attention`, which gives the kernel the segments in the
  fastest form it takes: rows of one segment as `is_causal` plus sequence lengths (no mask), packed rows as cuDNN's
  packed-sequence offsets and lengths, and only other layouts as an explicit mask.
- "splash": Pallas splash attention (TPU). Under a mesh it runs per shard through `jax.shard_map` (batch and heads
  split as their logical names say, sequences whole). Off TPU it runs in Pallas interpret mode: slow, for tests only.
- "auto": splash on TPU when the sequence length is a multiple of 128, cudnn on GPU when the compute dtype allows it,
  otherwise the reference.

Masking: token i attends to token j iff j <= i (by array index) and segment_ids[i] == segment_ids[j]. Segment ids thus
express both padding (pad = 0, real = 1) and packed sequences (1, 1, 2, 2, 2, 0). Every token can at least attend to
itself, so no row is ever fully masked and no NaNs arise on padding.

Branch ids (optional) add prefix sharing inside a segment: a token of branch 0 (the shared history) is seen by every
later token of its segment, a token of branch k > 0 only by later tokens of branch k. Packing [history, chosen,
rejected] with branch ids 0, 1, 2 (and positions restarting after the history) gives each candidate exactly the
attention it would have alone. The reference, xla and cuDNN paths take them as part of the mask; splash, whose
kernel knows only segment equality, hands such calls to the xla path.
"""

from __future__ import annotations

import contextlib
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from sweet_jax.parallel import sharding


def attention_mask(q_segment_ids: jnp.ndarray, kv_segment_ids: jnp.ndarray, causal: bool = True,
                   q_offset=None, q_branch_ids=None, kv_branch_ids=None) -> jnp.ndarray:
    """Boolean mask [B, 1, T, S]: True where query t may attend key s.

    Query t sits at key index q_offset + t; by default the queries are the last T of the S keys (T == S for a
    full forward). q_offset may be one index per row [B]. Branch ids [B, T] / [B, S] (both or neither): see the
    module docstring.
    """
    t, s = q_segment_ids.shape[1], kv_segment_ids.shape[1]
    mask = q_segment_ids[:, :, None] == kv_segment_ids[:, None, :]
    if (q_branch_ids is None) != (kv_branch_ids is None):
        raise ValueError("pass branch ids for both the queries and the keys, or for neither")
    if q_branch_ids is not None:
        kb = kv_branch_ids[:, None, :]
        mask = mask & ((kb == 0) | (q_branch_ids[:, :, None] == kb))
    if causal:
        offset = jnp.asarray(s - t if q_offset is None else q_offset)
        if offset.ndim:  # one offset per row (a slot-based KV cache: each row writes at its own length)
            offset = offset[:, None, None]
        q_idx = jnp.arange(t)[None, :, None] + offset
        mask = mask & (q_idx >= jnp.arange(s)[None, None, :])
    return mask[:, None]


def reference_attention(q, k, v, q_segment_ids, kv_segment_ids, *, causal: bool = True, scale: float | None = None,
                        q_block: int = 512, q_offset=None, q_branch_ids=None, kv_branch_ids=None):
    """q [B,T,N,H], k/v [B,S,K,H], segment ids [B,T] / [B,S] -> [B,T,N,H]. Softmax in f32.

    Query t sits at key index q_offset + t (default: the queries are the last T keys; a KV cache passes its write
    index). More than `q_block` queries are processed in blocks of about `q_block`, each building its own mask, and
    the backward pass keeps no probabilities (`_attend`), so memory is O(q_block * S), not O(T * S), in both
    directions. With the default offset (a full forward) the blocks are static, run one after the other, and a
    causal block reads only the keys up to its last query: the keys after it are all masked, so a long causal
    sequence costs about half the full square.
    """
    b, t, n, h = q.shape
    s, kv = k.shape[1], k.shape[2]
    scale = h ** -0.5 if scale is None else scale
    base = (s - t) if q_offset is None else q_offset
    branched = q_branch_ids is not None
    if branched != (kv_branch_ids is not None):
        raise ValueError("pass branch ids for both the queries and the keys, or for neither")
    # Head-major inside: q [B, K, G, T, H] (the G query heads of each key/value head), k and v [B, K, S, H]. XLA:CPU
    # ran the score and value products 2.5x and 5.7x faster in this layout than on the model's [B, T, N, H].
    kh, vh = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)

    def heads(x):  # [B, T', N, H] -> [B, K, G, T', H]
        return x.reshape(x.shape[0], x.shape[1], kv, n // kv, h).transpose(0, 2, 3, 1, 4)

    def attend_block(qi, ki, vi, q_seg, kv_seg, offset, q_branch, kv_branch):
        m = _MaskArgs(q_seg, kv_seg, jnp.asarray(offset, jnp.int32), q_branch, kv_branch)
        out = _attend(heads(qi), ki, vi, m, scale, causal)  # [B, K, G, T', H]
        return out.transpose(0, 3, 1, 2, 4).reshape(qi.shape)

    if t <= q_block:
        return attend_block(q, kh, vh, q_segment_ids, kv_segment_ids, base, q_branch_ids, kv_branch_ids)
    if q_offset is None:
        outs = []
        for lo in range(0, t, q_block):
            hi = min(lo + q_block, t)
            stop = base + hi if causal else s
            qi = q[:, lo:hi]
            if outs:  # one block after the other: XLA would otherwise hold several blocks' [T, S] temporaries at once
                qi = qi + 0 * outs[-1][:, :1, :1, :1]  # (XLA:CPU drops optimization barriers; it keeps x * 0.0)
            outs.append(attend_block(qi, kh[:, :, :stop], vh[:, :, :stop], q_segment_ids[:, lo:hi],
                                     kv_segment_ids[:, :stop], base + lo,
                                     q_branch_ids[:, lo:hi] if branched else None,
                                     kv_branch_ids[:, :stop] if branched else None))
        return jnp.concatenate(outs, axis=1)

    # A traced offset (a KV cache's write index): equal blocks under lax.map over every key. Blocks of at most about
    # q_block (t split evenly, else rounded up to a multiple of 8, the queries padded to fill the last block); a
    # padded query has segment id -1, matches no key, and its (uniform, finite) output is cut off below. Each block
    # is rematerialised in the backward pass, so the map keeps only its inputs.
    per = -(-t // -(-t // q_block))
    size = per if t % per == 0 else -(-per // 8) * 8
    nb = -(-t // size)
    pad = nb * size - t

    def blocks(x, fill=0):
        x = jnp.pad(x, ((0, 0), (0, pad)) + ((0, 0),) * (x.ndim - 2), constant_values=fill)
        return jnp.moveaxis(x.reshape(b, nb, size, *x.shape[2:]), 1, 0)

    @jax.checkpoint
    def block(args):
        qi, seg, off, branch = args
        return attend_block(qi, kh, vh, seg, kv_segment_ids, off, branch, kv_branch_ids)

    out = jax.lax.map(block, (blocks(q), blocks(q_segment_ids, -1), jnp.arange(nb) * size + base,
                              blocks(q_branch_ids) if branched else None))
    return jnp.moveaxis(out, 0, 1).reshape(b, nb * size, n, h)[:, :t]


class _MaskArgs(NamedTuple):
    """What `attention_mask` builds a block's mask from; integer arrays, so they get no gradient."""

    q_segment_ids: jnp.ndarray
    kv_segment_ids: jnp.ndarray
    q_offset: jnp.ndarray
    q_branch_ids: jnp.ndarray | None
    kv_branch_ids: jnp.ndarray | None


def _scores(q, k, m: _MaskArgs, scale: float, causal: bool):
    """Masked scaled scores in f32 [B, K, G, T, S] of head-major q [B, K, G, T, H] and k [B, K, S, H]."""
    mask = attention_mask(m.q_segment_ids, m.kv_segment_ids, causal, q_offset=m.q_offset,
                          q_branch_ids=m.q_branch_ids, kv_branch_ids=m.kv_branch_ids)  # [B, 1, T, S]
    scores = jnp.einsum("bkgth,bksh->bkgts", q, k, preferred_element_type=jnp.float32)
    return jnp.where(mask[:, :, None], scores * scale, jnp.finfo(jnp.float32).min)


def _attend_fwd(q, k, v, m: _MaskArgs, scale: float, causal: bool):
    scores = _scores(q, k, m, scale, causal)
    peak = jnp.max(scores, axis=-1, keepdims=True)
    p = jnp.exp(scores - peak)
    denom = jnp.sum(p, axis=-1, keepdims=True)
    # normalised after the product: a [T, H] division instead of a [T, S] one
    out = (jnp.einsum("bkgts,bksh->bkgth", p.astype(v.dtype), v, preferred_element_type=jnp.float32)
           / denom).astype(v.dtype)
    return out, (q, k, v, m, out, peak + jnp.log(denom))


def _attend_bwd(scale: float, causal: bool, res, g):
    """The softmax backward from the saved log-sum-exp: P = exp(S - lse) comes back from one product and one exp,
    dS = P (dP - D) with D = rowsum(dO * O). Nothing of size T x S is kept between the passes."""
    q, k, v, m, out, lse = res
    # No [T, S] work before the output gradient arrives: otherwise XLA runs every query block's first product early
    # (it needs only saved residuals) and holds all their probabilities at once; the forward's chain of blocks
    # (`reference_attention`) then orders the backward blocks one after the other, last first.
    q = q + 0 * g[..., :1, :1].astype(q.dtype)
    p = jnp.exp(_scores(q, k, m, scale, causal) - lse)
    dv = jnp.einsum("bkgts,bkgth->bksh", p.astype(v.dtype), g, preferred_element_type=jnp.float32)
    dp = jnp.einsum("bkgth,bksh->bkgts", g, v, preferred_element_type=jnp.float32)
    d = jnp.sum(g.astype(jnp.float32) * out.astype(jnp.float32), axis=-1, keepdims=True)
    ds = (p * (dp - d) * scale).astype(q.dtype)
    dq = jnp.einsum("bkgts,bksh->bkgth", ds, k, preferred_element_type=jnp.float32)
    dk = jnp.einsum("bkgts,bkgth->bksh", ds, q, preferred_element_type=jnp.float32)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _attend(q, k, v, m: _MaskArgs, scale: float, causal: bool):
    """softmax(q k^T * scale, masked) v, head-major: q [B, K, G, T, H], k/v [B, K, S, H] -> [B, K, G, T, H], the
    mask built from `m`.

    The backward pass (`_attend_bwd`) keeps only the inputs, the output and the log-sum-exp, not the [T, S]
    probabilities or mask, so memory stays O(T + S) per query block in both directions; and the softmax is not run
    again (autodiff of `jax.nn.softmax` under remat repeats max, exp, sum and divide, then differentiates them)."""
    return _attend_fwd(q, k, v, m, scale, causal)[0]


_attend.defvjp(_attend_fwd, _attend_bwd)


def resolve_impl(impl: str, dtype, lengths: tuple[int, ...] = ()) -> str:
    """The implementation "auto" stands for on this backend, for these dtypes and (query, key) lengths."""
    if impl != "auto":
        return impl
    if jax.default_backend() == "tpu" and all(n % SPLASH_BLOCK == 0 for n in lengths):
        return "splash"
    if jax.default_backend() == "gpu" and jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16):
        return "cudnn"
    return "reference"


def attention(q, k, v, q_segment_ids, kv_segment_ids, *, impl: str = "auto", causal: bool = True, q_offset=None,
              q_branch_ids=None, kv_branch_ids=None):
    """Dispatch: q [B,T,N,H], k/v [B,S,K,H], segment ids [B,T] / [B,S] -> [B,T,N,H] in q.dtype.

    q_offset: the key index of query 0 (a KV cache's write index, possibly traced); default S - T.
    q_branch_ids / kv_branch_ids: prefix-shared packing (module docstring)."""
    scale = q.shape[-1] ** -0.5
    impl = resolve_impl(impl, q.dtype, (q.shape[1], k.shape[1]))
    # The splash kernel's mask is static: neither a cache write index nor branch ids fit it.
    if impl == "splash" and (q_offset is not None or q_branch_ids is not None):
        impl = "xla"
    branches = dict(q_branch_ids=q_branch_ids, kv_branch_ids=kv_branch_ids)
    if impl == "reference":
        return reference_attention(q, k, v, q_segment_ids, kv_segment_ids, causal=causal, scale=scale,
                                   q_offset=q_offset, **branches)
    if impl in ("xla", "cudnn"):
        square = q.shape[1] == k.shape[1] and q_offset is None
        if square and causal and q_branch_ids is None:
            return segment_attention(q, k, v, q_segment_ids, impl=impl, scale=scale)
        return _masked_fused(q, k, v, q_segment_ids, kv_segment_ids, impl=impl, scale=scale, causal=causal,
                             q_offset=q_offset, **branches)
    if impl == "splash":
        return splash_attention(q, k, v, q_segment_ids, kv_segment_ids, causal=causal, scale=scale)
    raise ValueError(f"unknown attention implementation {impl!r}")


def _masked_fused(q, k, v, q_segment_ids, kv_segment_ids, *, impl: str, scale: float, causal: bool = True,
                  q_offset=None, q_branch_ids=None, kv_branch_ids=None):
    """`jax.nn.dot_product_attention` with the segment (and branch) mask as an explicit [B, 1, T, S] mask. The kernel
    applies causality itself where the attention is square (jax's is_causal aligns queries at the top-left);
    otherwise the mask carries it. cuDNN folds the mask into a bias, which takes it off its fastest path."""
    square = q.shape[1] == k.shape[1] and q_offset is None
    mask = attention_mask(q_segment_ids, kv_segment_ids, causal=causal and not square, q_offset=q_offset,
                          q_branch_ids=q_branch_ids, kv_branch_ids=kv_branch_ids)
    return jax.nn.dot_product_attention(q, k, v, mask=mask, scale=scale, is_causal=causal and square,
                                        implementation=impl).astype(q.dtype)


# ------------------------------------------------------------------------------- fused attention over segments
PACKED_MAX_SEGMENTS = 16  # segments per row the packed cuDNN path takes; a row with more goes to the masked path


class SegmentLayout(NamedTuple):
    """Where each row's segments lie, in the form cuDNN's packed (THD) attention takes them.

    offsets [B, M+1] int32: the first index of each segment (a run of equal positive segment ids), -1 after the
    last. lengths [B, M] int32: its token count, -1 after the last. count [B]: the row's segments (uncapped).
    runs_ok [B] bool: the row's positive ids rise from run to run and its padding (id 0) comes last, so each run is
    a whole segment and the runs alone say what attends to what. Only then does a kernel that takes offsets and
    lengths see the same attention as the mask."""

    offsets: jnp.ndarray
    lengths: jnp.ndarray
    count: jnp.ndarray
    runs_ok: jnp.ndarray
    row_length: int


def segment_layout(segment_ids: jnp.ndarray, max_segments: int = PACKED_MAX_SEGMENTS) -> SegmentLayout:
    """The `SegmentLayout` of segment ids [B, T] (1, 1, 2, 2, 2, 0 -> offsets [0, 2, -1, ...], lengths [2, 3, -1,
    ...]); rows of more than `max_segments` segments keep their first `max_segments` (see `count`)."""
    b, t = segment_ids.shape
    seg = segment_ids.astype(jnp.int32)
    prev = jnp.pad(seg, ((0, 0), (1, 0)), constant_values=-1)[:, :-1]
    starts = (seg > 0) & (seg != prev)
    # padding sorts last: ids (with 0 as +inf) never fall from one token to the next
    key = jnp.where(seg > 0, seg, jnp.iinfo(jnp.int32).max)
    runs_ok = jnp.all(key[:, 1:] >= key[:, :-1], axis=1)
    count = starts.sum(axis=1, dtype=jnp.int32)
    offsets = jax.vmap(lambda s: jnp.nonzero(s, size=max_segments + 1, fill_value=-1)[0])(starts).astype(jnp.int32)
    run = jnp.cumsum(starts, axis=1) - 1  # each token's segment index (-1 before the first)
    slot = jnp.where((seg > 0) & (run >= 0) & (run < max_segments), run, max_segments)
    lengths = jnp.zeros((b, max_segments + 1), jnp.int32).at[jnp.arange(b)[:, None], slot].add(1)[:, :max_segments]
    lengths = jnp.where(jnp.arange(max_segments) < count[:, None], lengths, -1)
    return SegmentLayout(offsets, lengths, count, runs_ok, t)


def layout_mask(layout: SegmentLayout, t: int) -> jnp.ndarray:
    """The causal [B, 1, T, T] mask that offsets and lengths describe (a token attends to the earlier tokens of its
    own segment; a token in no segment attends to nothing): what a packed kernel computes, written out, so that the
    layout can be checked against `attention_mask` where no such kernel runs."""
    idx = jnp.arange(t)
    starts, lengths = layout.offsets[:, :-1], layout.lengths
    member = (idx[None, :, None] >= starts[:, None, :]) & (idx[None, :, None] < (starts + lengths)[:, None, :])
    member &= lengths[:, None, :] > 0  # [B, T, M]
    same = jnp.einsum("btm,bsm->bts", member.astype(jnp.int32), member.astype(jnp.int32)) > 0
    return (same & (idx[:, None] >= idx[None, :]))[:, None]


MASKED, ONE_SEGMENT, WHOLE_ROWS, PACKED = range(4)  # the paths of `segment_attention`


def fused_path(layout: SegmentLayout, impl: str, max_segments: int = PACKED_MAX_SEGMENTS) -> jnp.ndarray:
    """Which path `segment_attention` takes for this batch (a traced int32): WHOLE_ROWS (every row one segment
    without padding: the kernel's causal mask alone), ONE_SEGMENT (one segment then padding: causal mask and
    sequence lengths), PACKED (cuDNN's segment offsets; cuDNN only), else MASKED (an explicit mask)."""
    ok = jnp.all(layout.runs_ok)
    one = ok & jnp.all(layout.count <= 1)
    whole = one & jnp.all(layout.lengths[:, 0] == layout.row_length)
    packed = ok & jnp.all(layout.count <= max_segments) & (impl == "cudnn")
    return jnp.where(whole, WHOLE_ROWS, jnp.where(one, ONE_SEGMENT, jnp.where(packed, PACKED, MASKED))).astype(
        jnp.int32)


def segment_attention(q, k, v, segment_ids, *, impl: str, scale: float, max_segments: int = PACKED_MAX_SEGMENTS):
    """Square causal self-attention within segments on a fused kernel (`impl` "cudnn" or "xla"), choosing per batch
    (`fused_path`) the fastest form the kernel takes the segments in:
    - every row one segment, no padding: `is_causal` alone (cuDNN's fastest path);
    - each row one segment then padding: `is_causal` with the rows' lengths, no mask;
    - packed rows (1, 1, 2, 2, 2, 0): cuDNN's packed-sequence attention, each segment given by its offset and
      length (`SegmentLayout`); the kernel runs on the segments alone, at the one-segment speed. It needs a Hopper
      GPU or newer (cuDNN's rule);
    - anything else (left padding, ids that repeat, more than `max_segments` segments): the explicit mask.
    Outputs at padding (id 0) are 0 on the first two paths (the mask path lets padding attend to padding); no
    gradient flows through them, so a loss that masks padding gets the same gradients on every path."""
    layout = segment_layout(segment_ids, max_segments)
    real = (segment_ids > 0)[:, :, None, None]

    def zero_padding(x):  # where, not a product: a kernel's garbage at padding must not reach the gradients
        return jnp.where(real, x, 0).astype(q.dtype)

    def masked():
        return _masked_fused(q, k, v, segment_ids, segment_ids, impl=impl, scale=scale)

    def one_segment():
        lengths = jnp.maximum(layout.lengths[:, 0], 1)  # a row of padding only: one token that attends to itself
        qz, kz, vz = (zero_padding(x) for x in (q, k, v))
        out = jax.nn.dot_product_attention(qz, kz, vz, scale=scale, is_causal=True, query_seq_lengths=lengths,
                                           key_value_seq_lengths=lengths, implementation=impl)
        return zero_padding(out)

    cudnn_attention = _cudnn_packed_api() if impl == "cudnn" else None

    def packed():
        qz, kz, vz = (zero_padding(x) for x in (q, k, v))
        lengths = jnp.where(layout.lengths > 0, layout.lengths, -1)
        out = cudnn_attention.dot_product_attention(
            qz, kz, vz, q_seqlen=lengths, kv_seqlen=lengths, q_offsets=layout.offsets, kv_offsets=layout.offsets,
            scale=scale, mask_type=cudnn_attention.MaskType.PADDING_CAUSAL)
        return zero_padding(out)

    def whole_rows():
        return jax.nn.dot_product_attention(q, k, v, scale=scale, is_causal=True, implementation=impl).astype(q.dtype)

    branches = {MASKED: masked, ONE_SEGMENT: one_segment, WHOLE_ROWS: whole_rows, PACKED: packed}
    if cudnn_attention is None:  # never chosen then (`fused_path`); the index must still name a branch
        branches[PACKED] = masked
    return jax.lax.switch(fused_path(layout, impl, max_segments), [branches[i] for i in range(4)])


def _cudnn_packed_api():
    """jax's cuDNN attention module, which takes packed segments (offsets); not public in jax 0.10. None where this
    jax lacks it: packed rows then take the masked path."""
    try:
        from jax._src.cudnn import fused_attention_stablehlo as cudnn_attention
    except ImportError:
        return None
    return cudnn_attention if hasattr(cudnn_attention, "MaskType") else None


def cached_attention(q, k_cache, v_cache, q_segment_ids, kv_segment_ids, *, q_offset, impl: str = "auto"):
    """Attention of T new queries q [B,T,N,H] over a KV cache of keys k [B,K,H,S] and values v [B,K,S,H] (the
    cache's layouts, `models.init_cache`), where query 0 sits at key index `q_offset` (a scalar, or one per row [B]
    for a single query per row). Returns [B,T,N,H].

    One query per row (decoding) is computed here straight from those layouts: both products are plain batched
    matrix products, q [G,H] @ k [H,S] and p [G,S] @ v [S,H], with no transposes or packing (XLA:CPU measured keys
    laid out [S,H] twice as slow, and the [B,S,K,H] layout slower still). Longer query blocks (prefill, candidate
    scoring) transpose the cache once and go through `attention`, which blocks long queries and dispatches to the
    fused kernels."""
    b, t, n, h = q.shape
    kv = k_cache.shape[1]
    if t > 1 and jnp.ndim(q_offset):
        raise ValueError("per-row cache offsets take one new query per row")
    if t > 1:
        return attention(q, k_cache.transpose(0, 3, 1, 2), v_cache.swapaxes(1, 2), q_segment_ids, kv_segment_ids,
                         impl=impl, q_offset=q_offset)
    mask = attention_mask(q_segment_ids, kv_segment_ids, causal=True, q_offset=q_offset)[:, :, 0]  # [B, 1, S]
    qg = q.reshape(b, kv, n // kv, h)
    scores = jnp.einsum("bkgh,bkhs->bkgs", qg, k_cache, preferred_element_type=jnp.float32) * h ** -0.5
    scores = jnp.where(mask[:, :, None], scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(v_cache.dtype)
    return jnp.einsum("bkgs,bksh->bkgh", probs, v_cache).reshape(b, 1, n, h).astype(q.dtype)


def paged_decode_attention(q, k_pages, v_pages, pages, lengths, *, platform: str | None = None):
    """One new query per row, q [B, 1, N, H], over each row's live pages of a paged KV cache in the kernel layout
    (keys and values [K, P, page, H]): page table rows `pages` [B, n] and lengths [B] (the keys at positions
    < length are live). Runs JAX's Pallas paged-attention kernel for `platform` (default: the backend's), which reads
    only the pages below each row's length (ragged): the Triton kernel on a GPU, the Mosaic kernel on a TPU (it
    reads keys and values as bf16, the TPU's cache dtype). Elsewhere the GPU kernel runs in interpret mode, or the
    TPU kernel in TPU interpret mode with platform="tpu" (slow; for tests). Under a mesh it runs per shard of KV
    heads (`jax.shard_map`), each with its own query heads. Returns [B, 1, N, H]."""
    b, _, n_heads, h = q.shape
    n = pages.shape[1]
    splits = next(s for s in (16, 8, 4, 2, 1) if n % s == 0)  # partitions of each row's pages, run in parallel
    per_block = next(s for s in (8, 4, 2, 1) if (n // splits) % s == 0)  # pages per compute block
    backend = jax.default_backend()
    platform = platform or (backend if backend in ("gpu", "tpu") else "gpu")

    def local(q, k_pages, v_pages, pages, lengths):
        q = q * jnp.asarray(h ** -0.5, q.dtype)
        if platform == "tpu":
            from jax.experimental.pallas import tpu as pltpu
            from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention as tpu_kernel

            mode = contextlib.nullcontext() if backend == "tpu" else pltpu.force_tpu_interpret_mode()
            with mode:
                out = tpu_kernel(q, k_pages, v_pages, lengths, pages, pages_per_compute_block=per_block)
        else:
            from jax.experimental.pallas.ops.gpu import paged_attention as gpu_kernel

            out = gpu_kernel.paged_attention(q, k_pages, v_pages, pages, lengths, block_h=16,
                                             pages_per_compute_block=per_block, k_splits=splits,
                                             interpret=backend != "gpu")
        return out.astype(q.dtype)

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


def prefix_shared_attention(q, prefix_k, prefix_v, prefix_segment_ids, k, v, segment_ids, *, block: int = 2048):
    """Attention of N rows of C queries q [N,C,Nq,H] over one shared prefix (the cache's layouts: prefix_k
    [1,K,H,P], prefix_v [1,K,P,H], prefix_segment_ids [1,P], real keys > 0) followed by each row's own keys k/v
    [N,C,K,H] (causal within the row, segment ids [N,C]). Returns [N,C,Nq,H].

    The prefix is never copied per row: the N*C*G queries of a KV head meet its P prefix keys in one matrix product.
    Long prefixes are taken in blocks of `block` keys with a running (max, sum) softmax, so the temporaries stay
    O(N C Nq block). Every product's output keeps the order a batched matrix product writes (batch axes, then the
    queries, then the keys), [K, N, C, G, block] over the prefix: any other order transposes the largest
    temporaries, the [.., block] scores, at every block."""
    n, c, nq, h = q.shape
    kv = k.shape[2]
    scale = h ** -0.5
    f32, neg = jnp.float32, jnp.finfo(jnp.float32).min
    qg = q.reshape(n, c, kv, nq // kv, h)
    own = jnp.einsum("ncxgh,nsxh->nxcgs", qg, k, preferred_element_type=f32) * scale
    mask = (segment_ids[:, :, None] == segment_ids[:, None, :]) & jnp.tri(c, dtype=bool)[None]
    own = jnp.where(mask[:, None, :, None], own, neg)
    m = own.max(-1)
    p_own = jnp.exp(own - m[..., None])
    total, out = p_own.sum(-1), jnp.einsum("nxcgs,nsxh->nxcgh", p_own.astype(v.dtype), v, preferred_element_type=f32)
    m, total, out = m.swapaxes(0, 1), total.swapaxes(0, 1), out.swapaxes(0, 1)  # [K, N, C, G(, H)]

    p = prefix_v.shape[2]
    size = next((b for b in (block, block // 2, block // 4) if p % b == 0), p) if p > block else p

    def add_block(carry, blk):
        m, total, out = carry
        kb, vb, segb = blk  # [K, H, b], [K, b, H], [b]
        sc = jnp.einsum("ncxgh,xhp->xncgp", qg, kb, preferred_element_type=f32) * scale
        sc = jnp.where(segb > 0, sc, neg)
        m_new = jnp.maximum(m, sc.max(-1))
        pb = jnp.exp(sc - m_new[..., None])
        rescale = jnp.exp(m - m_new)
        out = out * rescale[..., None] + jnp.einsum("xncgp,xph->xncgh", pb.astype(vb.dtype), vb,
                                                    preferred_element_type=f32)
        return (m_new, total * rescale + pb.sum(-1), out), None

    nb = p // size
    kb = prefix_k[0].reshape(kv, h, nb, size).transpose(2, 0, 1, 3)  # [nb, K, H, size]
    vb = prefix_v[0].reshape(kv, nb, size, h).swapaxes(0, 1)  # [nb, K, size, H]
    (m, total, out), _ = jax.lax.scan(add_block, (m, total, out), (kb, vb, prefix_segment_ids[0].reshape(nb, size)))
    out = out / total[..., None]  # [K, N, C, G, H]
    return out.transpose(1, 2, 0, 3, 4).reshape(n, c, nq, h).astype(q.dtype)


# ----------------------------------------------------------------------------------------------- splash (TPU)
SPLASH_BLOCK = 128  # the kernel's tile: sequence lengths must be multiples of it


@functools.lru_cache(maxsize=64)
def _splash_kernel(heads: int, t: int, s: int, causal: bool, interpret: bool):
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

    if t % SPLASH_BLOCK or s % SPLASH_BLOCK:
        raise ValueError(f"splash attention needs sequence lengths that are multiples of {SPLASH_BLOCK}, got "
                         f"{t} queries and {s} keys; use attention_impl='reference' (or 'auto')")
    one = sm.CausalMask((t, s), offset=s - t) if causal else sm.FullMask((t, s))
    bq, bkv = (max(b for b in (512, 256, 128) if n % b == 0) for n in (t, s))
    blocks = sk.BlockSizes(block_q=bq, block_kv=bkv, block_kv_compute=bkv, block_q_dkv=bq, block_kv_dkv=bkv,
                           block_kv_dkv_compute=bkv, block_q_dq=bq, block_kv_dq=bkv)
    kernel = sk.make_splash_mha(sm.MultiHeadMask([one] * heads), head_shards=1, q_seq_shards=1, block_sizes=blocks,
                                interpret=interpret)
    return kernel, sk.SegmentIds


def _splash_local(q, k, v, q_segment_ids, kv_segment_ids, *, causal: bool, scale: float):
    """Splash on one device's (or shard's) arrays: the kernel is per example, [heads, seq, head_dim]."""
    interpret = jax.default_backend() != "tpu"
    kernel, segment_ids = _splash_kernel(q.shape[2], q.shape[1], k.shape[1], causal, interpret)

    def one(qi, ki, vi, qs, ks):
        out = kernel((qi * scale).swapaxes(0, 1), ki.swapaxes(0, 1), vi.swapaxes(0, 1),
                     segment_ids=segment_ids(qs, ks))
        return out.swapaxes(0, 1)

    return jax.vmap(one)(q, k, v, q_segment_ids, kv_segment_ids).astype(q.dtype)


def splash_attention(q, k, v, q_segment_ids, kv_segment_ids, *, causal: bool = True, scale: float | None = None):
    """Pallas splash attention; same contract as `reference_attention`. Under an active mesh (`sharding.use_mesh`)
    each shard runs the kernel on its own examples and heads; a layout that splits query heads and key/value heads
    unevenly (more tensor shards than kv heads) is refused, since the kernel needs whole GQA groups."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    local = functools.partial(_splash_local, causal=causal, scale=scale)
    active = sharding.active()
    if active is None:
        return local(q, k, v, q_segment_ids, kv_segment_ids)
    mesh, rules = active
    qspec = sharding.logical_to_spec(("batch", None, "q_heads", None), rules, mesh, q.shape)
    kspec = sharding.logical_to_spec(("batch", None, "kv_heads", None), rules, mesh, k.shape)
    if qspec[2] != kspec[2]:
        raise ValueError(f"splash attention under this mesh would split {q.shape[2]} query heads as {qspec[2]} but "
                         f"{k.shape[2]} kv heads as {kspec[2]}; use a tensor axis that divides the kv heads, or "
                         f"attention_impl='reference'")
    seg = sharding.logical_to_spec(("batch", None), rules, mesh, q_segment_ids.shape)
    return jax.shard_map(local, mesh=mesh, in_specs=(qspec, kspec, kspec, seg, seg), out_specs=qspec,
                         check_vma=False)(q, k, v, q_segment_ids, kv_segment_ids)
