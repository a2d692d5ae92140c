"""Qwen2-VL's vision side as pure functions over a parameter pytree: the vision tower (HF
`Qwen2VisionTransformerPretrainedModel`), its features in the decoder's `<|image_pad|>` positions, and the M-RoPE
positions of a batch with images. The decoder is `models.llama` with the config's `mrope_section`; its params hold
the tower under `visual`.

Patches (`models.qwen2_vl_images.preprocess`: [N, C * T * P * P], in merge-window order) go through:
- the patch embedding, a Conv3d whose kernel equals its stride, so one matrix product with the flattened kernel;
- `depth` pre-norm blocks (LayerNorm, eps 1e-6): attention with a bias on qkv and proj, rotated by a 2-D RoPE (each
  head's first half by the patch's row, second half by its column, theta 10,000), bidirectional and masked per
  image frame; then an MLP with QuickGELU;
- the PatchMerger: LayerNorm, the 2 x 2 neighbouring patches concatenated, then Linear, exact GELU, Linear to the
  language model's width: [N / 4, hidden_size].
No window attention (that is Qwen2.5-VL). Parameter layout (leading `L` = stacked blocks, run with `lax.scan`):

    patch          [C*T*P*P, E]        (None, "embed")
    blocks/
      norm1_w, norm1_b, norm2_w, norm2_b  [L, E]       ("layers", "norm")
      wqkv [L, E, 3, N, H]  ("layers", "embed", None, "q_heads", "head_dim");  bqkv [L, 3, N, H]
      wo   [L, N, H, E]     ("layers", "q_heads", "head_dim", "embed");        bo [L, E]
      fc1_w [L, E, F] ("layers", "embed", "mlp"); fc1_b [L, F]; fc2_w [L, F, E]; fc2_b [L, E]
    merger/
      norm_w, norm_b [E]; fc1_w [4E, 4E] (None, "mlp"); fc1_b [4E]; fc2_w [4E, D] ("mlp", "embed"); fc2_b [D]
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from sweet_jax.models.attention import attention
from sweet_jax.models.model_configs import VisionConfig
from sweet_jax.models.layers import layer_norm, quick_gelu
from sweet_jax.models.rope import apply_rope

Params = dict


def vision_param_shapes(vc: VisionConfig) -> Params:
    l, e, n, h, f = vc.depth, vc.embed_dim, vc.num_heads, vc.head_dim, vc.mlp_dim
    m = e * vc.spatial_merge_size ** 2
    return {
        "patch": (vc.patch_dim, e),
        "blocks": {"norm1_w": (l, e), "norm1_b": (l, e), "norm2_w": (l, e), "norm2_b": (l, e),
                   "wqkv": (l, e, 3, n, h), "bqkv": (l, 3, n, h), "wo": (l, n, h, e), "bo": (l, e),
                   "fc1_w": (l, e, f), "fc1_b": (l, f), "fc2_w": (l, f, e), "fc2_b": (l, e)},
        "merger": {"norm_w": (e,), "norm_b": (e,), "fc1_w": (m, m), "fc1_b": (m,), "fc2_w": (m, vc.hidden_size),
                   "fc2_b": (vc.hidden_size,)},
    }


def vision_param_logical_axes(vc: VisionConfig) -> Params:
    """Logical axis names (`parallel.sharding`): heads and MLP over the tensor axis, as in the language model."""
    norm = ("layers", "norm")
    return {
        "patch": (None, "embed"),
        "blocks": {"norm1_w": norm, "norm1_b": norm, "norm2_w": norm, "norm2_b": norm,
                   "wqkv": ("layers", "embed", None, "q_heads", "head_dim"), "bqkv": ("layers", None, "q_heads",
                                                                                      "head_dim"),
                   "wo": ("layers", "q_heads", "head_dim", "embed"), "bo": norm,
                   "fc1_w": ("layers", "embed", "mlp"), "fc1_b": ("layers", "mlp"), "fc2_w": ("layers", "mlp", "embed"),
                   "fc2_b": norm},
        "merger": {"norm_w": ("norm",), "norm_b": ("norm",), "fc1_w": (None, "mlp"), "fc1_b": ("mlp",),
                   "fc2_w": ("mlp", "embed"), "fc2_b": ("norm",)},
    }


def vision_hf_layout(vc: VisionConfig, prefix: str = "visual.") -> dict[str, tuple[str, Callable, Callable]]:
    """Our leaf path -> (HF name template, to ours, to HF), as `llama.hf_weight_layout`."""
    e, n, h = vc.embed_dim, vc.num_heads, vc.head_dim
    b = prefix + "blocks.{i}."
    same = (lambda w: w, lambda w: w)
    t = (lambda w: w.T, lambda w: w.T)
    return {
        "patch": (prefix + "patch_embed.proj.weight", lambda w: w.reshape(w.shape[0], -1).T,
                  lambda w, s=(vc.in_channels, vc.temporal_patch_size, vc.patch_size, vc.patch_size):
                  w.T.reshape(w.shape[1], *s)),
        "blocks/norm1_w": (b + "norm1.weight", *same), "blocks/norm1_b": (b + "norm1.bias", *same),
        "blocks/norm2_w": (b + "norm2.weight", *same), "blocks/norm2_b": (b + "norm2.bias", *same),
        "blocks/wqkv": (b + "attn.qkv.weight", lambda w: w.T.reshape(e, 3, n, h), lambda w: w.reshape(e, -1).T),
        "blocks/bqkv": (b + "attn.qkv.bias", lambda w: w.reshape(3, n, h), lambda w: w.reshape(-1)),
        "blocks/wo": (b + "attn.proj.weight", lambda w: w.T.reshape(n, h, e), lambda w: w.reshape(n * h, e).T),
        "blocks/bo": (b + "attn.proj.bias", *same),
        "blocks/fc1_w": (b + "mlp.fc1.weight", *t), "blocks/fc1_b": (b + "mlp.fc1.bias", *same),
        "blocks/fc2_w": (b + "mlp.fc2.weight", *t), "blocks/fc2_b": (b + "mlp.fc2.bias", *same),
        "merger/norm_w": (prefix + "merger.ln_q.weight", *same), "merger/norm_b": (prefix + "merger.ln_q.bias", *same),
        "merger/fc1_w": (prefix + "merger.mlp.0.weight", *t), "merger/fc1_b": (prefix + "merger.mlp.0.bias", *same),
        "merger/fc2_w": (prefix + "merger.mlp.2.weight", *t), "merger/fc2_b": (prefix + "merger.mlp.2.bias", *same),
    }


def vision_inputs(grid_thw, merge: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """Host-side inputs of `vision_forward` for images of `grid_thw` [[t, h, w], ...] (in patches): each patch's
    (row, column) [N, 2] in merge-window order, and its attention segment [N] (one per frame of each image, from 1)."""
    positions, segments, seg = [], [], 0
    for t, h, w in np.asarray(grid_thw).tolist():
        rows, cols = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
        order = (h // merge, merge, w // merge, merge)
        pos = np.stack([rows.reshape(order).transpose(0, 2, 1, 3).ravel(),
                        cols.reshape(order).transpose(0, 2, 1, 3).ravel()], -1)
        for _ in range(t):
            seg += 1
            positions.append(pos)
            segments.append(np.full(h * w, seg, np.int32))
    return np.concatenate(positions).astype(np.int32), np.concatenate(segments)


class Images(NamedTuple):
    """The images of a batch, as the vision tower takes them (`image_batch`): patches in merge-window order, image
    after image in the order their `<|image_pad|>` runs appear in the batch (row by row). With a leading row
    dimension [B, N, ...] instead, row b's patches are its own images' (a training batch, split over devices with
    its rows), and its features fill its own `<|image_pad|>` positions."""

    pixels: Any  # [N, C * T * P * P] float, N a multiple of merge^2 (padding patches at the end)
    patch_positions: Any  # [N, 2] int32: each patch's (row, column) in its image
    patch_segments: Any  # [N] int32: one segment per image frame, from 1; 0 on padding patches
    grid_thw: Any = None  # [I, 3] host ints: each image's (frames, rows, columns) in patches


def image_batch(pixels, grid_thw, merge: int = 2, pad_to: int | None = None) -> Images:
    """`Images` of preprocessed patches (`qwen2_vl_images.preprocess`) and their grids; `pad_to` patches (a static
    size for a jitted step, a multiple of merge^2) with padding patches that attend only to each other and whose
    features follow the real ones, unread."""
    grid = np.asarray(grid_thw, np.int64).reshape(-1, 3)
    positions, segments = vision_inputs(grid, merge) if len(grid) else (np.zeros((0, 2), np.int32),
                                                                        np.zeros(0, np.int32))
    pixels = np.asarray(pixels, np.float32)
    n = len(pixels)
    if len(positions) != n:
        raise ValueError(f"{n} patches, but the grids {grid.tolist()} make {len(positions)}")
    size = n if pad_to is None else pad_to
    if size < n or size % merge ** 2:
        raise ValueError(f"pad_to={pad_to}: must be a multiple of {merge ** 2} and at least the {n} patches")
    extra = size - n
    return Images(np.pad(pixels, ((0, extra), (0, 0))), np.pad(positions, ((0, extra), (0, 0))),
                  np.pad(segments, (0, extra)), grid)


def image_features(params: Params, vc: VisionConfig, images: Images) -> jnp.ndarray:
    """The vision tower on a batch's images: features [N / merge^2, D], one per `<|image_pad|>` token (per-row
    images: [B, N / merge^2, D])."""
    if jnp.ndim(images.pixels) == 3:
        return jax.vmap(lambda x, pos, seg: vision_forward(params, vc, x, pos, seg))(
            images.pixels, images.patch_positions, images.patch_segments)
    return vision_forward(params, vc, images.pixels, images.patch_positions, images.patch_segments)


def scatter_image_features(x, tokens, features, image_token_id: int):
    """Token embeddings x [B, T, D] with the `<|image_pad|>` positions replaced by the image features [M, D], in
    row-major order (HF's `masked_scatter`), or by each row's own features [B, M, D]. Features past the last image
    token are not read."""
    is_image = tokens == image_token_id
    if features.ndim == 3:
        index = jnp.cumsum(is_image, axis=1) - 1
        picked = jnp.take_along_axis(features, jnp.clip(index, 0, features.shape[1] - 1)[..., None], axis=1)
    else:
        index = jnp.cumsum(is_image.reshape(-1)).reshape(tokens.shape) - 1
        picked = jnp.take(features, jnp.clip(index, 0, features.shape[0] - 1), axis=0)
    return jnp.where(is_image[..., None], picked.astype(x.dtype), x)


def expand_image_pads(ids, image_token_id: int, grid_thw, merge: int = 2) -> np.ndarray:
    """How many times each token of a rendered prompt repeats so that image i's one `<|image_pad|>` becomes its
    t * (h / merge) * (w / merge) feature tokens: `np.repeat(array, counts)` expands the ids and every per-token
    mask alike."""
    ids = np.asarray(ids)
    grid = np.asarray(grid_thw, np.int64).reshape(-1, 3)
    at = np.flatnonzero(ids == image_token_id)
    if len(at) != len(grid):
        raise ValueError(f"{len(at)} image placeholders for {len(grid)} images")
    counts = np.ones(len(ids), np.int64)
    counts[at] = grid[:, 0] * (grid[:, 1] // merge) * (grid[:, 2] // merge)
    return counts


def check_image_tokens(tokens, image_token_id: int, images: Images, merge: int = 2) -> None:
    """Host check that the `<|image_pad|>` tokens of a batch and its images agree in number."""
    want = int(sum(t * (h // merge) * (w // merge) for t, h, w in np.asarray(images.grid_thw).reshape(-1, 3)))
    have = int((np.asarray(tokens) == image_token_id).sum())
    if want != have:
        raise ValueError(f"the batch has {have} <|image_pad|> tokens, but its images make {want} features")


def _rope_2d(vc: VisionConfig, positions):
    """cos, sin [1, N, H / 2] for `rope.apply_rope`: the first quarter of the frequencies turns by the patch's row,
    the second by its column."""
    quarter = vc.head_dim // 4
    inv = 1.0 / (vc.rope_theta ** (jnp.arange(0, 2 * quarter, 2, dtype=jnp.float32) / (2 * quarter)))
    freqs = positions[:, :, None].astype(jnp.float32) * inv  # [N, 2, H/4]
    angles = freqs.reshape(1, freqs.shape[0], -1)  # rows' then columns' frequencies
    return jnp.cos(angles), jnp.sin(angles)


def vision_forward(params: Params, vc: VisionConfig, pixels, positions, segment_ids) -> jnp.ndarray:
    """pixels [N, C*T*P*P] (positions, segment_ids from `vision_inputs`) -> image features [N / merge^2, D]."""
    dt = jnp.dtype(vc.compute_dtype)
    x = jnp.einsum("np,pe->ne", pixels.astype(dt), params["patch"].astype(dt))
    cos, sin = _rope_2d(vc, positions)
    seg = segment_ids[None]

    def block(x, p):
        p = jax.tree.map(lambda a: a.astype(dt), p)
        h = layer_norm(x, p["norm1_w"], p["norm1_b"], 1e-6)
        qkv = jnp.einsum("ne,eskh->nskh", h, p["wqkv"]) + p["bqkv"]  # [N, 3, heads, H]
        q, k, v = apply_rope(qkv[None, :, 0], cos, sin), apply_rope(qkv[None, :, 1], cos, sin), qkv[None, :, 2]
        a = attention(q, k, v, seg, seg, impl="reference", causal=False)[0]
        x = x + jnp.einsum("nkh,khe->ne", a, p["wo"]) + p["bo"]
        h = layer_norm(x, p["norm2_w"], p["norm2_b"], 1e-6)
        u = jnp.einsum("ne,ef->nf", h, p["fc1_w"]) + p["fc1_b"]
        u = quick_gelu(u)
        return x + jnp.einsum("nf,fe->ne", u, p["fc2_w"]) + p["fc2_b"], None

    x, _ = jax.lax.scan(block, x, params["blocks"])
    m = jax.tree.map(lambda a: a.astype(dt), params["merger"])
    x = layer_norm(x, m["norm_w"], m["norm_b"], 1e-6).reshape(-1, vc.embed_dim * vc.spatial_merge_size ** 2)
    x = jax.nn.gelu(jnp.einsum("nm,mk->nk", x, m["fc1_w"]) + m["fc1_b"], approximate=False)
    return jnp.einsum("nk,kd->nd", x, m["fc2_w"]) + m["fc2_b"]


def to_ours(hf_tensors: dict[str, Any], vc: VisionConfig, prefix: str = "visual.") -> Params:
    """Vision params from HF tensors (name -> numpy array)."""
    out: dict = {"blocks": {}, "merger": {}}
    for leaf, (template, to_ours_fn, _) in vision_hf_layout(vc, prefix).items():
        if leaf.startswith("blocks/"):
            out["blocks"][leaf[7:]] = np.stack([to_ours_fn(np.asarray(hf_tensors[template.format(i=i)]))
                                                for i in range(vc.depth)])
        elif leaf.startswith("merger/"):
            out["merger"][leaf[7:]] = to_ours_fn(np.asarray(hf_tensors[template]))
        else:
            out[leaf] = to_ours_fn(np.asarray(hf_tensors[template]))
    return out


def mrope_positions(tokens, image_token_id: int, grid_thw, merge: int = 2, attention_mask=None):
    """Qwen2-VL's (temporal, height, width) positions [3, B, T] of a batch of token ids (HF `get_rope_index`): text
    tokens count up on all three rows; the `<|image_pad|>` run of an image of llm grid (t, h / merge, w / merge)
    takes start + (t, row, column), and the text after it starts at start + max(h, w) / merge. Padding (mask 0) gets
    position 0 and is skipped. Also returns each row's delta, max position + 1 - its length, which continues the
    positions of generated tokens. `grid_thw` lists the images of the whole batch in order."""
    tokens = np.asarray(tokens)
    b, t = tokens.shape
    mask = np.ones((b, t), bool) if attention_mask is None else np.asarray(attention_mask).astype(bool)
    images = iter(np.asarray(grid_thw).reshape(-1, 3).tolist()) if grid_thw is not None else iter(())
    out = np.zeros((3, b, t), np.int64)
    deltas = np.zeros(b, np.int64)
    for r in range(b):
        ids = tokens[r][mask[r]]
        pieces, pos, i = [], 0, 0
        while i < len(ids):
            j = i
            is_image = ids[i] == image_token_id
            while j < len(ids) and (ids[j] == image_token_id) == is_image:
                j += 1
            if not is_image:
                pieces.append(np.broadcast_to(np.arange(pos, pos + j - i), (3, j - i)))
                pos += j - i
            else:
                gt, gh, gw = next(images)
                lt, lh, lw = gt, gh // merge, gw // merge
                if lt * lh * lw != j - i:
                    raise ValueError(f"row {r}: an image run of {j - i} tokens does not match its grid {gt, gh, gw} "
                                     f"({lt * lh * lw} tokens after the {merge} x {merge} merge)")
                tt, hh, ww = np.meshgrid(np.arange(lt), np.arange(lh), np.arange(lw), indexing="ij")
                pieces.append(np.stack([tt.ravel(), hh.ravel(), ww.ravel()]) + pos)
                pos += max(gh, gw) // merge
            i = j
        row = np.concatenate(pieces, axis=1) if pieces else np.zeros((3, 0), np.int64)
        out[:, r, mask[r]] = row
        deltas[r] = (row.max() + 1 if row.size else 0) - len(ids)
    return out, deltas


def alternate_hf_name(name: str) -> str:
    """A weight's name in the other Qwen2-VL checkpoint naming: the published (and transformers >= 5 saved)
    `model.layers.*` / `visual.*` <-> the `model.language_model.*` / `model.visual.*` of transformers 4.52-4.57."""
    for a, b in (("model.language_model.", "model."), ("model.visual.", "visual.")):
        if name.startswith(a):
            return b + name[len(a):]
    for a, b in (("visual.", "model.visual."), ("model.", "model.language_model.")):
        if name.startswith(a):
            return b + name[len(a):]
    return name
