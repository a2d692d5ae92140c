"""The chat-format interface: how a model family writes a conversation as text and tokens, and the registry of the
formats by name. Imports no JAX.

A `ChatFormat` works on text alone (render, parse, the end-of-turn and assistant-header strings, the tokenizer a
format ships with); `ChatFormat.tokenized(tokenizer)` gives the `TokenizedFormat` that renders messages to token ids
with per-token roles, message indices and the assistant mask, recovers them from templated token ids, and knows the
stop and pad ids. Formats register themselves by name (`register`); `get_format(name)` looks one up, and
`DEFAULT_FORMAT` is what a job uses when it names none.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Callable, Mapping, Sequence

import numpy as np

ROLE_IDS = {"system": 1, "user": 2, "assistant": 3, "ipython": 4, "tool": 4}
NO_ROLE = 0
ASSISTANT = ROLE_IDS["assistant"]
DEFAULT_FORMAT = "llama3"
# each model family's chat format (HF config.json "model_type" -> format name): what a tokenizer without a chat
# template of its own is rendered with (`models.families` reads it from here)
FAMILY_FORMATS = {"llama": "llama3", "qwen2": "chatml", "qwen2_vl": "chatml"}

Messages = Sequence[Mapping[str, str]]


@dataclasses.dataclass(frozen=True)
class RenderedChat:
    """A rendered conversation. All arrays have one entry per token."""

    tokens: np.ndarray  # int32 token ids
    roles: np.ndarray  # int8 role id (ROLE_IDS) of the message the token belongs to; NO_ROLE outside any message
    turns: np.ndarray  # int32 message index (in the messages given); -1 outside any message
    content: np.ndarray  # bool: the token is message content or the message's closing end-of-turn token

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def assistant_mask(self) -> np.ndarray:
        """Assistant content tokens and their end-of-turn token; no header, no separator."""
        return self.content & (self.roles == ASSISTANT)

    @property
    def assistant_turns(self) -> np.ndarray:
        """int32: 0, 1, ... for tokens of the 1st, 2nd, ... assistant message (any token of it); -1 elsewhere."""
        is_asst = self.roles == ASSISTANT
        messages = np.unique(self.turns[is_asst])
        return np.where(is_asst, np.searchsorted(messages, self.turns), -1).astype(np.int32)


@dataclasses.dataclass(frozen=True)
class SegmentedChat(RenderedChat):
    """A RenderedChat recovered from token ids, plus the separator token that follows each header (the official
    SWEET-RL mask includes it)."""

    separator: np.ndarray = None  # bool

    @property
    def official_assistant_mask(self) -> np.ndarray:
        """The official code's multi-turn mask: from the token after the header's end through the end of turn."""
        return (self.content | self.separator) & (self.roles == ASSISTANT)


class TokenizedFormat(abc.ABC):
    """A chat format bound to one tokenizer."""

    tokenizer: object
    eot_id: int  # the end-of-turn token: a turn's last token, and a stop token

    @abc.abstractmethod
    def render(self, messages: Messages, add_generation_prompt: bool = False, add_bos: bool = True) -> RenderedChat:
        """Token ids with per-token roles, message indices and content flags."""

    @abc.abstractmethod
    def segment(self, tokens: Sequence[int]) -> SegmentedChat:
        """Roles, message indices and masks of an already-templated token stream; ValueError when it is not in
        this format."""

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """Where generation stops: the end-of-turn token and the tokenizer's EOS."""
        eos = self.tokenizer.eos_token_id
        return tuple(sorted({t for t in (self.eot_id, eos) if isinstance(t, int) and t >= 0}))

    @property
    def pad_id(self) -> int:
        """What pads a batch row: the tokenizer's pad token, else its BOS (padding is masked out either way)."""
        tok = self.tokenizer
        return tok.pad_token_id if tok.pad_token_id is not None else tok.bos_token_id


class ChatFormat(abc.ABC):
    """A model family's chat format, on text."""

    name: str
    eot: str  # the end-of-turn token's text
    assistant_header: str  # the text that opens an assistant turn: the generation prompt
    score_pad_token: str | None = None  # a special token that never occurs in text, to pad score-head batches with
    # the format as a Jinja chat template (the same text as `render_text`): what a server that renders chats itself
    # (vLLM) is given for a model whose tokenizer has no template of its own
    jinja_template: str | None = None

    @abc.abstractmethod
    def render_text(self, messages: Messages, *, add_generation_prompt: bool = False, add_bos: bool = True,
                    date_header: bool = True) -> str:
        """The conversation as the prompt string an OpenAI-compatible completions endpoint receives."""

    @abc.abstractmethod
    def parse_text(self, text: str) -> list[dict]:
        """The messages of a rendered string (`render_text`'s inverse as far as it goes); a trailing generation
        prompt is dropped."""

    @abc.abstractmethod
    def tokenized(self, tokenizer, **kwargs) -> TokenizedFormat:
        """This format for one tokenizer; ValueError if the tokenizer lacks the format's special tokens."""

    @abc.abstractmethod
    def bundled_tokenizer_dir(self) -> str:
        """A tokenizer directory for this format that needs no download; FileNotFoundError saying how to get one."""


_FORMATS: dict[str, ChatFormat] = {}
_MAKERS: dict[str, Callable[[], ChatFormat]] = {}  # formats made when first asked for (see `register_maker`)


def register(fmt: ChatFormat) -> ChatFormat:
    _FORMATS[fmt.name] = fmt
    return fmt


def register_maker(name: str, make: Callable[[], ChatFormat]) -> None:
    """Register the format `name`, made by `make()` when first asked for: a Jinja template's format renders its
    template to find the turns, which imports transformers, so importing the chat package does not."""
    _MAKERS[name] = make


def get_format(name: str | None = None) -> ChatFormat:
    """The registered chat format `name` (default `DEFAULT_FORMAT`)."""
    name = name or DEFAULT_FORMAT
    if name not in _FORMATS and name in _MAKERS:
        register(_MAKERS.pop(name)())
    if name not in _FORMATS:
        raise ValueError(f"unknown chat format {name!r}; the formats are {', '.join(format_names())}")
    return _FORMATS[name]


def format_names() -> tuple[str, ...]:
    return tuple(sorted({*_FORMATS, *_MAKERS}))
