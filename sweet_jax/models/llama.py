"""Pure-functional Llama-3 / 3.1 / 3.2 over a parameter pytree; with `cfg.qkv_bias`, the same decoder is Qwen2.

Parameter layout (leading `L` = stacked layers, applied with `lax.scan`):

    embed       [V, D]              ("vocab", "embed")
    layers/
      attn_norm [L, D]              ("layers", "norm")
      wq        [L, D, N, H]        ("layers", "embed", "q_heads", "head_dim")
      wk, wv    [L, D, K, H]        ("layers", "embed", "kv_heads", "head_dim")
      wo        [L, N, H, D]        ("layers", "q_heads", "head_dim", "embed")
      bq        [L, N, H]           ("layers", "q_heads", "head_dim")      -- qkv_bias only (Qwen2)
      bk, bv    [L, K, H]           ("layers", "kv_heads", "head_dim")     -- qkv_bias only
      mlp_norm  [L, D]              ("layers", "norm")
      w_gate    [L, D, F]           ("layers", "embed", "mlp")
      w_up      [L, D, F]           ("layers", "embed", "mlp")
      w_down    [L, F, D]           ("layers", "mlp", "embed")
    final_norm  [D]                 ("norm",)
    lm_head     [D, V]              ("embed", "vocab")   -- absent when tie_word_embeddings or score_head
    score       [D]                 ("embed",)           -- score_head only: a scalar value per token
    lora/layers/<weight>/{a, b}                          -- `cfg.lora` only: low-rank adapters (`models.lora`), f32

Heads keep HF's half-split RoPE layout, so HF q/k weights load without permutation.
"""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from sweet_jax.models import lora_layers, qwen2_vl, random_draws
from sweet_jax.models.attention import attention, cached_attention, prefix_shared_attention
from sweet_jax.models.paged_attention import paged_decode_attention
from sweet_jax.models.model_configs import LlamaConfig
from sweet_jax.models.rope import apply_rope, rope_tables
from sweet_jax.parallel.sharding import constrain

Params = dict


def param_logical_axes(cfg: LlamaConfig) -> Params:
    """Pytree (matching `init_params`) of logical axis names for every weight."""
    axes = {
        "embed": ("vocab", "embed"),
        "layers": {
            "attn_norm": ("layers", "norm"),
            "wq": ("layers", "embed", "q_heads", "head_dim"),
            "wk": ("layers", "embed", "kv_heads", "head_dim"),
            "wv": ("layers", "embed", "kv_heads", "head_dim"),
            "wo": ("layers", "q_heads", "head_dim", "embed"),
            "mlp_norm": ("layers", "norm"),
            "w_gate": ("layers", "embed", "mlp"),
            "w_up": ("layers", "embed", "mlp"),
            "w_down": ("layers", "mlp", "embed"),
        },
        "final_norm": ("norm",),
    }
    if cfg.qkv_bias:
        axes["layers"].update(bq=("layers", "q_heads", "head_dim"), bk=("layers", "kv_heads", "head_dim"),
                              bv=("layers", "kv_heads", "head_dim"))
    if cfg.score_head:
        axes["score"] = ("embed",)
    elif not cfg.tie_word_embeddings:
        axes["lm_head"] = ("embed", "vocab")
    if _vision(cfg) is not None:
        axes["visual"] = qwen2_vl.vision_param_logical_axes(cfg.vision)
    if cfg.lora is not None:
        axes["lora"] = lora_layers.adapter_axes_of(axes["layers"], cfg.lora)
    return axes


def param_shapes(cfg: LlamaConfig) -> Params:
    """Pytree of shapes (tuples), matching `param_logical_axes`."""
    d, f, v, l = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.num_layers
    n, k, h = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    shapes = {
        "embed": (v, d),
        "layers": {
            "attn_norm": (l, d),
            "wq": (l, d, n, h),
            "wk": (l, d, k, h),
            "wv": (l, d, k, h),
            "wo": (l, n, h, d),
            "mlp_norm": (l, d),
            "w_gate": (l, d, f),
            "w_up": (l, d, f),
            "w_down": (l, f, d),
        },
        "final_norm": (d,),
    }
    if cfg.qkv_bias:
        shapes["layers"].update(bq=(l, n, h), bk=(l, k, h), bv=(l, k, h))
    if cfg.score_head:
        shapes["score"] = (d,)
    elif not cfg.tie_word_embeddings:
        shapes["lm_head"] = (d, v)
    if _vision(cfg) is not None:
        shapes["visual"] = qwen2_vl.vision_param_shapes(cfg.vision)
    if cfg.lora is not None:
        shapes["lora"] = lora_layers.adapter_shapes_of(shapes["layers"], cfg.lora)
    return shapes


def _vision(cfg: LlamaConfig):
    """The vision tower's config (`Qwen2VLConfig.vision`), or None for a text-only model."""
    return getattr(cfg, "vision", None)


def abstract_params(cfg: LlamaConfig, shardings=None) -> Params:
    """Pytree of `jax.ShapeDtypeStruct` (optionally with shardings), for AOT compilation and Orbax restores."""
    shapes = param_shapes(cfg)
    dtypes = {k: jnp.dtype(lora_layers.DTYPE if k == "lora" else cfg.param_dtype) for k in shapes}
    if shardings is None:
        return {k: jax.tree.map(lambda s: jax.ShapeDtypeStruct(s, dtypes[k]), v, is_leaf=_is_shape)
                for k, v in shapes.items()}
    return {k: jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s, dtypes[k], sharding=sh), v, shardings[k],
                            is_leaf=_is_shape) for k, v in shapes.items()}


