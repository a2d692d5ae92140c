"""The CLIP image tower (ViT, e.g. `openai/clip-vit-base-patch32`) as pure functions, for the ColBench frontend
metric: `get_image_features` of HF's `CLIPModel`, loaded from an HF checkpoint directory (safetensors).

    embed = image_embedder("/data/clip-vit-base-patch32")
    features = embed(pixels)        # [N, 3, 224, 224] CLIP-normalised (colbench.similarity.clip_pixels) -> [N, 512]

Architecture (HF names): a patch convolution without bias, a class token and learned positions; `pre_layrnorm`;
pre-LayerNorm encoder layers (attention with biased q/k/v/out projections, then an MLP fc1 -> quick_gelu -> fc2);
`post_layernorm` on the class token; `visual_projection` without bias. Computed in float32.
"""

from __future__ import annotations

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np

from sweet_jax.models.layers import layer_norm, quick_gelu


@dataclasses.dataclass(frozen=True)
class ClipVisionConfig:
    hidden_size: int = 768
    intermediate_size: int = 3072
    num_layers: int = 12
    num_heads: int = 12
    patch_size: int = 32
    image_size: int = 224
    projection_dim: int = 512
    layer_norm_eps: float = 1e-5
    hidden_act: str = "quick_gelu"

    @classmethod
    def from_pretrained(cls, path: str) -> "ClipVisionConfig":
        file = os.path.join(path, "config.json")
        with open(file) as fh:
            hf = json.load(fh)
        v = hf.get("vision_config", {})
        act = v.get("hidden_act", "quick_gelu")
        if act not in ("quick_gelu", "gelu"):
            raise ValueError(f"{file}: field 'vision_config.hidden_act': {act!r} is not supported")
        return cls(hidden_size=v.get("hidden_size", 768), intermediate_size=v.get("intermediate_size", 3072),
                   num_layers=v.get("num_hidden_layers", 12), num_heads=v.get("num_attention_heads", 12),
                   patch_size=v.get("patch_size", 32), image_size=v.get("image_size", 224),
                   projection_dim=hf.get("projection_dim", 512), layer_norm_eps=v.get("layer_norm_eps", 1e-5),
                   hidden_act=act)


_LAYER = {  # our name -> HF suffix under vision_model.encoder.layers.{i}.
    "ln1_w": "layer_norm1.weight", "ln1_b": "layer_norm1.bias", "ln2_w": "layer_norm2.weight",
    "ln2_b": "layer_norm2.bias", "q_w": "self_attn.q_proj.weight", "q_b": "self_attn.q_proj.bias",
    "k_w": "self_attn.k_proj.weight", "k_b": "self_attn.k_proj.bias", "v_w": "self_attn.v_proj.weight",
    "v_b": "self_attn.v_proj.bias", "o_w": "self_attn.out_proj.weight", "o_b": "self_attn.out_proj.bias",
    "fc1_w": "mlp.fc1.weight", "fc1_b": "mlp.fc1.bias", "fc2_w": "mlp.fc2.weight", "fc2_b": "mlp.fc2.bias",
}
_TOP = {
    "patch": "vision_model.embeddings.patch_embedding.weight", "cls": "vision_model.embeddings.class_embedding",
    "pos": "vision_model.embeddings.position_embedding.weight", "pre_w": "vision_model.pre_layrnorm.weight",
    "pre_b": "vision_model.pre_layrnorm.bias", "post_w": "vision_model.post_layernorm.weight",
    "post_b": "vision_model.post_layernorm.bias", "proj": "visual_projection.weight",
}


def load_params(path: str, cfg: ClipVisionConfig) -> dict:
    """The image tower's weights from an HF CLIP checkpoint directory (*.safetensors); layers stacked."""
    from safetensors.numpy import load_file

    files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    if not files:
        raise FileNotFoundError(f"{path}: no *.safetensors files (convert the CLIP checkpoint to safetensors)")
    tensors: dict[str, np.ndarray] = {}
    for f in files:
        tensors.update(load_file(os.path.join(path, f)))

    def get(name):
        if name not in tensors:
            raise KeyError(f"{path}: tensor '{name}' missing from the checkpoint")
        return np.asarray(tensors[name], np.float32)

    params = {k: jnp.asarray(get(v)) for k, v in _TOP.items()}
    params["layers"] = {k: jnp.asarray(np.stack([get(f"vision_model.encoder.layers.{i}.{v}")
                                                 for i in range(cfg.num_layers)])) for k, v in _LAYER.items()}
    return params


def image_features(params: dict, cfg: ClipVisionConfig, pixels: jnp.ndarray) -> jnp.ndarray:
    """pixels [N, 3, H, W] (CLIP-normalised) -> image embeddings [N, projection_dim] (not normalised)."""
    n = pixels.shape[0]
    p, d, h = cfg.patch_size, cfg.hidden_size, cfg.num_heads
    patches = jax.lax.conv_general_dilated(pixels.astype(jnp.float32), params["patch"], (p, p), "VALID",
                                           dimension_numbers=("NCHW", "OIHW", "NCHW"))  # [N, D, g, g]
    x = patches.reshape(n, d, -1).transpose(0, 2, 1)
    x = jnp.concatenate([jnp.broadcast_to(params["cls"], (n, 1, d)), x], axis=1) + params["pos"][None]
    x = layer_norm(x, params["pre_w"], params["pre_b"], cfg.layer_norm_eps)
    act = quick_gelu if cfg.hidden_act == "quick_gelu" else jax.nn.gelu

    def layer(x, w):
        y = layer_norm(x, w["ln1_w"], w["ln1_b"], cfg.layer_norm_eps)
        q, k, v = ((y @ w[f"{c}_w"].T + w[f"{c}_b"]).reshape(n, -1, h, d // h) for c in "qkv")
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) * (d // h) ** -0.5
        a = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, -1), v).reshape(n, -1, d)
        x = x + a @ w["o_w"].T + w["o_b"]
        y = layer_norm(x, w["ln2_w"], w["ln2_b"], cfg.layer_norm_eps)
        return x + act(y @ w["fc1_w"].T + w["fc1_b"]) @ w["fc2_w"].T + w["fc2_b"], None

    x, _ = jax.lax.scan(layer, x, params["layers"])
    pooled = layer_norm(x[:, 0], params["post_w"], params["post_b"], cfg.layer_norm_eps)
    return pooled @ params["proj"].T


def image_embedder(path: str):
    """A jitted function: numpy pixels [N, 3, 224, 224] -> numpy embeddings [N, projection_dim]."""
    cfg = ClipVisionConfig.from_pretrained(path)
    params = load_params(path, cfg)
    fn = jax.jit(lambda px: image_features(params, cfg, px))
    return lambda pixels: np.asarray(fn(jnp.asarray(pixels, jnp.float32)))
