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
    """Load an HF tokenizer directory (local; nothing is downloaded). A byte-level BPE `tokenizer.json` whose
    tokenizer_config.json names one of `FAST_CLASSES` (the Llama-3 and SmolLM2 tokenizers, and every export of a model
    that has one) is a `FastTokenizer`: the `tokenizers` library alone, which is what transformers' class runs too;
    importing transformers' tokenizer classes costs ~0.9 s of every job's start on a CPU (AutoTokenizer, several
    seconds: it imports torch when installed), so that happens only when something beyond encoding and decoding is
    asked for. Any other directory is loaded by AutoTokenizer."""
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{path}: tokenizer directory not found")
    try:
        with open(os.path.join(path, "tokenizer_config.json")) as f:
            config = json.load(f)
        named = config.get("tokenizer_class")
    except (OSError, ValueError, AttributeError):
        config, named = {}, None
    if named in FAST_CLASSES and os.path.exists(os.path.join(path, "tokenizer.json")):
        fast = FastTokenizer(path, config)
        if fast.is_bpe:
            return fast
        return fast.hf  # transformers post-processes the decoding of the others (clean_up_tokenization_spaces)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def _token_text(value) -> str | None:
    """A special token of tokenizer_config.json: a string, or an AddedToken's dict."""
    return value.get("content") if isinstance(value, dict) else value


class Encoded(dict):
    """What a `FastTokenizer` call returns: a dict whose keys are also attributes (`enc["input_ids"]` or
    `enc.input_ids`), as transformers' BatchEncoding reads them."""

    def __getattr__(self, name: str):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


class FastTokenizer:
    """An HF tokenizer directory's `tokenizer.json` through the `tokenizers` library, with the part of transformers'
    `PreTrainedTokenizerFast` that the jobs use: `encode`, `decode`, calls with `add_special_tokens` and
    `return_offsets_mapping`, the special tokens' ids, `convert_tokens_to_ids`, `get_vocab`, `len`, and
    `save_pretrained` (the directory's tokenizer files, copied as they are). transformers' class runs the same
    `tokenizers` calls for these, and skips its decoding clean-up for BPE models, so the results are the same token
    for token (`tests/test_chat.py` checks them against it). Anything else (`apply_chat_template`, other call
    arguments, `add_special_tokens`, ...) is transformers' tokenizer of the same directory, loaded on first use
    (`hf`); from then on every call goes to it, so a tokenizer changed through it stays one tokenizer."""

    FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")

    def __init__(self, path: str, config: dict):
        from tokenizers import Tokenizer

        self.name_or_path, self._config, self._hf = path, config, None
        self._tok = Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
        self.is_bpe = type(self._tok.model).__name__ == "BPE"
        for name in ("bos_token", "eos_token", "pad_token", "unk_token"):
            setattr(self, name, _token_text(config.get(name)))

    @property
    def hf(self):
        """transformers' tokenizer of the same directory (imported and loaded once, when first asked for)."""
        if self._hf is None:
            from transformers import PreTrainedTokenizerFast

            self._hf = PreTrainedTokenizerFast.from_pretrained(self.name_or_path, local_files_only=True)
        return self._hf

    def __getattr__(self, name: str):
        if name.startswith("__") or name in ("_hf", "_tok", "_config"):
            raise AttributeError(name)
        return getattr(self.hf, name)

    def __call__(self, text, *args, **kwargs):
        """`tokenizer(text or [texts], add_special_tokens=..., return_offsets_mapping=...)` as transformers' class
        answers it (`input_ids`, `attention_mask`, `offset_mapping`: one list per text, or one for a single text,
        from the same `tokenizers` calls), without importing transformers: the chat formats and the trainer's examples
        tokenize this way. Any other argument goes to transformers' tokenizer."""
        texts = [text] if isinstance(text, str) else text
        simple = (self._hf is None and not args and set(kwargs) <= {"add_special_tokens", "return_offsets_mapping"}
                  and isinstance(texts, list) and all(isinstance(t, str) for t in texts))
        if not simple:
            return self.hf(text, *args, **kwargs)
        encodings = self._tok.encode_batch(texts, add_special_tokens=kwargs.get("add_special_tokens", True))
        out = {"input_ids": [e.ids for e in encodings], "attention_mask": [e.attention_mask for e in encodings]}
        if kwargs.get("return_offsets_mapping"):
            out["offset_mapping"] = [[tuple(o) for o in e.offsets] for e in encodings]
        return Encoded({k: v[0] for k, v in out.items()} if isinstance(text, str) else out)

    def __len__(self) -> int:
        if self._hf is not None:
            return len(self._hf)
        return self._tok.get_vocab_size(with_added_tokens=True)

    def _id(self, name: str) -> int | None:
        if self._hf is not None:
            return getattr(self._hf, name + "_id")
        token = getattr(self, name)
        return None if token is None else self._tok.token_to_id(token)

    @property
    def bos_token_id(self) -> int | None:
        return self._id("bos_token")

    @property
    def eos_token_id(self) -> int | None:
        return self._id("eos_token")

    @property
    def pad_token_id(self) -> int | None:
        return self._id("pad_token")

    @property
    def unk_token_id(self) -> int | None:
        return self._id("unk_token")

    @property
    def chat_template(self) -> str | None:
        if self._hf is not None:  # transformers' tokenizer is the one that renders: its template, set or loaded
            return self._hf.chat_template
        file = os.path.join(self.name_or_path, "chat_template.jinja")
        if os.path.exists(file):
            with open(file) as fh:
                return fh.read()
        return self._config.get("chat_template")

    @chat_template.setter
    def chat_template(self, template: str | None) -> None:
        self.hf.chat_template = template

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if self._hf is not None:
            return self._hf.encode(text, add_special_tokens=add_special_tokens)
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        if self._hf is not None:
            return self._hf.decode(ids, skip_special_tokens=skip_special_tokens)
        if isinstance(ids, int):
            ids = [ids]
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def convert_tokens_to_ids(self, tokens):
        if self._hf is not None:
            return self._hf.convert_tokens_to_ids(tokens)
        if isinstance(tokens, str):
            found = self._tok.token_to_id(tokens)
            return self.unk_token_id if found is None else found
        return [self.convert_tokens_to_ids(t) for t in tokens]

    def get_vocab(self) -> dict[str, int]:
        if self._hf is not None:
            return self._hf.get_vocab()
        return self._tok.get_vocab(with_added_tokens=True)

    def save_pretrained(self, directory: str) -> None:
        if self._hf is not None:
            self._hf.save_pretrained(directory)
            return
        os.makedirs(directory, exist_ok=True)
        for name in self.FILES:
            if os.path.exists(os.path.join(self.name_or_path, name)):
                shutil.copyfile(os.path.join(self.name_or_path, name), os.path.join(directory, name))


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
