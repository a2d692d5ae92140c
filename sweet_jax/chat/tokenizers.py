"""Tokenizer loading, with the one fallback chain every job uses: the tokenizer a user names, else the model's own
directory, else the tokenizer bundled with the model's chat format. Imports no JAX."""

from __future__ import annotations

import json
import os

from sweet_jax.chat.formats import get_format


# The class AutoTokenizer picks for these `tokenizer_class` names (one class in transformers 5): the Llama-3 tokenizer
# bundled with the chat format, and every export of a model that has it
FAST_CLASSES = ("PreTrainedTokenizerFast", "TokenizersBackend")


def load_tokenizer(path: str | os.PathLike):
    """Load an HF tokenizer directory (local; nothing is downloaded). A directory whose tokenizer_config.json names
    one of `FAST_CLASSES` is loaded by that class directly, as AutoTokenizer would load it: importing AutoTokenizer
    imports torch whenever torch is installed (several seconds of every job's start on a CPU)."""
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{path}: tokenizer directory not found")
    try:
        with open(os.path.join(path, "tokenizer_config.json")) as f:
            named = json.load(f).get("tokenizer_class")
    except (OSError, ValueError, AttributeError):
        named = None
    if named in FAST_CLASSES and os.path.exists(os.path.join(path, "tokenizer.json")):
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(path, local_files_only=True)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def tokenizer_dir(*candidates: str | None, chat_format: str | None = None) -> str:
    """The first of `candidates` that is given (a flag, a model directory with tokenizer files, ...), else the
    bundled tokenizer of `chat_format`; FileNotFoundError, saying how to install it, when that is missing too."""
    for path in candidates:
        if path:
            return os.fspath(path)
    return get_format(chat_format).bundled_tokenizer_dir()


def find_tokenizer(*candidates: str | None, chat_format: str | None = None):
    """`load_tokenizer(tokenizer_dir(...))`."""
    return load_tokenizer(tokenizer_dir(*candidates, chat_format=chat_format))


def has_tokenizer(path: str) -> bool:
    """Whether a model directory holds its own tokenizer files."""
    return any(os.path.exists(os.path.join(path, f)) for f in ("tokenizer.json", "tokenizer_config.json"))