def _is_shape(x) -> bool:
    return isinstance(x, tuple) and all(isinstance(i, int) for i in x)


def init_params(cfg: LlamaConfig, key: jax.Array, std: float = 0.02) -> Params:
    """Random params: normal(0, std) matrices, unit norms (and zero norm biases), in `cfg.param_dtype`; with
    `cfg.lora`, fresh adapters too (`lora_layers.init_adapters_of`: the model starts as its base, whose weights do
    not depend on the adapters)."""
    if cfg.lora is not None:
        return {**init_params(cfg.replace(lora=None), key, std),
                "lora": lora_layers.init_adapters_of(param_shapes(cfg)["lora"], jax.random.fold_in(key, 1))}
    shapes = param_shapes(cfg)
    leaves, treedef = jax.tree.flatten(shapes, is_leaf=_is_shape)
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(shapes, is_leaf=_is_shape)[0]]
    keys = jax.random.split(key, len(leaves))
    dtype = jnp.dtype(cfg.param_dtype)
    out = []
    for path, shape, k in zip(paths, leaves, keys):
        if "norm" in path:
            out.append(random_draws.constant(shape, dtype, 0.0 if path.endswith("_b']") else 1.0, key))
        else:
            out.append(random_draws.normal(k, shape, std, dtype))
    return jax.tree.unflatten(treedef, out)


def rms_norm(x: jnp.ndarray, weight: jnp.ndarray, eps: float) -> jnp.ndarray:
    """HF LlamaRMSNorm: normalise in f32, cast back to the input dtype, then scale."""
    xf = x.astype(jnp.float32)
    xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return weight.astype(x.dtype) * xf.astype(x.dtype)


@jax.custom_vjp
def swiglu(g: jnp.ndarray, u: jnp.ndarray) -> jnp.ndarray:
    """silu(g) * u, the gate of the Llama MLP. Its backward keeps only g and u and recomputes the sigmoid in f32:
    autodiff of `jax.nn.silu(g) * u` keeps four [T, F] intermediates per layer, the largest activations saved for
    the backward pass, and its gradient fusion then reads all of them."""
    return jax.nn.silu(g) * u


def _swiglu_fwd(g, u):
    return swiglu(g, u), (g, u)


def _swiglu_bwd(res, dm):
    g, u = res
    gf, uf, dmf = g.astype(jnp.float32), u.astype(jnp.float32), dm.astype(jnp.float32)
    s = jax.nn.sigmoid(gf)
    dg = dmf * uf * s * (1 + gf * (1 - s))  # d silu(g) / dg = s + g s (1 - s)
    return dg.astype(g.dtype), (dmf * gf * s).astype(u.dtype)


swiglu.defvjp(_swiglu_fwd, _swiglu_bwd)


_REMAT = {
    "full": None,  # jax.checkpoint's default: save nothing but the layer inputs
    "dots": jax.checkpoint_policies.checkpoint_dots,
    "dots_no_batch": jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
    "qkv_proj": jax.checkpoint_policies.save_only_these_names("q_proj", "k_proj", "v_proj"),
}


def _decoder_layer(cfg: LlamaConfig, x, layer: Params, cos, sin, segment_ids, kv=None, branch_ids=None, *,
                   window: int | None = None, prefix=None):
    """One layer. With `kv` = (k_cache [B,K,H,S], v_cache [B,K,S,H], kv_segment_ids [B,S], index, row), the new
    keys and values are written into the cache at `index` (a slot for every row, or one per row [B]) and the
    queries attend over the cache (its first `window` slots when given); returns (x, (k_cache, v_cache)). With
    `prefix` = (k [1,K,H,P], v [1,K,P,H], segment_ids [1,P]) instead, the rows attend over that one shared prefix,
    never copied, and then causally over their own tokens; returns x."""
    dt = jnp.dtype(cfg.compute_dtype)
    layer = dict(layer)
    dropout_key = layer.pop("lora_dropout_key", None)  # training with adapter dropout (`_with_adapters`)
    w = jax.tree.map(lambda p: p.astype(dt), layer)
    adapters = w.get("lora", {})

    def adapted(y, inputs, name):  # a projection's output plus its adapter's term, when it has one
        if name not in adapters:
            return y
        if dropout_key is not None:
            key = jax.random.fold_in(dropout_key, sorted(adapters).index(name))  # a mask of its own per projection
            inputs = lora_layers.dropout(inputs, cfg.lora.dropout, key)
        return y + lora_layers.delta(inputs, adapters[name], cfg.lora.scale)

    h = rms_norm(x, w["attn_norm"], cfg.rms_norm_eps)
    q, k, v = (adapted(jnp.einsum("btd,dkh->btkh", h, w[name]), h, name) for name in ("wq", "wk", "wv"))
    if cfg.qkv_bias:
        q, k, v = q + w["bq"], k + w["bk"], v + w["bv"]
    q, k, v = (checkpoint_name(x, name) for x, name in ((q, "q_proj"), (k, "k_proj"), (v, "v_proj")))
    q = constrain(apply_rope(q, cos, sin), ("batch", "seq", "q_heads", "head_dim"))
    k = constrain(apply_rope(k, cos, sin), ("batch", "seq", "kv_heads", "head_dim"))
    v = constrain(v, ("batch", "seq", "kv_heads", "head_dim"))
    with jax.named_scope("attention"):  # the ops' names say so (`bench/profile_step.py` groups by them)
        a, kv_out = _attend_layer(cfg, q, k, v, segment_ids, kv, branch_ids, window, prefix)
    if kv is None and prefix is None:
        x = x + adapted(jnp.einsum("btnh,nhd->btd", a, w["wo"]), a, "wo")
    else:  # flattened heads: left to choose, XLA:CPU re-laid wo out at every decode step to match the activation
        b, t, n, hd = a.shape
        x = x + adapted(jnp.einsum("btx,xd->btd", a.reshape(b, t, n * hd), w["wo"].reshape(n * hd, -1)), a, "wo")
    x = constrain(x, ("batch", "act_seq", "act_embed"))
    h = rms_norm(x, w["mlp_norm"], cfg.rms_norm_eps)
    g = adapted(jnp.einsum("btd,df->btf", h, w["w_gate"]), h, "w_gate")
    u = adapted(jnp.einsum("btd,df->btf", h, w["w_up"]), h, "w_up")
    m = constrain(swiglu(g, u), ("batch", "seq", "mlp"))
    x = x + adapted(jnp.einsum("btf,fd->btd", m, w["w_down"]), m, "w_down")
    x = constrain(x, ("batch", "act_seq", "act_embed"))
    return x if kv is None else (x, kv_out)


