"""cuDNN's fused attention, emulated on the CPU, for running jax's own cuDNN wrapper here.

jax's cuDNN attention (`jax._src.cudnn.fused_attention_stablehlo`) turns a call into a core primitive whose only
lowering is the cuDNN custom call. `emulate()` gives that primitive (forward and backward) a CPU lowering that
computes what the kernel computes from the operands the wrapper hands it: so everything the wrapper does before the
kernel (for packed rows, flattening the segments and turning their offsets into element offsets by each tensor's
stride) runs here as it runs on a GPU, and a wrong offset reads the wrong keys here too.

The kernel's semantics, as emulated:
- q [B, T, N, H], k/v [B, S, K, H] (BTNH), query head n reads key/value head n // (N / K); scores scale * q.k
  plus the bias, if any; masks NO_MASK, PADDING, CAUSAL, PADDING_CAUSAL (causal aligned at the top left).
- Without offsets, row b's queries are its first q_seqlen[b] tokens and its keys its first kv_seqlen[b] (padding
  masks), or all of them.
- With offsets (packed rows), segment i's queries start at element q_offsets[i] of the flattened query tensor and
  its keys at element kv_offsets[i] of the flattened key tensor: token q_offsets[i] / (N * H) and kv_offsets[i] /
  (K * H), each tensor's own stride. A segment whose keys run past the key buffer reads garbage.
- What the kernel leaves unwritten (outputs of tokens in no segment, or past their row's length; gradients of
  tokens no segment reads) is NaN here, so a caller that lets it reach a result fails.
"""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
from jax._src.cudnn import fused_attention_stablehlo as cudnn
from jax._src.interpreters import mlir

NO_MASK, PADDING, CAUSAL, PADDING_CAUSAL = 0, 1, 2, 3


def _mask_type(value) -> int:
    return int(getattr(value, "value", value))


