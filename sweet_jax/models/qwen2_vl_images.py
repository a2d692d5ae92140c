"""Qwen2-VL's image preprocessing, the same pixels as transformers' `Qwen2VLImageProcessor` (its PIL backend): each
image is resized with PIL's bicubic filter to `smart_resize`'s size (multiples of patch x merge = 28 pixels, the
pixel count within [min_pixels, max_pixels], the aspect ratio kept as closely as possible), scaled to [0, 1],
normalised with CLIP's mean and std, repeated over the 2 frames of a temporal patch, and cut into 14 x 14 patches in
the order the vision tower's 2 x 2 patch merger reads them. Imports no JAX.

    pixels, grid_thw = preprocess([image_a, image_b])   # [patches, 3 * 2 * 14 * 14] f32, [[1, h, w], ...]
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import io
import math
import os

import numpy as np

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclasses.dataclass(frozen=True)
class ImageSettings:
    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280  # Qwen2-VL-7B-Instruct's preprocessor_config.json
    mean: tuple[float, ...] = CLIP_MEAN
    std: tuple[float, ...] = CLIP_STD

    @classmethod
    def of_model(cls, model_dir, **overrides) -> "ImageSettings":
        """The settings of a model directory's `preprocessor_config.json` (the defaults without one): min_pixels and
        max_pixels, or transformers >= 5's size {shortest_edge, longest_edge}, and the patch sizes, mean and std."""
        import json

        path = os.path.join(os.fspath(model_dir), "preprocessor_config.json") if model_dir else None
        hf = {}
        if path and os.path.exists(path):
            with open(path) as fh:
                hf = json.load(fh)
        size = hf.get("size") or {}
        kw = {"min_pixels": hf.get("min_pixels", size.get("shortest_edge")),
              "max_pixels": hf.get("max_pixels", size.get("longest_edge")),
              "patch_size": hf.get("patch_size"), "temporal_patch_size": hf.get("temporal_patch_size"),
              "merge_size": hf.get("merge_size"),
              "mean": tuple(hf["image_mean"]) if "image_mean" in hf else None,
              "std": tuple(hf["image_std"]) if "image_std" in hf else None}
        kw = {k: v for k, v in kw.items() if v is not None}
        kw.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**kw)


class ImageError(ValueError):
    """An image that cannot be read: the message says where it was given."""


def open_image(ref, where: str, base_dir: str | None = None):
    """An RGB PIL image from a `data:image/...;base64,...` URL or, with `base_dir` (a data file's folder), a path
    relative to it. `where` names the field for the error message."""
    from PIL import Image, UnidentifiedImageError

    if not isinstance(ref, str) or not ref:
        raise ImageError(f"{where}: expected an image URL or path, got {ref!r}")
    try:
        if ref.startswith("data:"):
            head, _, data = ref.partition(",")
            if not head.endswith(";base64") or not data:
                raise ImageError(f"{where}: a data URL must be base64 (data:image/<type>;base64,<data>)")
            try:
                raw = io.BytesIO(base64.b64decode(data, validate=True))
            except (binascii.Error, ValueError) as e:
                raise ImageError(f"{where}: invalid base64 data ({e})") from None
        elif base_dir is None:
            raise ImageError(f"{where}: only base64 data URLs (data:image/png;base64,...) are accepted; nothing is "
                             f"fetched")
        else:
            raw = os.path.join(base_dir, ref)
        image = Image.open(raw)
        image.load()
        return image.convert("RGB")
    except FileNotFoundError:
        raise ImageError(f"{where}: no image file {os.path.join(base_dir or '', ref)}") from None
    except (UnidentifiedImageError, OSError) as e:
        raise ImageError(f"{where}: the data is not an image PIL can read ({e})") from None


def smart_resize(height: int, width: int, factor: int = 28, min_pixels: int = 56 * 56,
                 max_pixels: int = 28 * 28 * 1280) -> tuple[int, int]:
    """The (height, width) an image is resized to: multiples of `factor`, min_pixels <= h * w <= max_pixels."""
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"image of {width} x {height} pixels: the aspect ratio must be under 200")
    h = round(height / factor) * factor
    w = round(width / factor) * factor
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * beta / factor) * factor
        w = math.ceil(width * beta / factor) * factor
    return h, w


def patchify(image: np.ndarray, s: ImageSettings = ImageSettings()) -> tuple[np.ndarray, int, int]:
    """A normalised [C, H, W] image -> (patches [gh * gw, C * T * P * P], gh, gw), patches in merge-window order:
    the 2 x 2 patches that the merger joins are consecutive."""
    c, height, width = image.shape
    p, m, t = s.patch_size, s.merge_size, s.temporal_patch_size
    gh, gw = height // p, width // p
    x = image.reshape(c, gh // m, m, p, gw // m, m, p).transpose(1, 4, 2, 5, 0, 3, 6)  # gh', gw', mh, mw, C, ph, pw
    x = np.broadcast_to(x[:, :, :, :, :, None], (*x.shape[:5], t, p, p))  # one image is both frames
    return x.reshape(gh * gw, c * t * p * p), gh, gw


def preprocess(images, s: ImageSettings = ImageSettings()) -> tuple[np.ndarray, np.ndarray]:
    """PIL images -> (pixel_values [sum of patches, C * T * P * P] float32, image_grid_thw int64 [n, 3])."""
    from PIL import Image

    patches, grids = [], []
    mean = np.asarray(s.mean, np.float32)[:, None, None]
    std = np.asarray(s.std, np.float32)[:, None, None]
    for image in images:
        image = image.convert("RGB")
        h, w = smart_resize(image.height, image.width, s.patch_size * s.merge_size, s.min_pixels, s.max_pixels)
        resized = np.asarray(image.resize((w, h), Image.Resampling.BICUBIC), np.float32).transpose(2, 0, 1)
        x, gh, gw = patchify(((resized * np.float32(1 / 255)) - mean) / std, s)
        patches.append(x)
        grids.append((1, gh, gw))
    return np.concatenate(patches).astype(np.float32), np.asarray(grids, np.int64)