def _attend_layer(cfg: LlamaConfig, q, k, v, segment_ids, kv, branch_ids, window, prefix):
    """The attention of `_decoder_layer` -> (a [B, T, N, H], the updated (k_cache, v_cache) or None)."""
    if prefix is not None:
        return prefix_shared_attention(q, *prefix, k, v, segment_ids), None
    if kv is None:
        return attention(q, k, v, segment_ids, segment_ids, impl=cfg.attention_impl, q_branch_ids=branch_ids,
                         kv_branch_ids=branch_ids), None
    dt = jnp.dtype(cfg.compute_dtype)
    if isinstance(kv, PagedKV):
        with jax.named_scope("kv_write"):
            if kv.kernel:  # [B, T, K, H] into [K, P, page, H]
                k_pool = kv.k.at[:, kv.write_pages, kv.write_offsets].set(k.transpose(2, 0, 1, 3).astype(kv.k.dtype))
                v_pool = kv.v.at[:, kv.write_pages, kv.write_offsets].set(v.transpose(2, 0, 1, 3).astype(kv.v.dtype))
            else:  # into keys [P, K, H, page], values [P, K, page, H]
                k_pool = kv.k.at[kv.write_pages, :, :, kv.write_offsets].set(k.astype(kv.k.dtype))
                v_pool = kv.v.at[kv.write_pages, :, kv.write_offsets].set(v.astype(kv.v.dtype))
        if kv.kernel and q.shape[1] == 1 and jnp.ndim(kv.index):  # decoding: the kernel reads live pages only
            return paged_decode_attention(q, k_pool, v_pool, kv.read_pages, kv.index + 1), (k_pool, v_pool)
        kc, vc = paged_rows(k_pool, v_pool, kv.read_pages, kv.kv_segment_ids.shape[1], kernel=kv.kernel)
        a = cached_attention(q, kc.astype(dt), vc.astype(dt), segment_ids, kv.kv_segment_ids, q_offset=kv.index,
                             impl=cfg.attention_impl)
        return a, (k_pool, v_pool)
    k_cache, v_cache, kv_segment_ids, index, row = kv
    with jax.named_scope("kv_write"):
        k_cache = _write_cache(k_cache, k.transpose(0, 2, 3, 1).astype(k_cache.dtype), index, row, axis=3)
        v_cache = _write_cache(v_cache, v.swapaxes(1, 2).astype(v_cache.dtype), index, row)
    span = v_cache.shape[2] if window is None else min(window, v_cache.shape[2])
    # tokens that fill the whole window from slot 0 (a prefix's prefill) attend to themselves only: read from the
    # fresh keys and values, not transposed back out of the cache's layouts
    fresh = row is None and isinstance(index, int) and index == 0 and span == q.shape[1]
    if fresh:
        a = attention(q, k, v, segment_ids, kv_segment_ids[:, :span], impl=cfg.attention_impl)
    elif row is not None:  # one row of a cache of many: read its first `span` slots only
        kc = jax.lax.dynamic_slice_in_dim(k_cache, row, 1, axis=0)[..., :span]
        vc = jax.lax.dynamic_slice_in_dim(v_cache, row, 1, axis=0)[:, :, :span]
        kv_segment_ids = kv_segment_ids[:, :span]
    elif span < v_cache.shape[2]:  # the slots in use: attention reads no more
        kc, vc, kv_segment_ids = k_cache[..., :span], v_cache[:, :, :span], kv_segment_ids[:, :span]
    else:
        kc, vc = k_cache, v_cache
    if not fresh:
        a = cached_attention(q, kc.astype(dt), vc.astype(dt), segment_ids, kv_segment_ids, q_offset=index,
                             impl=cfg.attention_impl)
    return a, (k_cache, v_cache)


