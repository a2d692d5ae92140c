"""Image pairs for a vision-language regression-head critic (data kind "image_pairs"): each side of a pair is a chat
whose messages hold images, rendered with the model's chat template, its images preprocessed for the vision tower
(`models.qwen2_vl_images`) and each image's `<|image_pad|>` expanded to its feature tokens. The reward objective
then scores every token of each side (`steps.loss_fn`, the reward objective).

One JSON object per line of the file:

    {"task": "t17",
     "chosen":   {"messages": [{"role": "user", "content": [{"type": "text", "text": "The target:"},
                                                            {"type": "image_url", "image_url": {"url": "t17.png"}}]},
                               {"role": "assistant", "content": "<html>...</html>"}]},
     "rejected": {"messages": [...]}}

An image is a base64 data URL or a path relative to the file. The last message of a side is the assistant's, and the
text before it is the prompt its reply follows (with the generation header). `image_arrays` gives a batch's images
row by row, with the rows' M-RoPE positions.
"""

from __future__ import annotations

import numpy as np

from sweet_jax.chat.message_parts import PartError, content_parts
from sweet_jax.data.examples import Example, ExampleBuilder
from sweet_jax.files.errors import DataError
from sweet_jax.files.jsonl import parse_object
from sweet_jax.models import qwen2_vl
from sweet_jax.models.qwen2_vl_images import ImageError, ImageSettings, open_image, preprocess


def _side(record, side: str, where: str, base_dir: str, builder: ExampleBuilder, cfg,
          settings: ImageSettings) -> Example:
    value = record.get(side)
    messages = value.get("messages") if isinstance(value, dict) else None
    return chat_example(messages, where, f"{side}.messages", base_dir, builder, cfg, settings)


def chat_example(messages, where: str, field: str, base_dir: str, builder: ExampleBuilder, cfg,
                 settings: ImageSettings) -> Example:
    """A chat whose last message is the assistant's reply, its earlier messages' image parts (`image_url`: a data
    URL, or a path relative to `base_dir`) preprocessed for the vision tower and each `<|image_pad|>` expanded to
    the image's feature tokens. Errors name `where` (file:line) and the field (`field`, "chosen.messages", and
    within it)."""
    if not isinstance(messages, list) or not messages:
        raise DataError(f"{where}: field '{field}': expected a non-empty list of messages")
    last = messages[-1]
    if not isinstance(last, dict) or last.get("role") != "assistant" or not isinstance(last.get("content"), str):
        raise DataError(f"{where}: field '{field}.{len(messages) - 1}': the last message must be the assistant's, "
                        f"with string content")
    rendered, images = [], []
    for i, m in enumerate(messages[:-1]):
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list):
            parts = []
            try:
                read = content_parts(content, f"{field}.{i}.content")
            except PartError as e:
                raise DataError(f"{where}: field '{e.field}': {e.rule}") from None
            for part in read:
                if part.kind == "text":
                    parts.append({"type": "text", "text": part.value})
                    continue
                try:
                    images.append(open_image(part.value, f"{where}: field '{part.field}'", base_dir))
                except ImageError as e:
                    raise DataError(str(e)) from None
                parts.append({"type": "image"})
            content = parts
        rendered.append({"role": m.get("role") if isinstance(m, dict) else None, "content": content})
    try:
        prompt = builder.chat.render_text(rendered, add_generation_prompt=True)
    except ValueError as e:
        raise DataError(f"{where}: field '{field}': {e}") from None
    ex = builder.from_text(prompt, last["content"], where)
    if not images:
        return ex
    if ex.truncated:
        raise DataError(f"{where}: field '{field}': over data.max_len={builder.max_len} tokens; an example with "
                        f"images is never cut")
    pixels, grid = preprocess(images, settings)
    try:
        counts = qwen2_vl.expand_image_pads(ex.tokens, cfg.image_token_id, grid, cfg.vision.spatial_merge_size)
    except ValueError as e:
        raise DataError(f"{where}: field '{field}': the rendered chat has {e}") from None
    if counts.sum() > builder.max_len:
        raise DataError(f"{where}: field '{field}': {int(counts.sum())} tokens with its image features, over "
                        f"data.max_len={builder.max_len}")
    return Example(tokens=np.repeat(ex.tokens, counts), score_mask=np.repeat(ex.score_mask, counts),
                   response_mask=np.repeat(ex.response_mask, counts), turn_ids=np.repeat(ex.turn_ids, counts),
                   truncated=False, source=where, images=(pixels, grid))


def read_image_pairs(path: str, builder: ExampleBuilder, cfg, settings: ImageSettings = ImageSettings(),
                     on_error: str = "raise", skipped: list | None = None) -> tuple[list[tuple[Example, Example]],
                                                                                   list[str]]:
    """(the pairs of an image-pairs file as (chosen, rejected) Examples, each pair's task). A malformed record
    raises DataError naming the file, line and field; with on_error="skip" it is left out and its error appended to
    `skipped`."""
    import os

    if getattr(cfg, "vision", None) is None:
        raise DataError(f"{path}: image pairs need a vision-language model; {type(cfg).__name__} has no vision tower")
    base_dir = os.path.dirname(os.path.abspath(path))
    pairs, tasks = [], []
    with open(path) as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            where = f"{path}:{n}"
            try:
                record = parse_object(line, where)
                pair = tuple(_side(record, side, where, base_dir, builder, cfg, settings)
                             for side in ("chosen", "rejected"))
            except DataError as e:
                if on_error != "skip":
                    raise
                if skipped is not None:
                    skipped.append(str(e))
                continue
            pairs.append(pair)
            tasks.append(str(record.get("task", n)))
    if not pairs:
        raise DataError(f"{path}: no usable image pairs")
    return pairs, tasks


def image_arrays(rows: list[Example | None], tokens: np.ndarray, segment_ids: np.ndarray, cfg) -> dict:
    """A batch's per-row images and M-RoPE positions: pixels [R, N, C * T * P * P], patch_positions [R, N, 2],
    patch_segments [R, N] (N: the most patches of a row, rounded up to a power of two) and positions [R, 3, L]. A
    row without images (or a padding row, None) has only padding patches and plain positions on all three rows."""
    merge = cfg.vision.spatial_merge_size
    most = max((len(e.images[0]) for e in rows if e is not None and e.images is not None), default=0)
    n = max(merge ** 2, 1 << max(0, most - 1).bit_length())
    r, length = tokens.shape
    out = {"pixels": np.zeros((r, n, cfg.vision.patch_dim), np.float32),
           "patch_positions": np.zeros((r, n, 2), np.int32), "patch_segments": np.zeros((r, n), np.int32),
           "positions": np.zeros((r, 3, length), np.int32)}
    for i, e in enumerate(rows):
        grid = e.images[1] if e is not None and e.images is not None else np.zeros((0, 3), np.int64)
        positions, _ = qwen2_vl.mrope_positions(tokens[i:i + 1], cfg.image_token_id, grid, merge,
                                                segment_ids[i:i + 1] > 0)
        out["positions"][i] = positions[:, 0]
        if len(grid):
            images = qwen2_vl.image_batch(e.images[0], grid, merge, pad_to=n)
            out["pixels"][i], out["patch_positions"][i], out["patch_segments"][i] = images[:3]
    return out
