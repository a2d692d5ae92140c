"""Qwen2-VL's vision tower against transformers' `Qwen2VisionTransformerPretrainedModel` (torch CPU, f32) on tiny
random weights wider than HF's init: a non-square image, two images of different sizes in one batch, with the
patches of `qwen2_vl_images.preprocess`."""

import jax
import numpy as np
import pytest
import torch
import transformers
from PIL import Image
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VisionTransformerPretrainedModel

from sweet_jax.models import qwen2_vl
from sweet_jax.models.qwen2_vl_images import ImageSettings, preprocess


@pytest.fixture(scope="module")
def tower():
    hf_cfg = transformers.Qwen2VLVisionConfig(depth=2, embed_dim=64, hidden_size=48, num_heads=4, mlp_ratio=2,
                                              patch_size=14, temporal_patch_size=2, spatial_merge_size=2)
    torch.manual_seed(0)
    model = Qwen2VisionTransformerPretrainedModel._from_config(hf_cfg, attn_implementation="eager").eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("norm1.weight", "norm2.weight", "ln_q.weight")):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.normal_(0.0, 1.0 / np.sqrt(p.shape[-1] if p.ndim > 1 else 16))
    vc = qwen2_vl.VisionConfig.from_hf_dict(hf_cfg.to_dict())
    state = {f"model.visual.{k}": v.numpy() for k, v in model.state_dict().items()}
    return model, vc, qwen2_vl.to_ours(state, vc, prefix="model.visual.")


def _images(*sizes):
    rng = np.random.RandomState(0)
    return [Image.fromarray(rng.randint(0, 256, (h, w, 3)).astype(np.uint8)) for w, h in sizes]


@pytest.mark.parametrize("sizes", [[(140, 84)], [(140, 84), (56, 112)]], ids=["non_square", "two_images"])
def test_vision_features_match_hf(tower, sizes):
    model, vc, params = tower
    pixels, grid = preprocess(_images(*sizes), ImageSettings(max_pixels=28 * 28 * 64))
    with torch.no_grad():
        out = model(torch.tensor(pixels), grid_thw=torch.tensor(grid))
    ref = out.pooler_output.numpy()
    positions, segments = qwen2_vl.vision_inputs(grid, vc.spatial_merge_size)
    ours = np.asarray(jax.jit(lambda p, x, pos, seg: qwen2_vl.vision_forward(p, vc, x, pos, seg))(
        params, pixels, positions, segments))
    assert ours.shape == ref.shape == (int(grid.prod(-1).sum()) // 4, 48)
    assert np.abs(ref).max() > 1.0
    np.testing.assert_allclose(ours, ref, atol=1e-4)
    if len(sizes) == 2:  # images do not attend to each other: each alone gives its own features
        first = int(grid[0].prod()) // 4
        alone_pixels, alone_grid = preprocess(_images(*sizes)[:1], ImageSettings(max_pixels=28 * 28 * 64))
        pos, seg = qwen2_vl.vision_inputs(alone_grid)
        alone = np.asarray(qwen2_vl.vision_forward(params, vc, alone_pixels, pos, seg))
        np.testing.assert_allclose(ours[:first], alone, atol=1e-4)


def test_mrope_tables_match_hf_with_unequal_sections():
    """M-RoPE's cos/sin against HF's Qwen2VLRotaryEmbedding, with sections of unequal sizes so that a t/h/w mix-up
    shows."""
    import dataclasses

    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLRotaryEmbedding

    from sweet_jax import models
    from sweet_jax.models.rope import rope_tables

    hf_cfg = transformers.Qwen2VLTextConfig(hidden_size=64, num_attention_heads=2, num_key_value_heads=1,
                                            rope_parameters={"rope_type": "default", "rope_theta": 1e6,
                                                             "mrope_section": [2, 6, 8]})

    @dataclasses.dataclass(frozen=True)
    class Cfg(models.Qwen2Config):
        mrope_section: tuple = (2, 6, 8)

    cfg = Cfg(vocab_size=10, hidden_size=64, intermediate_size=32, num_layers=1, num_heads=2, num_kv_heads=1)
    positions = np.random.RandomState(0).randint(0, 500, (3, 2, 7))
    cos, sin = Qwen2VLRotaryEmbedding(hf_cfg)(torch.zeros(1), torch.tensor(positions))
    ours_cos, ours_sin = rope_tables(cfg, positions)
    np.testing.assert_allclose(np.asarray(ours_cos), cos.numpy()[..., :16], atol=1e-6)
    np.testing.assert_allclose(np.asarray(ours_sin), sin.numpy()[..., :16], atol=1e-6)
    # equal rows are plain RoPE
    same = np.broadcast_to(positions[:1], positions.shape)
    np.testing.assert_allclose(np.asarray(rope_tables(cfg, same)[0]), np.asarray(rope_tables(cfg, positions[0])[0]))


def test_mrope_positions_match_hf_get_rope_index():
    """Two images of different sizes in one row, text-only and left-padded rows."""
    import functools
    import types

    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLModel

    img = 9
    grid = np.array([[1, 4, 6], [1, 2, 2], [1, 6, 4]])
    a = [1, 2, 8] + [img] * 6 + [3, 4, 8] + [img] * 1 + [5, 6]  # two images: 4x6 -> 2x3, 2x2 -> 1x1
    b = [7, 8, 8] + [img] * 6 + [2]  # one image 6x4 -> 3x2
    pad = len(a) - len(b)
    tokens = np.array([a, [0] * pad + b, [3] * len(a)])
    mask = np.array([[1] * len(a), [0] * pad + [1] * len(b), [1] * len(a)])
    ns = types.SimpleNamespace(config=types.SimpleNamespace(vision_config=types.SimpleNamespace(spatial_merge_size=2)))
    ns.get_vision_position_ids = functools.partial(Qwen2VLModel.get_vision_position_ids, ns)
    want, want_delta = Qwen2VLModel.get_rope_index(ns, torch.tensor(tokens), torch.tensor((tokens == img).astype(int)),
                                                   image_grid_thw=torch.tensor(grid),
                                                   attention_mask=torch.tensor(mask))
    got, delta = qwen2_vl.mrope_positions(tokens, img, grid, 2, mask)
    np.testing.assert_array_equal(got[:, mask.astype(bool)], want.numpy()[:, mask.astype(bool)])
    np.testing.assert_array_equal(delta, want_delta.numpy()[:, 0])
    with pytest.raises(ValueError, match="does not match its grid"):
        qwen2_vl.mrope_positions(tokens[:1], img, np.array([[1, 2, 2], [1, 2, 2]]), 2)
