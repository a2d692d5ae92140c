"""The per-user cache, ~/.cache/sweet_jax: what is fetched or derived once and then reused by every job and test
(Tailwind's CSS, SmolLM2's GGUF import, the derived tokenizers of `chat.tokenizers`). Everything in it can be deleted;
it is made again on first use. Imports no JAX."""

from __future__ import annotations

import os

CACHE_DIR = os.path.join(os.path.expanduser("~"), ".cache", "sweet_jax")


def cache_path(*parts: str) -> str:
    """A path under the cache directory (nothing is created)."""
    return os.path.join(CACHE_DIR, *parts)