def _attend(query, key, value, bias, q_seqlen, kv_seqlen, q_offsets, kv_offsets, *, scale, mask_type, has_bias):
    """The emulated forward: (output [B, T, N, H] with NaN where unwritten, the queries written [B, T], the keys
    read [B, S])."""
    b, t, n, h = query.shape
    s, kv = key.shape[1], key.shape[2]
    mask_type = _mask_type(mask_type)
    padding = mask_type in (PADDING, PADDING_CAUSAL)
    causal = mask_type in (CAUSAL, PADDING_CAUSAL)
    if q_offsets.size:  # packed: segments over the flattened token buffers
        q_tok = jnp.arange(b * t)
        k_tok = jnp.arange(b * s)
        q_seqlen, kv_seqlen = q_seqlen.reshape(-1), kv_seqlen.reshape(-1)  # [B * M], shifted left by the wrapper
        q_start = q_offsets.reshape(-1)[:q_seqlen.size] // (n * h)
        k_start = kv_offsets.reshape(-1)[:kv_seqlen.size] // (kv * h)
        live = q_seqlen > 0
        in_q = live[:, None] & (q_tok[None] >= q_start[:, None]) & (q_tok[None] < (q_start + q_seqlen)[:, None])
        in_k = live[:, None] & (k_tok[None] >= k_start[:, None]) & (k_tok[None] < (k_start + kv_seqlen)[:, None])
        past_end = live & (k_start + kv_seqlen > b * s)  # keys beyond the buffer: garbage
        rel_q = q_tok[None] - q_start[:, None]
        rel_k = k_tok[None] - k_start[:, None]
        pair = in_q[:, :, None] & in_k[:, None, :]  # [segments, BT, BS]
        if causal:
            pair &= rel_k[:, None, :] <= rel_q[:, :, None]
        allowed = jnp.any(pair, axis=0)  # [BT, BS]
        written = jnp.any(in_q, axis=0) & ~jnp.any(in_q & past_end[:, None], axis=0)
        read = jnp.any(in_k, axis=0)
        qf = query.reshape(b * t, n, h)
        kf = key.reshape(b * s, kv, h)
        vf = value.reshape(b * s, kv, h)
        scores = jnp.einsum("pnh,qnh->npq", qf.astype(jnp.float32),
                            jnp.repeat(kf, n // kv, axis=1).astype(jnp.float32)) * scale
        scores = jnp.where(allowed[None], scores, -jnp.inf)
        probs = jax.nn.softmax(jnp.where(written[None, :, None], scores, 0.0), axis=-1)
        out = jnp.einsum("npq,qnh->pnh", probs, jnp.repeat(vf, n // kv, axis=1).astype(jnp.float32))
        out = jnp.where(written[:, None, None], out, jnp.nan).reshape(b, t, n, h)
        return out.astype(query.dtype), written.reshape(b, t), read.reshape(b, s)
    q_idx, k_idx = jnp.arange(t), jnp.arange(s)
    q_len = q_seqlen if padding else jnp.full((b,), t)
    k_len = kv_seqlen if padding else jnp.full((b,), s)
    written = q_idx[None] < q_len[:, None]
    read = k_idx[None] < k_len[:, None]
    allowed = written[:, :, None] & read[:, None, :]
    if causal:
        allowed &= k_idx[None, None, :] <= q_idx[None, :, None]
    scores = jnp.einsum("btnh,bsnh->bnts", query.astype(jnp.float32),
                        jnp.repeat(key, n // kv, axis=2).astype(jnp.float32)) * scale
    if has_bias:
        scores = scores + bias.astype(jnp.float32)
    scores = jnp.where(allowed[:, None], scores, -jnp.inf)
    probs = jax.nn.softmax(jnp.where(written[:, None, :, None], scores, 0.0), axis=-1)
    out = jnp.einsum("bnts,bsnh->btnh", probs, jnp.repeat(value, n // kv, axis=2).astype(jnp.float32))
    out = jnp.where(written[:, :, None, None], out, jnp.nan)
    return out.astype(query.dtype), written, read


def _fwd(query, key, value, bias, q_seqlen, kv_seqlen, q_offsets, kv_offsets, page_table_k, page_table_v, *, scale,
         variadic_args, mask_type, is_training, **_):
    out, _, _ = _attend(query, key, value, bias, q_seqlen, kv_seqlen, q_offsets, kv_offsets, scale=scale,
                        mask_type=mask_type, has_bias=variadic_args[0])
    if not is_training:
        return (out,)
    segments = q_offsets.shape[-1] - 1 if q_offsets.size else 1
    stats = jnp.zeros((query.shape[0] * segments, query.shape[2], query.shape[1]), jnp.float32)
    return out, stats


def _bwd(query, key, value, bias, q_seqlen, kv_seqlen, q_offsets, kv_offsets, page_table_k, page_table_v,
         activation, fwd_output, grad_output, *, scale, variadic_args, mask_type, **_):
    has_bias, has_dbias = variadic_args

    def forward(q, k, v, bias):
        return _attend(q, k, v, bias, q_seqlen, kv_seqlen, q_offsets, kv_offsets, scale=scale, mask_type=mask_type,
                       has_bias=has_bias)

    _, written, read = forward(query, key, value, bias)
    out, vjp = jax.vjp(lambda *a: forward(*a)[0], query, key, value, bias)
    grads = vjp(jnp.where(written[:, :, None, None], grad_output, 0).astype(out.dtype))
    dq = jnp.where(written[:, :, None, None], grads[0], jnp.nan).astype(query.dtype)
    dk = jnp.where(read[:, :, None, None], grads[1], jnp.nan).astype(key.dtype)
    dv = jnp.where(read[:, :, None, None], grads[2], jnp.nan).astype(value.dtype)
    return (dq, dk, dv, grads[3].astype(bias.dtype)) if has_dbias else (dq, dk, dv)


def _register():
    mlir.register_lowering(cudnn._dot_product_attention_fwd_p, mlir.lower_fun(_fwd, multiple_results=True),
                           platform="cpu")
    mlir.register_lowering(cudnn._dot_product_attention_bwd_p, mlir.lower_fun(_bwd, multiple_results=True),
                           platform="cpu")


_register()


@contextlib.contextmanager
def emulate(device: str = "h100"):
    """Build programs for a simulated `device` whose cuDNN attention runs through the emulator here (its Pallas
    kernels in interpret mode)."""
    from sweet_jax.parallel import devices

    with devices.simulate(device, interpret=True) as d:
        yield d
