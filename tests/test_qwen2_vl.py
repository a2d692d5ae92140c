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
    return model, vc, qwen2_vl.to_ours(state, vc)


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
