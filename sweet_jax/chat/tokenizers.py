"""Tokenizer loading, with the one fallback chain every job uses: the tokenizer a user names, else the model's own
directory, else the tokenizer bundled with the model's chat format. Imports no JAX.

A tokenizer can also be named as `bundled:NAME`, with nothing to download: `bundled:llama3` is the chat format's
bundled tokenizer (any registered format's name works), and `bundled:llama3-8k` is the Llama-3 tokenizer cut down to
8,192 entries (`cut_vocabulary`), which the toy-scale configs use: a tiny model's time goes to its vocabulary
projection, and 8k entries cost a sixteenth of 128k. Derived tokenizers are written once to the per-user cache.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil

from sweet_jax.chat.formats import format_names, get_format
from sweet_jax.files.atomic import directory_once
from sweet_jax.files.cache import cache_path

BUNDLED = "bundled:"
# Cut-down tokenizers: name -> (the chat format whose bundled tokenizer is cut, entries kept in all)
SMALL_VOCABULARIES = {"llama3-8k": ("llama3", 8192)}
_CUT_VERSION = 1  # part of a derived tokenizer's cache key: bump it when `cut_vocabulary` changes its output


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
    """The first of `candidates` that is given (a flag, a model directory with tokenizer files, a `bundled:NAME`,
    ...), else the bundled tokenizer of `chat_format`; FileNotFoundError, saying how to install it, when that is
    missing too."""
    for path in candidates:
        if path:
            path = os.fspath(path)
            return bundled_tokenizer_dir(path[len(BUNDLED):]) if path.startswith(BUNDLED) else path
    return get_format(chat_format).bundled_tokenizer_dir()


@functools.lru_cache(maxsize=None)
def bundled_tokenizer_dir(name: str) -> str:
    """The directory of the tokenizer `bundled:NAME`: a chat format's bundled tokenizer, or one of
    `SMALL_VOCABULARIES`, cut from it on first use into ~/.cache/sweet_jax/tokenizers (its source hashed once per
    process)."""
    if name in SMALL_VOCABULARIES:
        chat_format, size = SMALL_VOCABULARIES[name]
        src = get_format(chat_format).bundled_tokenizer_dir()
        with open(os.path.join(src, "tokenizer.json"), "rb") as f:
            digest = hashlib.sha256(f.read() + f"{size} {_CUT_VERSION}".encode()).hexdigest()[:12]
        out = cache_path("tokenizers", f"{name}-{digest}")
        with directory_once(out) as tmp:
            if tmp:
                cut_vocabulary(src, tmp, size)
        return out
    if name in format_names():
        return get_format(name).bundled_tokenizer_dir()
    raise FileNotFoundError(f"no bundled tokenizer {BUNDLED}{name}: the names are "
                            f"{', '.join(BUNDLED + n for n in sorted([*format_names(), *SMALL_VOCABULARIES]))}")


def _byte_alphabet() -> set[str]:
    """The 256 characters a byte-level BPE writes bytes as (GPT-2's mapping, which HF tokenizers' ByteLevel uses)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    return {chr(b) for b in keep} | {chr(256 + i) for i in range(256 - len(keep))}


def cut_vocabulary(src: str, out: str, size: int) -> None:
    """Write to `out` the byte-level BPE tokenizer of directory `src` cut down to `size` entries: its first
    `size - S` ordinary tokens (the most frequent merges come first in a BPE vocabulary), their merges, and its S
    special tokens renumbered to follow them, in their order. Every text still encodes (the 256 byte tokens are kept)
    and decodes to itself; special tokens, the chat template and the tokenizer settings are as in `src`.
    ValueError for a tokenizer that is not a byte-level BPE or a `size` that leaves out its byte tokens."""
    with open(os.path.join(src, "tokenizer.json"), encoding="utf-8") as f:
        spec = json.load(f)
    model = spec.get("model") or {}
    if model.get("type") != "BPE" or "ByteLevel" not in json.dumps(spec.get("pre_tokenizer")):
        raise ValueError(f"{src}/tokenizer.json: only a byte-level BPE tokenizer can be cut down")
    specials = sorted(spec.get("added_tokens", []), key=lambda t: t["id"])
    ordinary = size - len(specials)
    vocab = {token: i for token, i in model["vocab"].items() if i < ordinary}
    if len(vocab) != ordinary or not _byte_alphabet() <= vocab.keys():
        raise ValueError(f"{src}: {size} entries do not hold its {len(specials)} special tokens and the 256 byte "
                         f"tokens among its first ordinary ids")
    renumber = {t["id"]: ordinary + k for k, t in enumerate(specials)}
    merges = []
    for merge in model["merges"]:
        a, b = merge.split(" ") if isinstance(merge, str) else merge
        if a in vocab and b in vocab and a + b in vocab:
            merges.append(merge)
    spec["model"] = {**model, "vocab": vocab, "merges": merges}
    spec["added_tokens"] = [{**t, "id": renumber[t["id"]]} for t in specials]

    def renumbered(node):  # the post-processor's special-token ids
        if isinstance(node, dict):
            return {k: [renumber.get(i, i) for i in v] if k == "ids" and isinstance(v, list) else renumbered(v)
                    for k, v in node.items()}
        return [renumbered(v) for v in node] if isinstance(node, list) else node

    spec["post_processor"] = renumbered(spec.get("post_processor"))
    with open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(spec, f, ensure_ascii=False)
    with open(os.path.join(src, "tokenizer_config.json"), encoding="utf-8") as f:
        config = json.load(f)
    config["added_tokens_decoder"] = {str(renumber[int(i)]): t
                                      for i, t in config.get("added_tokens_decoder", {}).items()}
    with open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False, indent=2)
    for name in ("special_tokens_map.json", "chat_template.jinja"):
        if os.path.exists(os.path.join(src, name)):
            shutil.copy(os.path.join(src, name), out)


def special_token_id(path: str, token: str) -> int | None:
    """The id of special token `token` in the tokenizer directory `path` (its tokenizer.json's added tokens), without
    loading the tokenizer; None if it has no such token or no tokenizer.json."""
    try:
        with open(os.path.join(path, "tokenizer.json"), encoding="utf-8") as f:
            added = json.load(f).get("added_tokens", [])
    except (OSError, ValueError):
        return None
    return next((t["id"] for t in added if t.get("content") == token), None)


def find_tokenizer(*candidates: str | None, chat_format: str | None = None):
    """`load_tokenizer(tokenizer_dir(...))`."""
    return load_tokenizer(tokenizer_dir(*candidates, chat_format=chat_format))


def has_tokenizer(path: str) -> bool:
    """Whether a model directory holds its own tokenizer files."""
    return any(os.path.exists(os.path.join(path, f)) for f in ("tokenizer.json", "tokenizer_config.json"))
