"""Qwen2-VL image preprocessing equals transformers' `Qwen2VLImageProcessorPil` pixel for pixel: non-square images,
one small enough to be scaled up to min_pixels, one large enough to be scaled down to max_pixels, several at once."""

import numpy as np
import pytest
from PIL import Image
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from sweet_jax.models.qwen2_vl_images import ImageSettings, preprocess, smart_resize


def _image(w, h, seed):
    rng = np.random.RandomState(seed)
    base = rng.randint(0, 256, (h // 8 + 1, w // 8 + 1, 3)).astype(np.uint8)  # smooth-ish, with edges
    return Image.fromarray(base).resize((w, h), Image.Resampling.NEAREST)


@pytest.mark.parametrize("sizes", [[(200, 120)], [(30, 41)], [(1500, 900)], [(333, 97), (64, 256), (97, 333)]])
def test_pixels_and_grids_equal_transformers(sizes):
    s = ImageSettings(max_pixels=28 * 28 * 400)
    images = [_image(w, h, i) for i, (w, h) in enumerate(sizes)]
    hf = Qwen2VLImageProcessorPil(min_pixels=s.min_pixels, max_pixels=s.max_pixels)(images, return_tensors="np")
    pixels, grids = preprocess(images, s)
    np.testing.assert_array_equal(grids, hf["image_grid_thw"])
    assert pixels.shape == hf["pixel_values"].shape
    np.testing.assert_allclose(pixels, hf["pixel_values"], atol=1e-6, rtol=0)


def test_smart_resize_bounds():
    assert smart_resize(30, 41) == (56, 84)  # scaled up to min_pixels
    h, w = smart_resize(900, 1500, max_pixels=28 * 28 * 400)
    assert h % 28 == w % 28 == 0 and h * w <= 28 * 28 * 400
    with pytest.raises(ValueError, match="aspect ratio"):
        smart_resize(10, 3000)
