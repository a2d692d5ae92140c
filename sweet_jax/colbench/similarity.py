"""Frontend scoring: screenshot similarity and win rate. Imports no JAX; the CLIP image tower
it can use lives in `sweet_jax.models.clip` and is passed in as a function.

- `clip_pixels(image)`: CLIP's preprocessing, done as `CLIPProcessor` does it by default. Resize the shortest side to
  224 (bicubic), center-crop to 224 x 224, scale to [0, 1], normalise with CLIP's mean and std. So only the middle
  band of a tall full-page screenshot counts, as in the official metric.
- Two metrics, both 1.0 for identical screenshots:
  - "clip": the cosine of CLIP ViT-B/32 image embeddings, the official metric. It needs the checkpoint directory of
    `openai/clip-vit-base-patch32`.
  - "pixel" (the offline default when no checkpoint is given): the Pearson correlation of the two crops, taken
    after the same resize and crop and reduced to 32 x 32 RGB. It needs no model and runs in microseconds. Its
    correlation with the CLIP cosine has not been measured yet: use "clip" for numbers meant to compare with the
    paper.
- A missing answer ("No answer") is a black 224 x 224 image, as in the official code.
- `win_rate(ours, baseline)`: the share of tasks where our page is closer to the target than the baseline's. Ties
  count 1/2.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

CLIP_SIZE = 224
CLIP_MEAN = np.array([0.48145466, 0.4578275, 0.40821073], np.float32)
CLIP_STD = np.array([0.26862954, 0.26130258, 0.27577711], np.float32)
METRICS = ("pixel", "clip")


def load_image(path: str | None):
    """An RGB PIL image; None, "No answer" or a missing file give the official black 224 x 224 stand-in."""
    import os

    from PIL import Image

    if not path or path == "No answer" or not os.path.exists(path):
        return Image.new("RGB", (CLIP_SIZE, CLIP_SIZE))
    with Image.open(path) as im:
        return im.convert("RGB")


def center_crop(image, size: int = CLIP_SIZE):
    """Shortest side resized to `size` (bicubic), then the central size x size square."""
    from PIL import Image

    w, h = image.size
    short, long = min(w, h), max(w, h)
    new_long = int(size * long / short)  # truncated, as HF's get_resize_output_image_size does
    nw, nh = (size, new_long) if w <= h else (new_long, size)
    image = image.resize((nw, nh), Image.BICUBIC)
    left, top = (nw - size) // 2, (nh - size) // 2
    return image.crop((left, top, left + size, top + size))


def clip_pixels(image) -> np.ndarray:
    """[3, 224, 224] float32, CLIP-normalised."""
    arr = np.asarray(center_crop(image), np.float32) / 255.0
    return ((arr - CLIP_MEAN) / CLIP_STD).transpose(2, 0, 1)


def pixel_similarity(a, b) -> float:
    """Pearson correlation of the 32 x 32 RGB thumbnails of the CLIP crops: exactly 1.0 for identical thumbnails;
    0.0 when either is one flat grey (such as the black "No answer" image) and they differ."""
    from PIL import Image

    x, y = (np.asarray(center_crop(im).resize((32, 32), Image.BOX), np.float64).ravel() for im in (a, b))
    if np.array_equal(x, y):
        return 1.0
    xc, yc = x - x.mean(), y - y.mean()
    nx, ny = np.linalg.norm(xc), np.linalg.norm(yc)
    if nx == 0 or ny == 0:
        return 0.0
    return float(xc @ yc / (nx * ny))


class Similarity:
    """similarity(answer image path, target image path) by the chosen metric. For "clip", `embed` maps a batch
    [N, 3, 224, 224] of `clip_pixels` to [N, D] image embeddings (`sweet_jax.models.clip.image_embedder`)."""

    def __init__(self, metric: str = "pixel", embed: Callable[[np.ndarray], np.ndarray] | None = None):
        if metric not in METRICS:
            raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
        if metric == "clip" and embed is None:
            raise ValueError("the clip metric needs an image embedder (give a CLIP checkpoint directory)")
        self.metric = metric
        self.embed = embed

    def __call__(self, answer: str | None, target: str | None) -> float:
        a, b = load_image(answer), load_image(target)
        if self.metric == "pixel":
            return pixel_similarity(a, b)
        e = np.asarray(self.embed(np.stack([clip_pixels(a), clip_pixels(b)])), np.float64)
        e /= np.linalg.norm(e, axis=-1, keepdims=True)
        return float(e[0] @ e[1])


def win_rate(ours: Sequence[float], baseline: Sequence[float]) -> float:
    """Mean over tasks of 1 (ours higher), 1/2 (tie) or 0."""
    if len(ours) != len(baseline) or not ours:
        raise ValueError(f"win rate needs two equal, non-empty lists of scores, got {len(ours)} and {len(baseline)}")
    return float(np.mean([1.0 if a > b else 0.5 if a == b else 0.0 for a, b in zip(ours, baseline)]))
