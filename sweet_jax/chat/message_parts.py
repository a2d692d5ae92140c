"""The parts of an OpenAI chat message's content list: {"type": "text", "text": ...} and {"type": "image_url",
"image_url": {"url": ...}} (or the URL as a string). One reader for the server's requests, the image-pair training
data and the design describer; each opens the images its own way. Imports no JAX."""

from __future__ import annotations

from typing import NamedTuple


class PartError(ValueError):
    """A part of another type: `field` is its path ("messages.0.content.1.type"), `rule` what was expected."""

    def __init__(self, field: str, rule: str):
        super().__init__(f"{field}: {rule}")
        self.field, self.rule = field, rule


class Part(NamedTuple):
    kind: str  # "text" or "image_url"
    value: object  # the text (a string), or the image's URL as given (a string when well formed)
    field: str  # the part's path, "messages.0.content.1"


def content_parts(content: list, where: str) -> list[Part]:
    """The parts of a content list at path `where` ("messages.0.content"), in order; PartError for another type."""
    out = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            out.append(Part("text", str(part.get("text", "")), f"{where}.{j}"))
        elif kind == "image_url":
            url = part.get("image_url")
            out.append(Part("image_url", url.get("url") if isinstance(url, dict) else url, f"{where}.{j}"))
        else:
            raise PartError(f"{where}.{j}.type", f"expected 'text' or 'image_url', got {kind!r}")
    return out