def _write_cache(cache, new, index, row=None, axis: int = 2):
    """new [B, ..., T, ...] into cache [B, ..., S, ...] (positions on `axis`: [B, K, S, H] values, [B, K, H, S]
    keys) at slot `index` (shared) or at index[b] for row b; with `row`, new [1, ...] goes into that row of the cache
    at `index`."""
    if row is not None:
        start = [row] + [0] * (cache.ndim - 1)
        start[axis] = index
        return jax.lax.dynamic_update_slice(cache, new, start)
    if jnp.ndim(index) == 0:
        return jax.lax.dynamic_update_slice_in_dim(cache, new, index, axis=axis)
    return jax.vmap(lambda c, x, i: jax.lax.dynamic_update_slice_in_dim(c, x, i, axis=axis - 1))(cache, new, index)


def _check_inputs(cfg: LlamaConfig, tokens, positions, segment_ids, branch_ids=None, images=None):
    if tokens.ndim != 2:
        raise ValueError(f"tokens must be int [B, T], got shape {tokens.shape}")
    b, t = tokens.shape
    if images is not None:
        if _vision(cfg) is None:
            raise ValueError(f"images given to a model without a vision tower ({type(cfg).__name__})")
        if positions is None:  # M-RoPE positions from the concrete tokens and image grids
            try:
                positions = qwen2_vl.mrope_positions(tokens, cfg.image_token_id, images.grid_thw,
                                                     cfg.vision.spatial_merge_size, segment_ids)[0]
            except (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError):
                raise ValueError("under jit, pass the M-RoPE positions of a batch with images "
                                 "(models.qwen2_vl.mrope_positions)") from None
            positions = jnp.asarray(positions, jnp.int32)
    if positions is None:
        positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    if segment_ids is None:
        segment_ids = jnp.ones((b, t), jnp.int32)
    mrope = getattr(cfg, "mrope_section", None) and positions.ndim == 3
    if positions.shape != ((3, b, t) if mrope else (b, t)):
        raise ValueError(f"positions must have the tokens' shape {(b, t)}"
                         f"{' or be M-RoPE positions ' + str((3, b, t)) if getattr(cfg, 'mrope_section', None) else ''}"
                         f", got {positions.shape}")
    for name, arr in (("segment_ids", segment_ids), ("branch_ids", branch_ids)):
        if arr is not None and arr.shape != (b, t):
            raise ValueError(f"{name} must have the tokens' shape {(b, t)}, got {arr.shape}")
    return positions, segment_ids


def embed_inputs(params: Params, cfg: LlamaConfig, tokens, images=None) -> jnp.ndarray:
    """Input embeddings [B, T, D] in `cfg.compute_dtype`: the token embeddings, with the image features of `images`
    (`qwen2_vl.Images`) in the `<|image_pad|>` positions."""
    # Gather rows from the table all-gathered over its hidden dimension (as FSDP gathers every weight before use):
    # a lookup into a hidden-sharded table has no efficient partitioning.
    table = constrain(params["embed"], ("vocab", "act_embed"))
    x = jnp.take(table, tokens, axis=0).astype(cfg.compute_dtype)
    if images is not None:
        x = _with_images(params, cfg, x, tokens, images)
    return constrain(x, ("batch", "act_seq", "act_embed"))


def _with_images(params: Params, cfg: LlamaConfig, x, tokens, images):
    features = qwen2_vl.image_features(params["visual"], cfg.vision, images)
    return qwen2_vl.scatter_image_features(x, tokens, features, cfg.image_token_id)


def at_model_precision(fn):
    """Run `fn(params, cfg, ...)` under the config's matmul precision (`LlamaConfig.precision`): jax reads it when the
    products are traced, so the forward passes of training and inference multiply at the same precision."""
    @functools.wraps(fn)
    def wrapped(params, cfg, *args, **kwargs):
        with jax.default_matmul_precision(cfg.precision):
            return fn(params, cfg, *args, **kwargs)
    return wrapped


