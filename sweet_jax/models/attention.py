"""Attention behind one dispatch function.

Implementations (`LlamaConfig.attention_impl`; what "auto" stands for and whether an explicit choice can run are
decided in Python from the device, `kernel_choice.attention_impl`, before anything is traced):
- "reference": grouped-query einsum with an explicit boolean mask and f32 softmax, in static causal query blocks,
  with a hand-written backward from the saved log-sum-exp (`_attend`). The CPU path, and tested against autodiff
  of the plain formula.
- "xla": `jax.nn.dot_product_attention(implementation="xla")`.
- "cudnn": `jax.nn.dot_product_attention(implementation="cudnn")` (NVIDIA GPUs from sm80, bf16/fp16 only). Square
  causal self-attention goes through `segment_attention`, which gives each layout the fastest mask-free kernel the
  device has: rows of one segment as `is_causal` plus sequence lengths, packed rows as cuDNN's packed-sequence
  offsets (Hopper) or Pallas's Triton flash kernel with segment ids (before Hopper), any other layout the Triton
  kernel. Prefix-shared rows (branch ids) become one row per branch (`branch_rows_attention`).
- "splash": Pallas splash attention (TPU). Under a mesh it runs per shard through `jax.shard_map` (batch and heads
  split as their logical names say, sequences whole). Off TPU it runs in Pallas interpret mode: slow, for tests only.
- "auto": splash on TPU when the sequence length is a multiple of 128, cudnn on a GPU that runs it, otherwise the
  reference.

Masking: token i attends to token j iff j <= i (by array index) and segment_ids[i] == segment_ids[j]. Segment ids thus
express both padding (pad = 0, real = 1) and packed sequences (1, 1, 2, 2, 2, 0). Every token can at least attend to
itself, so no row is ever fully masked and no NaNs arise on padding.

Branch ids (optional) add prefix sharing inside a segment: a token of branch 0 (the shared history) is seen by every
later token of its segment, a token of branch k > 0 only by later tokens of branch k. Packing [history, chosen,
rejected] with branch ids 0, 1, 2 (and positions restarting after the history) gives each candidate exactly the
attention it would have alone. The reference and xla paths take them as part of the mask; cuDNN and splash take
each branch as its own row [history, branch] (`branch_rows_attention`), which needs the pair layout: one segment,
the history, then the branches in order.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from sweet_jax.models import kernel_choice
from sweet_jax.parallel import devices, sharding


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


def attention(q, k, v, q_segment_ids, kv_segment_ids, *, impl: str = "auto", causal: bool = True, q_offset=None,
              q_branch_ids=None, kv_branch_ids=None):
    """Dispatch: q [B,T,N,H], k/v [B,S,K,H], segment ids [B,T] / [B,S] -> [B,T,N,H] in q.dtype.

    q_offset: the key index of query 0 (a KV cache's write index, possibly traced); default S - T.
    q_branch_ids / kv_branch_ids: prefix-shared packing (module docstring).
    The implementation is chosen in Python, for the device programs are built for (`parallel.devices.current()`),
    by `kernel_choice.attention_impl`; nothing a device cannot compile is traced."""
    scale = q.shape[-1] ** -0.5
    device = devices.current()
    impl = kernel_choice.attention_impl(impl, q.dtype, (q.shape[1], k.shape[1]), q.shape[-1], device)
    branched = q_branch_ids is not None
    if branched != (kv_branch_ids is not None):
        raise ValueError("pass branch ids for both the queries and the keys, or for neither")
    square = q.shape[1] == k.shape[1] and q_offset is None
    if impl in ("cudnn", "splash") and square and causal and branched:
        return branch_rows_attention(q, k, v, q_segment_ids, q_branch_ids, impl=impl, scale=scale)
    # The splash kernel's mask is static: a cache write index does not fit it.
    if impl == "splash" and (q_offset is not None or branched):
        impl = "xla"
    branches = dict(q_branch_ids=q_branch_ids, kv_branch_ids=kv_branch_ids)
    if impl == "reference":
        return reference_attention(q, k, v, q_segment_ids, kv_segment_ids, causal=causal, scale=scale,
                                   q_offset=q_offset, **branches)
    if impl in ("xla", "cudnn"):
        if square and causal and not branched:
            return segment_attention(q, k, v, q_segment_ids, impl=impl, scale=scale, device=device)
        return _masked_fused(q, k, v, q_segment_ids, kv_segment_ids, impl=impl, scale=scale, causal=causal,
                             q_offset=q_offset, **branches)
    if impl == "splash":
        return splash_attention(q, k, v, q_segment_ids, kv_segment_ids, causal=causal, scale=scale)
    raise ValueError(f"unknown attention implementation {impl!r}")


def _masked_fused(q, k, v, q_segment_ids, kv_segment_ids, *, impl: str, scale: float, causal: bool = True,
                  q_offset=None, q_branch_ids=None, kv_branch_ids=None):
    """`jax.nn.dot_product_attention` with the segment (and branch) mask as an explicit [B, 1, T, S] mask. The kernel
    applies causality itself where the attention is square (jax's is_causal aligns queries at the top-left);
    otherwise the mask carries it. cuDNN folds the mask into a bias, which takes it off its fastest path: only
    layouts that no mask-free kernel takes come here (the xla implementation, a KV cache's prefill chunks)."""
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


MASKED, ONE_SEGMENT, WHOLE_ROWS, PACKED = range(4)  # the layouts `segment_attention` tells apart


def fused_path(layout: SegmentLayout, max_segments: int = PACKED_MAX_SEGMENTS) -> jnp.ndarray:
    """Which layout this batch has (a traced int32): WHOLE_ROWS (every row one segment without padding: the
    kernel's causal mask alone), ONE_SEGMENT (one segment then padding: causal mask and sequence lengths), PACKED
    (whole segments with rising ids, padding last, at most `max_segments`: a packed kernel's offsets), else MASKED
    (left padding, repeated ids, more segments: a kernel that reads segment ids, or the explicit mask)."""
    ok = jnp.all(layout.runs_ok)
    one = ok & jnp.all(layout.count <= 1)
    whole = one & jnp.all(layout.lengths[:, 0] == layout.row_length)
    packed = ok & jnp.all(layout.count <= max_segments)
    return jnp.where(whole, WHOLE_ROWS, jnp.where(one, ONE_SEGMENT, jnp.where(packed, PACKED, MASKED))).astype(
        jnp.int32)


def segment_kernels(impl: str, device: devices.Device, t: int, head_dim: int) -> kernel_choice.SegmentKernels:
    """The kernels `segment_attention` uses for the PACKED and MASKED layouts with this implementation on this
    device (the xla implementation has none: it takes those layouts as a mask)."""
    if impl != "cudnn":
        return kernel_choice.SegmentKernels(packed=None, general=None, note="the xla implementation takes a mask")
    return kernel_choice.segment_kernels(device, t, head_dim)


def segment_attention(q, k, v, segment_ids, *, impl: str, scale: float, max_segments: int = PACKED_MAX_SEGMENTS,
                      device: devices.Device | None = None):
    """Square causal self-attention within segments on a fused kernel (`impl` "cudnn" or "xla"), in the fastest form
    the kernel takes this batch's layout (`fused_path`, a runtime choice among kernels the device supports):
    - every row one segment, no padding: `is_causal` alone (cuDNN's fastest path);
    - each row one segment then padding: `is_causal` with the rows' lengths, no mask;
    - packed rows (1, 1, 2, 2, 2, 0): cuDNN's packed-sequence attention, each segment given by its offset and
      length (`SegmentLayout`), on Hopper with cuDNN >= 9.6; before Hopper, the Pallas Triton flash kernel with
      segment ids (`kernel_choice.segment_kernels`);
    - anything else (left padding, ids that repeat, more than `max_segments` segments): the Triton kernel with
      segment ids, which reads any layout; the explicit mask only where no such kernel fits (or impl "xla").
    Which kernels exist is decided in Python from `device` (default: `devices.current()`): a kernel the device
    cannot compile is never traced. Outputs at padding (id 0) are 0 on the cuDNN paths; no gradient flows through
    them, so a loss that masks padding gets the same gradients on every path."""
    device = device or devices.current()
    b, t, n, h = q.shape
    kernels = segment_kernels(impl, device, t, h)
    layout = segment_layout(segment_ids, max_segments)
    real = (segment_ids > 0)[:, :, None, None]

    def zero_padding(x):  # where, not a product: a kernel's garbage at padding must not reach the gradients
        return jnp.where(real, x, 0).astype(q.dtype)

    def masked():
        return _masked_fused(q, k, v, segment_ids, segment_ids, impl=impl, scale=scale)

    def one_segment():
        return segment_attention_one_segment(q, k, v, jnp.maximum(layout.lengths[:, 0], 0), impl=impl, scale=scale)

    def packed_cudnn():
        cudnn = _cudnn_packed_api()
        qz, kz, vz = (zero_padding(x) for x in (q, k, v))
        if kernels.repeat_kv:  # this jax's wrapper strides key/value offsets by the query heads
            kz, vz = (jnp.repeat(x, n // x.shape[2], axis=2) for x in (kz, vz))
        lengths = jnp.where(layout.lengths > 0, layout.lengths, -1)
        out = cudnn.dot_product_attention(
            qz, kz, vz, q_seqlen=lengths, kv_seqlen=lengths, q_offsets=layout.offsets, kv_offsets=layout.offsets,
            scale=scale, mask_type=cudnn.MaskType.PADDING_CAUSAL)
        return zero_padding(out)

    def triton():
        return triton_segment_attention(q, k, v, segment_ids, scale=scale, blocks=kernels.triton,
                                        interpret=device.interpret)

    def whole_rows():
        return jax.nn.dot_product_attention(q, k, v, scale=scale, is_causal=True, implementation=impl).astype(q.dtype)

    kernel_of = {"cudnn": packed_cudnn, "triton": triton, None: masked}
    paths = {WHOLE_ROWS: whole_rows, ONE_SEGMENT: one_segment, PACKED: kernel_of[kernels.packed],
             MASKED: kernel_of[kernels.general]}
    functions = list(dict.fromkeys(paths.values()))  # each kernel traced once, whichever layouts share it
    if len(functions) == 1:
        return functions[0]()
    index = jnp.asarray([functions.index(paths[i]) for i in range(4)], jnp.int32)
    return jax.lax.switch(index[fused_path(layout, max_segments)], functions)


def _cudnn_packed_api():
    """jax's cuDNN attention module, which takes packed segments (offsets); not public in jax 0.10 or 0.11."""
    from jax._src.cudnn import fused_attention_stablehlo as cudnn_attention

    return cudnn_attention


def triton_segment_attention(q, k, v, segment_ids, *, scale: float, blocks: kernel_choice.TritonBlocks,
                             interpret: bool = False):
    """Causal attention within segments on Pallas's Triton flash kernel (forward and backward), which masks by
    segment-id equality inside its tiles: any layout, no [T, T] operand. The kernel is multi-head only, so each key
    and value head is repeated to its query heads (their gradients summed back by the repeat's transpose). Under a
    mesh it runs per shard (`per_shard`)."""
    import warnings

    with warnings.catch_warnings():  # deprecated in favour of tokamax from jax 0.11; the kernel is the same
        warnings.simplefilter("ignore", DeprecationWarning)
        from jax.experimental.pallas.ops.gpu import attention as pallas_gpu

    sizes = pallas_gpu.BlockSizes(block_q=blocks.block_q, block_k=blocks.block_k, block_q_dkv=blocks.block_q_bwd,
                                  block_kv_dkv=blocks.block_k_bwd, block_q_dq=blocks.block_q_bwd,
                                  block_kv_dq=blocks.block_k_bwd)

    def local(q, k, v, segment_ids):
        n = q.shape[2]
        k, v = (jnp.repeat(x, n // x.shape[2], axis=2) for x in (k, v))
        out = pallas_gpu.mha(q, k, v, segment_ids.astype(jnp.int32), sm_scale=scale, causal=True, block_sizes=sizes,
                             num_warps=blocks.num_warps, num_stages=blocks.num_stages, interpret=interpret)
        return out.astype(q.dtype)

    return per_shard(local, "the Triton flash kernel", q, k, v, segment_ids)


# ------------------------------------------------------------------------------------ prefix-shared rows as rows
PAIR_BRANCHES = 2  # the branches of a prefix-shared row: [history, chosen, rejected] (`data.packing.pack_pair`)


class BranchRows(NamedTuple):
    """How prefix-shared rows [history | branch 1 | branch 2] become one row per branch [history, branch k], each
    one segment then padding (`branch_rows`). Flat token indices into the [B * T] tokens: `src` [K * B * T] the
    token each row position reads (-1: padding); `src_inverse` [B * T, K] the row positions that read a token;
    `back` [B * T] the row position each token's output comes from (its own branch's row; the history's from the
    first row); `back_inverse` [K * B * T, 1] its inverse. lengths [K * B]: each row's tokens. valid [B]: the row
    had that layout (one segment, the history then the branches in order, padding outside)."""

    src: jnp.ndarray
    src_inverse: jnp.ndarray
    back: jnp.ndarray
    back_inverse: jnp.ndarray
    lengths: jnp.ndarray
    valid: jnp.ndarray


def branch_rows(segment_ids, branch_ids, branches: int = PAIR_BRANCHES) -> BranchRows:
    """The `BranchRows` of prefix-shared rows (segment ids [B, T], branch ids [B, T] with 0 for the history)."""
    b, t = segment_ids.shape
    seg, br = segment_ids.astype(jnp.int32), branch_ids.astype(jnp.int32)
    real = seg > 0
    pos = jnp.arange(t)
    first = jnp.argmax(real, axis=1)  # the row's first real token (0 in an empty row)
    counts = jnp.stack([jnp.sum(real & (br == i), axis=1) for i in range(branches + 1)], axis=1)  # [B, K + 1]
    starts = first[:, None] + jnp.cumsum(counts, axis=1) - counts  # [B, K + 1]: where each part begins
    total = counts.sum(axis=1)
    # the layout: real tokens are one run of one segment id, holding the history then branch 1, 2, ... in order
    part = jnp.sum(pos[None, :, None] >= (starts + counts)[:, None, :-1], axis=2)  # [B, T]: the part a position is in
    inside = (pos[None] >= first[:, None]) & (pos[None] < (first + total)[:, None])
    top = jnp.max(jnp.where(real, seg, 0), axis=1)
    valid = jnp.all(real == inside, axis=1) & jnp.all(~real | ((seg == top[:, None]) & (br == part)), axis=1)
    valid &= total == real.sum(axis=1)
    flat = (jnp.arange(b) * t)[:, None]
    hist, lengths, src = counts[:, 0], [], []
    for k in range(1, branches + 1):
        n = hist + counts[:, k]
        j = pos[None]
        read = jnp.where(j < hist[:, None], first[:, None] + j, starts[:, k:k + 1] + j - hist[:, None])
        src.append(jnp.where(j < n[:, None], flat + read, -1))
        lengths.append(n)
    src = jnp.stack(src)  # [K, B, T]
    row_base = (jnp.arange(branches)[:, None] * b + jnp.arange(b)[None])[..., None] * t  # [K, B, 1]
    # the row position of each token in each branch's row (-1 where that row does not read it)
    inverse = []
    for k in range(1, branches + 1):
        at = jnp.where(br == 0, pos[None] - first[:, None], hist[:, None] + pos[None] - starts[:, k:k + 1])
        reads = real & ((br == 0) | (br == k))
        inverse.append(jnp.where(reads, row_base[k - 1] + at, -1))
    inverse = jnp.stack(inverse, axis=-1)  # [B, T, K]
    own = jnp.where(br == 0, inverse[..., 0], jnp.max(inverse, axis=-1))  # a branch token's only row
    back = jnp.where(real, own, -1).reshape(-1)
    src_flat = src.reshape(-1)
    first_row = jnp.arange(branches)[:, None, None] == 0  # the first branch's row gives the history's outputs
    history_pos = pos[None, None] < hist[None, :, None]
    read_back = (src >= 0) & (first_row | ~history_pos)
    back_inverse = jnp.where(read_back, src, -1).reshape(-1, 1)
    return BranchRows(src_flat, inverse.reshape(b * t, branches), back, back_inverse,
                      jnp.stack(lengths).reshape(-1), valid)


@jax.custom_vjp
def take_tokens(x, index, inverse):
    """x [M, ...] -> [P, ...] with row p = x[index[p]] (0 where index[p] < 0). Its transpose is a sum of gathers
    through `inverse` [M, R] (the positions that read each row, -1 for none), not a scatter-add: deterministic on
    every device."""
    picked = x[jnp.maximum(index, 0)]
    return jnp.where((index >= 0).reshape((-1,) + (1,) * (x.ndim - 1)), picked, 0)


def _take_tokens_fwd(x, index, inverse):
    return take_tokens(x, index, inverse), (index, inverse)


def _take_tokens_bwd(res, g):
    _, inverse = res
    dx = sum(take_tokens(g, inverse[:, r], None) for r in range(inverse.shape[1]))
    return dx, None, None


take_tokens.defvjp(_take_tokens_fwd, _take_tokens_bwd)


def branch_rows_attention(q, k, v, segment_ids, branch_ids, *, impl: str, scale: float,
                          branches: int = PAIR_BRANCHES):
    """Square causal attention over prefix-shared rows [history | branch 1 | branch 2] on a mask-free kernel: each
    row becomes one row per branch, [history, branch k], one segment then padding, which cuDNN takes as `is_causal`
    with sequence lengths (every GPU from sm80) and splash as segment ids (TPU); each token's output comes back from
    its branch's row. The history's attention is computed once per branch (its square again per extra branch);
    the projections and the MLP still see it once. Rows of any other layout give NaN (`BranchRows.valid`): the
    training data's pair rows (`data.packing.collate_pairs`) always have this one."""
    b, t, n, h = q.shape
    rows = branch_rows(segment_ids, branch_ids, branches)

    def spread(x):  # [B, T, ...] -> [K * B, T, ...]
        flat = x.reshape(b * t, *x.shape[2:])
        return take_tokens(flat, rows.src, rows.src_inverse).reshape(branches * b, t, *x.shape[2:])

    qr, kr, vr = spread(q), spread(k), spread(v)
    row_seg = (jnp.arange(t)[None] < rows.lengths[:, None]).astype(jnp.int32)
    if impl == "splash":
        out = splash_attention(qr, kr, vr, row_seg, row_seg, causal=True, scale=scale)
    else:
        out = segment_attention_one_segment(qr, kr, vr, rows.lengths, impl=impl, scale=scale)
    out = take_tokens(out.reshape(branches * b * t, n, h), rows.back, rows.back_inverse).reshape(b, t, n, h)
    return jnp.where(rows.valid[:, None, None, None], out, jnp.nan).astype(q.dtype)


def segment_attention_one_segment(q, k, v, lengths, *, impl: str, scale: float):
    """Causal attention of rows that each hold one segment of `lengths` [B] tokens, then padding: the kernel's causal
    mask with sequence lengths, no mask operand. Outputs at padding are 0 (where, not a product: a kernel's garbage
    at padding must not reach the gradients)."""
    real = (jnp.arange(q.shape[1])[None] < lengths[:, None])[:, :, None, None]
    qz, kz, vz = (jnp.where(real, x, 0).astype(q.dtype) for x in (q, k, v))
    n = jnp.maximum(lengths, 1).astype(jnp.int32)  # a row of padding only: one token that attends to itself
    out = jax.nn.dot_product_attention(qz, kz, vz, scale=scale, is_causal=True, query_seq_lengths=n,
                                       key_value_seq_lengths=n, implementation=impl)
    return jnp.where(real, out, 0).astype(q.dtype)


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
SPLASH_BLOCK = kernel_choice.SPLASH_BLOCK


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
    # Built from concrete arrays even when first asked for inside a trace: the cached kernel holds its mask tables,
    # which would otherwise be that trace's tracers (and leak into the next trace that reuses it).
    with jax.ensure_compile_time_eval():
        kernel = sk.make_splash_mha(sm.MultiHeadMask([one] * heads), head_shards=1, q_seq_shards=1,
                                    block_sizes=blocks, interpret=interpret)
    return kernel, sk.SegmentIds


def _splash_local(q, k, v, q_segment_ids, kv_segment_ids, *, causal: bool, scale: float):
    """Splash on one device's (or shard's) arrays: the kernel is per example, [heads, seq, head_dim]."""
    device = devices.current()
    interpret = device.platform != "tpu" or device.interpret
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
    return per_shard(local, "splash attention", q, k, v, q_segment_ids, kv_segment_ids)


def per_shard(local, what: str, q, k, v, *ids):
    """local(q, k, v, *ids) on each shard's examples and heads under an active mesh (`sharding.use_mesh`), through
    `jax.shard_map`: a Pallas kernel has no partitioning rule of its own, and XLA would gather its operands whole onto
    every device. ids: [B, T] arrays (segment ids). A layout that splits query heads and key/value heads unevenly
    (more tensor shards than kv heads) is refused: the kernels need whole GQA groups."""
    active = sharding.active()
    if active is None:
        return local(q, k, v, *ids)
    mesh, rules = active
    qspec = sharding.logical_to_spec(("batch", None, "q_heads", None), rules, mesh, q.shape)
    kspec = sharding.logical_to_spec(("batch", None, "kv_heads", None), rules, mesh, k.shape)
    if qspec[2] != kspec[2]:
        raise ValueError(f"{what} under this mesh would split {q.shape[2]} query heads as {qspec[2]} but "
                         f"{k.shape[2]} kv heads as {kspec[2]}; use a tensor axis that divides the kv heads, or "
                         f"attention_impl='reference'")
    seg = sharding.logical_to_spec(("batch", None), rules, mesh, ids[0].shape)
    return jax.shard_map(local, mesh=mesh, in_specs=(qspec, kspec, kspec) + (seg,) * len(ids), out_specs=qspec,
                         check_vma=False)(q, k, v, *ids)
