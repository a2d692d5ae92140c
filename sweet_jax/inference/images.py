"""Images in chat requests, for a vision-language model (Qwen2-VL): OpenAI `image_url` parts with base64 data URLs
are decoded, their place in the message becomes the chat template's image part, and the prompt's one
`<|image_pad|>` per image is expanded to the image's number of features, with the prompt's M-RoPE positions.

    messages, pil_images = split_images(body_messages)         # raises ImageError (a 400) on a malformed image
    ids = tokenizer.encode(chat.render_text(messages, add_generation_prompt=True))
    ids, images = prompt_images(ids, cfg, pil_images, settings)   # images: PromptImages for the scheduler
"""

from __future__ import annotations

import dataclasses

import numpy as np

from sweet_jax.chat.message_parts import PartError, content_parts
from sweet_jax.models import qwen2_vl
from sweet_jax.models.qwen2_vl_images import ImageError, ImageSettings, open_image, preprocess

__all__ = ["ImageError", "PromptImages", "prompt_images", "split_images"]


@dataclasses.dataclass(frozen=True)
class PromptImages:
    """A prompt's images as the slot programs take them."""

    pixels: np.ndarray  # [patches, C * T * P * P] float32 (`qwen2_vl_images.preprocess`)
    grid_thw: np.ndarray  # [images, 3]
    positions: np.ndarray  # [3, prompt length] M-RoPE positions
    shift: int  # the generated tokens' M-RoPE position minus their cache position


def split_images(messages: list[dict]) -> tuple[list[dict], list]:
    """OpenAI messages -> (messages for the chat template, the images in order). Text parts stay parts, and
    `image_url` parts become the template's {"type": "image"}; a message of text parts only is joined into a
    string, as for a text model."""
    out, images = [], []
    for i, m in enumerate(messages):
        content = m.get("content")
        if isinstance(content, list):
            parts = []
            try:
                read = content_parts(content, f"messages.{i}.content")
            except PartError as e:
                raise ImageError(str(e)) from None
            for part in read:
                if part.kind == "text":
                    parts.append({"type": "text", "text": part.value})
                else:
                    images.append(open_image(part.value, part.field))
                    parts.append({"type": "image"})
            content = parts if any(p["type"] == "image" for p in parts) else "".join(p["text"] for p in parts)
        out.append({"role": m.get("role"), "content": content})
    return out, images


def prompt_images(ids: list[int], cfg, images: list, settings: ImageSettings) -> tuple[list[int], PromptImages]:
    """The prompt with each image's `<|image_pad|>` repeated to its number of features, and its `PromptImages`."""
    pad = cfg.image_token_id
    if ids.count(pad) != len(images):
        raise ImageError(f"the rendered prompt has {ids.count(pad)} image placeholders for {len(images)} images")
    pixels, grid = preprocess(images, settings)
    merge = cfg.vision.spatial_merge_size
    expanded = np.repeat(ids, qwen2_vl.expand_image_pads(ids, pad, grid, merge)).tolist()
    positions, shift = qwen2_vl.mrope_positions(np.asarray([expanded]), pad, grid, merge)
    return expanded, PromptImages(pixels, grid, positions[:, 0].astype(np.int32), int(shift[0]))