@at_model_precision
def forward_hidden(params: Params, cfg: LlamaConfig, tokens, positions=None, segment_ids=None,
                   branch_ids=None, images=None, dropout_key=None) -> jnp.ndarray:
    """Final (post-norm) hidden states [B, T, D] in `cfg.compute_dtype`.

    positions: int [B, T] RoPE positions (default 0..T-1). For a left-padded batch pass the per-row positions.
    segment_ids: int [B, T]; tokens attend only within their segment (pads = 0, packed docs = 1, 2, ...).
    branch_ids: int [B, T] (optional) for prefix-shared rows such as [history, chosen, rejected] = 0, 1, 2: a branch
    k > 0 sees the shared tokens (0) and itself, never another branch (`models.attention`).
    images: a vision-language model's `qwen2_vl.Images`, whose features fill the `<|image_pad|>` positions; its
    positions are then M-RoPE positions [3, B, T] (`qwen2_vl.mrope_positions`, worked out here when not given and
    the tokens are concrete). Without images, [B, T] positions are plain RoPE, equal to M-RoPE on equal rows.
    Stacked layers (training) run under `lax.scan`; the inference layout (`unstack_layers`) runs them in turn.
    dropout_key: training with adapters (`cfg.lora`) whose dropout is on: the key of this step's dropout masks.
    """
    positions, segment_ids = _check_inputs(cfg, tokens, positions, segment_ids, branch_ids, images)
    dt = jnp.dtype(cfg.compute_dtype)
    x = embed_inputs(params, cfg, tokens, images)
    cos, sin = rope_tables(cfg, positions)

    layer_fn = functools.partial(_decoder_layer, cfg)
    if cfg.remat_policy != "none":
        layer_fn = jax.checkpoint(layer_fn, policy=_REMAT[cfg.remat_policy], prevent_cse=False)

    layers = _with_adapters(params)
    if dropout_key is not None and cfg.lora is not None and cfg.lora.dropout > 0 and "lora" in params:
        if isinstance(layers, (tuple, list)):
            raise ValueError("adapter dropout is for training, on the stacked layers")
        layers = {**layers, "lora_dropout_key": jax.random.split(dropout_key, cfg.num_layers)}
    if isinstance(layers, (tuple, list)):  # the inference layout (`unstack_layers`)
        for layer in layers:
            x = layer_fn(x, layer, cos, sin, segment_ids, None, branch_ids)
    else:
        x, _ = jax.lax.scan(lambda carry, layer: (layer_fn(carry, layer, cos, sin, segment_ids, None, branch_ids),
                                                  None), x, layers)
    return rms_norm(x, params["final_norm"].astype(dt), cfg.rms_norm_eps)


def _with_adapters(params: Params):
    """The stacked layers with each layer's adapters (`cfg.lora`) beside its weights, under "lora"; the layers as
    they are without adapters, or in the inference layout (which carries them per layer already)."""
    if "lora" not in params or isinstance(params["layers"], (tuple, list)):
        return params["layers"]
    return {**params["layers"], "lora": params["lora"]["layers"]}


def unstack_layers(params: Params) -> Params:
    """The inference layout: `layers` as a tuple of per-layer dicts instead of stacked [L, ...] arrays.

    Training scans over the stacked layers. Decoding runs one token through every layer at each step, and slicing a
    layer out of the stack copies its weights at every step (XLA:CPU measured: the copies took longer than the
    matmuls). Unstacked, each layer is its own array and nothing is copied. This makes new arrays: drop the stacked
    params afterwards to keep one copy in memory. Params already unstacked are returned as they are. Adapters go
    with their layers (each layer dict's "lora"); merge them first (`models.lora.merged`) to decode at the base's
    speed."""
    layers = _with_adapters(params)
    if isinstance(layers, (tuple, list)):
        return params
    n = jax.tree.leaves(layers)[0].shape[0]
    return {**lora_layers.base_of(params), "layers": tuple(jax.tree.map(lambda x, i=i: x[i], layers) for i in range(n))}


def init_cache(cfg: LlamaConfig, batch: int, size: int, dtype=None) -> dict:
    """An empty KV cache for `batch` rows of `size` positions: per-layer tuples of keys k [B, K, H, S] and values
    v [B, K, S, H], and segment_ids [B, S] (0 = empty, never attended to by a real token). These are the layouts
    that decode attention's two products read as plain matrix products, without transposes or packing (keys with
    their positions last: XLA:CPU took twice as long over [B, K, S, H] keys). Every array has the batch first;
    `cache_logical_axes` names the dimensions."""
    k_shape = (batch, cfg.num_kv_heads, cfg.head_dim, size)
    v_shape = (batch, cfg.num_kv_heads, size, cfg.head_dim)
    dtype = jnp.dtype(dtype or cfg.compute_dtype)
    layers = range(cfg.num_layers)
    return {"k": tuple(jnp.zeros(k_shape, dtype) for _ in layers),
            "v": tuple(jnp.zeros(v_shape, dtype) for _ in layers), "segment_ids": jnp.zeros((batch, size), jnp.int32)}


