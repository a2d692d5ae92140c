"""Frontend answers: image-URL rewriting and HTML extraction. Imports no JAX."""

from __future__ import annotations

import re

PLACEHOLDER_IMAGE = "https://picsum.photos/id/48/{w}/{h}"
_UNSPLASH = re.compile(r"https?://source\.unsplash\.com/random/(\d+)x(\d+)(?:/\?[^\s\"')]*)?")
_PICSUM = re.compile(r"https?://picsum\.photos/(\d+)/(\d+)")
_HTML = re.compile(r"<html.*?>.*?</html>", re.DOTALL | re.IGNORECASE)
_BODY = re.compile(r"<body.*?>.*?</body>", re.DOTALL | re.IGNORECASE)


def rewrite_image_urls(text: str) -> str:
    """Random Unsplash and sized picsum URLs -> the one picsum image (id 48) the tasks use, at the same size."""
    text = _UNSPLASH.sub(lambda m: PLACEHOLDER_IMAGE.format(w=m.group(1), h=m.group(2)), text)
    return _PICSUM.sub(lambda m: PLACEHOLDER_IMAGE.format(w=m.group(1), h=m.group(2)), text)


def extract_html(text: str) -> str | None:
    """The first <html ...>...</html> block (shortest match), else the first <body ...>...</body>, else None. URLs
    are rewritten first."""
    text = rewrite_image_urls(text)
    m = _HTML.search(text) or _BODY.search(text)
    return m.group(0) if m else None