def init_paged_cache(cfg: LlamaConfig, slots: int, pages: int, page_size: int, positions: int, dtype=None,
                     kernel: bool = False) -> dict:
    """An empty paged KV cache: per layer, a pool of `pages` pages of `page_size` positions, keys k [P, K, H, page]
    and values v [P, K, page, H] (the layouts of `init_cache`, a page in place of a row), segment_ids [P, page], and
    a page table `pages` [slots, positions / page_size] naming the page that holds each slot's positions. Page 0 is
    scratch: every table entry starts there, and padding and idle rows write there; no live position is ever read
    from it. With `kernel`, the pools are `k_pages` and `v_pages` [K, P, page, H] instead, the layout of the paged
    decode kernel (`paged_attention.paged_decode_attention`). `cache_logical_axes(cfg, paged=True, kernel=...)` names
    the dimensions."""
    if positions % page_size:
        raise ValueError(f"{positions} cache positions are not a whole number of {page_size}-position pages")
    k, h = cfg.num_kv_heads, cfg.head_dim
    dtype = jnp.dtype(dtype or cfg.compute_dtype)
    layers = range(cfg.num_layers)
    if kernel:
        pools = {name: tuple(jnp.zeros((k, pages, page_size, h), dtype) for _ in layers)
                 for name in ("k_pages", "v_pages")}
    else:
        pools = {"k": tuple(jnp.zeros((pages, k, h, page_size), dtype) for _ in layers),
                 "v": tuple(jnp.zeros((pages, k, page_size, h), dtype) for _ in layers)}
    return {**pools, "segment_ids": jnp.zeros((pages, page_size), jnp.int32),
            "pages": jnp.zeros((slots, positions // page_size), jnp.int32)}


def cache_logical_axes(cfg: LlamaConfig, paged: bool = False, kernel: bool = False) -> dict:
    """Logical axis names of every `init_cache` array (`parallel.sharding`): rows over the batch axes, KV heads over
    the tensor axis, like the weights that write them."""
    if paged:
        tables = {"segment_ids": ("cache_pages", None), "pages": ("batch", None)}
        if kernel:
            kv = ("kv_heads", "cache_pages", None, "head_dim")
            return {"k_pages": (kv,) * cfg.num_layers, "v_pages": (kv,) * cfg.num_layers, **tables}
        k, v = ("cache_pages", "kv_heads", "head_dim", None), ("cache_pages", "kv_heads", None, "head_dim")
        return {"k": (k,) * cfg.num_layers, "v": (v,) * cfg.num_layers, **tables}
    k, v = ("batch", "kv_heads", "head_dim", "cache_seq"), ("batch", "kv_heads", "cache_seq", "head_dim")
    return {"k": (k,) * cfg.num_layers, "v": (v,) * cfg.num_layers, "segment_ids": ("batch", "cache_seq")}


def inference_logical_axes(cfg: LlamaConfig) -> Params:
    """`param_logical_axes` for the inference layout (`unstack_layers`): a tuple of per-layer name trees (with a
    layer's adapters under its "lora")."""
    axes = param_logical_axes(cfg)
    layer = {name: names[1:] for name, names in axes["layers"].items()}
    if "lora" in axes:
        layer["lora"] = jax.tree.map(lambda names: names[1:], axes["lora"]["layers"],
                                     is_leaf=lambda x: isinstance(x, tuple))
    return {**lora_layers.base_of(axes), "layers": tuple(dict(layer) for _ in range(cfg.num_layers))}


def repeat_kv_heads(params: Params, cfg: LlamaConfig, times: int) -> tuple[Params, LlamaConfig]:
    """Each KV head repeated `times` times in a row (query head n still reads original KV head n // (N / K)): the
    same model, with K * times KV heads, so that a tensor axis wider than K can split them (and the KV cache) instead
    of replicating all of them on every shard. Either layout of `params`."""
    if times == 1:
        return params, cfg
    if cfg.num_heads % (cfg.num_kv_heads * times):
        raise ValueError(f"{cfg.num_kv_heads} KV heads x {times} does not divide {cfg.num_heads} query heads")

    def rep(layer):  # wk, wv [.., D, K, H]; bk, bv [.., K, H]
        kv = [name for name in ("wk", "wv", "bk", "bv") if name in layer]
        return {**layer, **{name: jnp.repeat(layer[name], times, axis=layer[name].ndim - 2) for name in kv}}

    layers = params["layers"]
    layers = tuple(rep(x) for x in layers) if isinstance(layers, (tuple, list)) else rep(layers)
    return {**params, "layers": layers}, cfg.replace(num_kv_heads=cfg.num_kv_heads * times)


@at_model_precision
def forward_cached(params: Params, cfg: LlamaConfig, tokens, positions, segment_ids, cache: dict, index, *,
                   window: int | None = None, row=None, images=None):
    """Run T new tokens [B, T] through the model on top of `cache`, writing their keys and values at cache slots
    index .. index + T - 1: the same slots for every row (rows left-padded to line up), or, for one token per row,
    slot index[b] for row b (a slot-based cache whose rows have their own lengths). Attention reads the first
    `window` cache slots when given (a static bound on every row's length). Returns (final hidden states [B, T, D],
    updated cache). positions: RoPE positions [B, T]; segment_ids: 1 for real tokens, 0 for pads.
    With `row` (a traced int), the cache holds many rows and the tokens [1, T] go into row `row` at `index`, read
    and written where it lies (a prompt chunk into one decode slot).
    `params` must be in the inference layout (`unstack_layers`): the layers run one after the other, each updating
    its own cache arrays in place. With `images` (a vision-language prompt), positions are its M-RoPE positions
    [3, B, T]; the tokens after it (generated ones) take plain positions shifted by `qwen2_vl.mrope_positions`'
    delta, as HF's generation does."""
    if not isinstance(params["layers"], (tuple, list)):
        raise ValueError("forward_cached takes params in the inference layout: pass llama.unstack_layers(params)")
    if "pages" in cache:
        return _forward_paged(params, cfg, tokens, positions, segment_ids, cache, index, window=window, row=row,
                              images=images)
    dt = jnp.dtype(cfg.compute_dtype)
    all_segment_ids = _write_cache(cache["segment_ids"][:, None, :, None], segment_ids.astype(jnp.int32)[:, None, :,
                                   None], index, row)[:, 0, :, 0]
    kv_segment_ids = all_segment_ids if row is None else jax.lax.dynamic_slice_in_dim(all_segment_ids, row, 1, 0)
    x, cos, sin = _cached_inputs(params, cfg, tokens, positions, images)
    ks, vs = [], []
    for layer, k_cache, v_cache in zip(params["layers"], cache["k"], cache["v"], strict=True):
        x, (k_cache, v_cache) = _decoder_layer(cfg, x, layer, cos, sin, segment_ids,
                                               (k_cache, v_cache, kv_segment_ids, index, row), window=window)
        ks.append(k_cache)
        vs.append(v_cache)
    hidden = rms_norm(x, params["final_norm"].astype(dt), cfg.rms_norm_eps)
    return hidden, {"k": tuple(ks), "v": tuple(vs), "segment_ids": all_segment_ids}


def _cached_inputs(params: Params, cfg: LlamaConfig, tokens, positions, images):
    """The embeddings [B, T, D] (with a prompt's image features) and RoPE tables of `forward_cached`'s tokens."""
    x = jnp.take(params["embed"], tokens, axis=0).astype(cfg.compute_dtype)
    if images is not None:
        x = _with_images(params, cfg, x, tokens, images)
    return constrain(x, ("batch", "act_seq", "act_embed")), *rope_tables(cfg, positions)


class PagedKV(NamedTuple):
    """One layer's paged cache as `_attend_layer` takes it: the pools, where the new tokens go (page and offset per
    token, [B, T]), the rows' page tables over the window read ([B', n]), the window's segment ids [B', span]
    and the query offset (`forward_cached`'s index)."""

    k: jnp.ndarray
    v: jnp.ndarray
    write_pages: jnp.ndarray
    write_offsets: jnp.ndarray
    read_pages: jnp.ndarray
    kv_segment_ids: jnp.ndarray
    index: jnp.ndarray
    kernel: bool  # the pools in the decode kernel's layout, [K, P, page, H]


def paged_rows(k_pool, v_pool, read_pages, span: int, kernel: bool = False):
    """The rows' keys [B', K, H, span] and values [B', K, span, H] gathered from their pages (the dense cache's
    layouts, so attention over them is the same computation as over a dense row)."""
    b, n = read_pages.shape
    if kernel:  # pools [K, P, page, H]: the rows' pages only, then their axes
        k = k_pool[:, read_pages].transpose(1, 2, 0, 4, 3)  # [B', n, K, H, page]
        v = v_pool[:, read_pages].transpose(1, 2, 0, 3, 4)  # [B', n, K, page, H]
    else:
        k, v = k_pool[read_pages], v_pool[read_pages]
    k = k.transpose(0, 2, 3, 1, 4).reshape(b, k.shape[2], k.shape[3], -1)[..., :span]
    v = v.transpose(0, 2, 1, 3, 4).reshape(b, v.shape[2], -1, v.shape[4])[:, :, :span]
    return k, v


def _forward_paged(params: Params, cfg: LlamaConfig, tokens, positions, segment_ids, cache: dict, index, *, window,
                   row, images):
    """`forward_cached` over a paged cache (`init_paged_cache`): the same rows, read and written through the page
    table. Token t of row b goes to position index[b] + t (or index + t of slot `row`); padding (segment id 0) and
    idle rows write the scratch page."""
    dt = jnp.dtype(cfg.compute_dtype)
    table, seg_pool = cache["pages"], cache["segment_ids"]
    page_size, max_pages = seg_pool.shape[1], table.shape[1]
    b, t = tokens.shape
    at = jnp.asarray(index, jnp.int32)
    at = (at[:, None] if at.ndim else at) + jnp.arange(t, dtype=jnp.int32)[None]  # [B or 1, T] positions
    rows = table if row is None else jax.lax.dynamic_slice_in_dim(table, row, 1, 0)  # [B', max_pages]
    page_of = jnp.take_along_axis(rows, jnp.minimum(at // page_size, max_pages - 1), axis=1)
    write_pages = jnp.where(segment_ids > 0, page_of, 0)
    write_offsets = jnp.broadcast_to(at % page_size, (b, t))
    seg_pool = seg_pool.at[write_pages, write_offsets].set(segment_ids.astype(jnp.int32))
    span = max_pages * page_size if window is None else min(window, max_pages * page_size)
    read_pages = rows[:, :-(-span // page_size)]
    kv_segment_ids = seg_pool[read_pages].reshape(read_pages.shape[0], -1)[:, :span]
    x, cos, sin = _cached_inputs(params, cfg, tokens, positions, images)
    kernel = "k_pages" in cache
    names = ("k_pages", "v_pages") if kernel else ("k", "v")
    ks, vs = [], []
    for layer, k_pool, v_pool in zip(params["layers"], cache[names[0]], cache[names[1]], strict=True):
        kv = PagedKV(k_pool, v_pool, write_pages, write_offsets, read_pages, kv_segment_ids, index, kernel)
        x, (k_pool, v_pool) = _decoder_layer(cfg, x, layer, cos, sin, segment_ids, kv, window=span)
        ks.append(k_pool)
        vs.append(v_pool)
    hidden = rms_norm(x, params["final_norm"].astype(dt), cfg.rms_norm_eps)
    return hidden, {names[0]: tuple(ks), names[1]: tuple(vs), "segment_ids": seg_pool, "pages": table}


@at_model_precision
def forward_on_prefix(params: Params, cfg: LlamaConfig, tokens, positions, segment_ids, prefix_cache: dict):
    """Run N continuations [N, C] (segment_ids 1 on real tokens) on top of one shared prefix, a batch-1 cache of
    `forward_cached`: every row attends over the prefix's cached keys (segment id > 0) and causally over its own
    tokens. The prefix cache is read by all rows, never copied per row. Returns the final hidden states [N, C, D]."""
    if not isinstance(params["layers"], (tuple, list)):
        raise ValueError("forward_on_prefix takes params in the inference layout: pass llama.unstack_layers(params)")
    dt = jnp.dtype(cfg.compute_dtype)
    x = jnp.take(params["embed"], tokens, axis=0).astype(dt)
    cos, sin = rope_tables(cfg, positions)
    pseg = prefix_cache["segment_ids"]
    for layer, pk, pv in zip(params["layers"], prefix_cache["k"], prefix_cache["v"], strict=True):
        x = _decoder_layer(cfg, x, layer, cos, sin, segment_ids, prefix=(pk.astype(dt), pv.astype(dt), pseg))
    return rms_norm(x, params["final_norm"].astype(dt), cfg.rms_norm_eps)


def lm_head_weight(params: Params, cfg: LlamaConfig) -> jnp.ndarray:
    """The [D, V] output projection (the transposed embedding when tied)."""
    if cfg.score_head:
        raise ValueError("this model has a score head (LlamaForSequenceClassification), not an LM head: use "
                         "`token_values` for its outputs")
    return params["embed"].T if cfg.tie_word_embeddings else params["lm_head"]


def token_values(params: Params, cfg: LlamaConfig, tokens, positions=None, segment_ids=None,
                 images=None) -> jnp.ndarray:
    """The score head's scalar at every position, float32 [B, T] (HF `LlamaForSequenceClassification` logits before
    its pooling at the last token)."""
    if not cfg.score_head:
        raise ValueError("token_values needs a model with a score head (LlamaConfig.score_head)")
    hidden = forward_hidden(params, cfg, tokens, positions, segment_ids, images=images)
    return jnp.einsum("btd,d->bt", hidden, params["score"].astype(hidden.dtype), preferred_element_type=jnp.float32)


def forward(params: Params, cfg: LlamaConfig, tokens, positions=None, segment_ids=None, images=None) -> jnp.ndarray:
    """Full logits [B, T, V] in float32 (`forward_hidden`'s arguments). For training and scoring use
    `forward_hidden` + chunked log-probs instead."""
    hidden = forward_hidden(params, cfg, tokens, positions, segment_ids, images=images)
    w = lm_head_weight(params, cfg).astype(hidden.dtype)
    return jnp.einsum("btd,dv->btv", hidden, w, preferred_element_type=jnp.float32)


# --------------------------------------------------------------------------------------------- HF layout
def hf_weight_layout(cfg: LlamaConfig) -> dict[str, tuple[str, Callable, Callable]]:
    """Where each of our weights lives in an HF checkpoint: our leaf path -> (HF name template, transform to ours,
    transform back to HF). Transforms are numpy views where possible, so that slicing an mmap reads only the needed
    bytes."""
    d, n, k, h = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    p = "model.layers.{i}."
    rules = {
        "embed": ("model.embed_tokens.weight", lambda w: w, lambda w: w),
        "final_norm": ("model.norm.weight", lambda w: w, lambda w: w),
        "layers/attn_norm": (p + "input_layernorm.weight", lambda w: w, lambda w: w),
        "layers/mlp_norm": (p + "post_attention_layernorm.weight", lambda w: w, lambda w: w),
        # HF Linear weights are [out, in].
        "layers/wq": (p + "self_attn.q_proj.weight", lambda w: w.T.reshape(d, n, h), lambda w: w.reshape(d, n * h).T),
        "layers/wk": (p + "self_attn.k_proj.weight", lambda w: w.T.reshape(d, k, h), lambda w: w.reshape(d, k * h).T),
        "layers/wv": (p + "self_attn.v_proj.weight", lambda w: w.T.reshape(d, k, h), lambda w: w.reshape(d, k * h).T),
        "layers/wo": (p + "self_attn.o_proj.weight", lambda w: w.T.reshape(n, h, d), lambda w: w.reshape(n * h, d).T),
        "layers/w_gate": (p + "mlp.gate_proj.weight", lambda w: w.T, lambda w: w.T),
        "layers/w_up": (p + "mlp.up_proj.weight", lambda w: w.T, lambda w: w.T),
        "layers/w_down": (p + "mlp.down_proj.weight", lambda w: w.T, lambda w: w.T),
    }
    if cfg.qkv_bias:  # HF biases are [out]
        for ours, hf, heads in (("bq", "q", n), ("bk", "k", k), ("bv", "v", k)):
            rules[f"layers/{ours}"] = (p + f"self_attn.{hf}_proj.bias", lambda w, m=heads: w.reshape(m, h),
                                       lambda w, m=heads: w.reshape(m * h))
    if cfg.score_head:  # LlamaForSequenceClassification: `score` Linear(hidden, 1, bias=False)
        rules["score"] = ("score.weight", lambda w: w[0], lambda w: w[None])
    elif not cfg.tie_word_embeddings:
        rules["lm_head"] = ("lm_head.weight", lambda w: w.T, lambda w: w.T)
    if _vision(cfg) is not None:
        rules.update({"visual/" + leaf: rule for leaf, rule in qwen2_vl.vision_hf_layout(cfg.vision).items()})
    return rules
