"""Chat formats from a Jinja chat template: the model's own (`"template"`, the template its tokenizer ships, rendered
as `tokenizer.apply_chat_template` renders it) and ChatML (`"chatml"`, Qwen2's template, for a Qwen2 tokenizer
without one). Imports no JAX.

A template is a program, so its structure is learned by rendering probe conversations once: the header that opens
each role's turn, the assistant header (the generation prompt), and the end-of-turn token (the special token that
closes an assistant turn). The template must write role names literally (every common template does) and must be
prefix-preserving: rendering messages[:i + 1] gives a prefix of rendering messages (templates that rewrite earlier
turns, such as ones that drop past reasoning, are refused with a ValueError).

Per-token labels then come from token ids, never from string search over content:
- a message's block runs from its header (the header's special token and role name, then the header's trailing
  whitespace, the "separator") through the end-of-turn token;
- `render(messages)` tokenises the rendered text and maps each block to its message by where the block starts among
  the renders of messages[:1], messages[:2], ...: the last block that starts in message i's part of the text is
  message i, and a block before it in that part (a system message the template adds, such as a default system
  prompt or Llama-3.1's date block) belongs to no message (turn -1), as in the official Llama-3.1 renderer.
- Where the tokenizer merges the header's trailing whitespace with the content's leading whitespace into one token
  (ChatML's "\n" before a reply that starts with spaces), that token is content: a token with any content character
  is content, as in HF's assistant masks.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from sweet_jax.chat.formats import (NO_ROLE, ROLE_IDS, ChatFormat, Messages, RenderedChat, SegmentedChat,
                                    TokenizedFormat, get_format, register_maker)

__all__ = ["CHATML_TEMPLATE", "VISION_CHATML_TEMPLATE", "VISION_SPECIAL_TOKENS", "TemplateChatFormat",
           "TemplateTokenizedFormat", "format_for", "vision_chatml_tokenizer"]

# Qwen2-Instruct's template (also Qwen2.5's without tools): ChatML with a default system message.
CHATML_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
# ChatML whose messages may hold images, written as Qwen2-VL's template writes them (each image part is
# <|vision_start|><|image_pad|><|vision_end|>), with no default system message: the template of
# `vision_chatml_tokenizer`.
VISION_CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{{ '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
VISION_SPECIAL_TOKENS = ("<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>")
_PROBES = ("SWEETPROBEUSERA", "SWEETPROBEASSISTANTB", "SWEETPROBEUSERC")


def _render(template: str, messages, add_generation_prompt: bool, special: Mapping[str, str]) -> str:
    from transformers.utils.chat_template_utils import render_jinja_template

    rendered, _ = render_jinja_template([list(messages)], chat_template=template,
                                        add_generation_prompt=add_generation_prompt, **special)
    return rendered[0]


def _check_messages(messages: Messages) -> None:
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or "role" not in m or "content" not in m:
            raise ValueError(f"message {i}: expected a mapping with 'role' and 'content', got {m!r}")
        if m["role"] not in ROLE_IDS:
            raise ValueError(f"message {i}: unknown role {m['role']!r}; expected one of {sorted(ROLE_IDS)}")
        if not isinstance(m["content"], (str, list)):
            raise ValueError(f"message {i}: 'content' must be a string or a list of parts, got "
                             f"{type(m['content']).__name__}")


class TemplateChatFormat(ChatFormat):
    """The chat format a Jinja template writes. special: the template's variables for special tokens (bos_token,
    eos_token, ...: a tokenizer's `special_tokens_map`); special_tokens: every special token's text, to find the
    end-of-turn token among them."""

    def __init__(self, template: str, *, special: Mapping[str, str] | None = None,
                 special_tokens: Sequence[str] = (), name: str = "template", source: str = "the chat template"):
        self.name, self.template, self.source = name, template, source
        self.special = {k: v for k, v in (special or {}).items() if isinstance(v, str)}
        # the BOS that add_bos=False drops: only one the template writes (SmolLM2's "bos_token" is <|im_start|>,
        # which opens every ChatML turn)
        self.bos = self.special.get("bos_token", "") if "bos_token" in template else ""
        a, b, c = _PROBES
        probe = [{"role": "user", "content": a}, {"role": "assistant", "content": b}, {"role": "user", "content": c}]
        try:
            p1, p2, p3 = (self._text(probe[:i], False) for i in (1, 2, 3))
            with_prompt = self._text(probe, True)
        except Exception as e:  # a template error, whatever its type
            raise ValueError(f"{source}: rendering a user/assistant conversation failed: {e}") from None
        if not (p2.startswith(p1) and p3.startswith(p2) and with_prompt.startswith(p3)):
            raise ValueError(f"{source}: the template is not prefix-preserving (rendering more messages rewrites "
                             "earlier ones), so turns cannot be told apart")
        span_a, span_u = p2[len(p1):], p3[len(p2):]
        if b not in span_a or c not in span_u:
            raise ValueError(f"{source}: the template does not write message contents as given")
        header_a, footer = span_a.split(b)
        header_u = span_u.split(c)[0]
        self.assistant_header = with_prompt[len(p3):]
        closing = sorted((t for t in special_tokens if t and footer.startswith(t)), key=len)
        if not closing:
            raise ValueError(f"{source}: an assistant turn ends with {footer!r}, which starts with no special token "
                             "of the tokenizer: no end-of-turn token")
        self.eot = closing[-1]
        if header_u.replace("user", "assistant") != header_a or "user" not in header_u:
            raise ValueError(f"{source}: the role headers {header_u!r} and {header_a!r} do not write the role name "
                             "literally")
        self.headers = {role: header_u.replace("user", role) for role in ROLE_IDS}

    @property
    def jinja_template(self) -> str:
        return self.template

    @classmethod
    def of(cls, tokenizer, name: str = "template") -> "TemplateChatFormat":
        """The format of `tokenizer.chat_template` (cached on the tokenizer, for its template)."""
        template = getattr(tokenizer, "chat_template", None)
        cached = getattr(tokenizer, "_sweet_jax_chat_format", None)
        if cached is not None and cached.template == template:
            return cached
        where = getattr(tokenizer, "name_or_path", "") or "the tokenizer"
        if not isinstance(template, str) or not template:
            raise ValueError(f"{where}: the tokenizer has no chat template (a 'template' chat format needs one)")
        specials = list(tokenizer.all_special_tokens) + [str(t) for t in tokenizer.added_tokens_decoder.values()]
        fmt = cls(template, special=tokenizer.special_tokens_map, special_tokens=specials, name=name,
                  source=f"{where}: chat template")
        fmt.tokenizer_dir = getattr(tokenizer, "name_or_path", None)
        tokenizer._sweet_jax_chat_format = fmt
        return fmt

    def _text(self, messages, add_generation_prompt: bool) -> str:
        return _render(self.template, messages, add_generation_prompt, self.special)

    def render_text(self, messages: Messages, *, add_generation_prompt: bool = False, add_bos: bool = True,
                    date_header: bool = True) -> str:
        """The template's text (`date_header` is the template's own business here). add_bos=False drops a leading
        BOS that the template writes."""
        _check_messages(messages)
        text = self._text(messages, add_generation_prompt)
        if not add_bos and self.bos and text.startswith(self.bos):
            text = text[len(self.bos):]
        return text

    def message_ends(self, messages: Messages) -> list[int]:
        """End offset, in the rendered text, of each message's part: len(render(messages[:i + 1]))."""
        ends, previous = [], ""
        for i in range(len(messages)):
            text = self._text(messages[:i + 1], False)
            if not text.startswith(previous):
                raise ValueError(f"{self.source}: rendering message {i} rewrites the messages before it (the template "
                                 "is not prefix-preserving for this conversation)")
            ends.append(len(text))
            previous = text
        return ends

    def parse_text(self, text: str) -> list[dict]:
        """The messages of a rendered string: each role header's text up to the end-of-turn token (contents as the
        template wrote them; a system message the template added is kept). A trailing generation prompt is
        dropped."""
        found, pos = [], 0
        while True:
            hits = [(text.find(h, pos), role) for role, h in self.headers.items() if text.find(h, pos) >= 0]
            if not hits:
                break
            at, role = min(hits)
            begin = at + len(self.headers[role])
            end = text.find(self.eot, begin)
            if end < 0:  # an open turn: the generation prompt (dropped when empty) or a partial reply
                if text[begin:]:
                    found.append({"role": role, "content": text[begin:]})
                break
            found.append({"role": role, "content": text[begin:end]})
            pos = end + len(self.eot)
        return found

    def tokenized(self, tokenizer, **kwargs) -> "TemplateTokenizedFormat":
        return TemplateTokenizedFormat(self, tokenizer)

    def bundled_tokenizer_dir(self) -> str:
        path = getattr(self, "tokenizer_dir", None)
        if not path:
            raise FileNotFoundError(f"the {self.name!r} chat format ships no tokenizer: pass the model's tokenizer "
                                    "directory (a flag such as --tokenizer, or the model directory itself)")
        return path


class TemplateTokenizedFormat(TokenizedFormat):
    """A `TemplateChatFormat` bound to a tokenizer: token ids with per-token roles, turns and masks."""

    def __init__(self, fmt: TemplateChatFormat, tokenizer):
        self.fmt, self.tokenizer = fmt, tokenizer
        vocab = tokenizer.get_vocab()
        if fmt.eot not in vocab:
            raise ValueError(f"tokenizer {getattr(tokenizer, 'name_or_path', '')!r} lacks the end-of-turn token "
                             f"{fmt.eot!r} of {fmt.source}")
        self.eot_id = vocab[fmt.eot]
        encode = self._encode
        # A header's core (its special token and role name) in token ids, and how many characters of whitespace
        # (the separator) follow it.
        self._cores = {role: tuple(encode(h.rstrip())) for role, h in fmt.headers.items()}
        self._sep_chars = {role: len(h) - len(h.rstrip()) for role, h in fmt.headers.items()}
        firsts = {core[0] for core in self._cores.values() if core}
        if len(firsts) != 1:
            raise ValueError(f"{fmt.source}: role headers do not all start with the same token")
        self._start_id = firsts.pop()

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def render_text(self, messages: Messages, add_generation_prompt: bool = False, add_bos: bool = True) -> str:
        return self.fmt.render_text(messages, add_generation_prompt=add_generation_prompt, add_bos=add_bos)

    def segment(self, tokens: Sequence[int]) -> SegmentedChat:
        """Blocks found by their header tokens: a block runs from its header to its end-of-turn token (or the next
        header, or the end of the stream); the whitespace tokens after a header are its separator, the rest content.
        `turns` counts blocks."""
        ids = np.asarray(tokens, np.int32)
        n = len(ids)
        roles = np.zeros(n, np.int8)
        turns = np.full(n, -1, np.int32)
        content = np.zeros(n, bool)
        separator = np.zeros(n, bool)
        blocks = []
        for s0 in np.flatnonzero(ids == self._start_id):
            for role, core in self._cores.items():
                if tuple(ids[s0:s0 + len(core)].tolist()) == core:
                    blocks.append((int(s0), role))
                    break
        for m, (s0, role) in enumerate(blocks):
            nxt = blocks[m + 1][0] if m + 1 < len(blocks) else n
            body = s0 + len(self._cores[role])
            chars = self._sep_chars[role]
            while chars > 0 and body < nxt and body < n:
                piece = self.tokenizer.decode([int(ids[body])])
                if not piece or piece.strip() or len(piece) > chars:
                    break
                separator[body] = True
                chars -= len(piece)
                body += 1
            close = np.flatnonzero(ids[body:nxt] == self.eot_id)
            stop = body + int(close[0]) + 1 if len(close) else nxt
            roles[s0:stop] = ROLE_IDS[role]
            turns[s0:stop] = m
            content[body:stop] = True
        return SegmentedChat(tokens=ids, roles=roles, turns=turns, content=content, separator=separator)

    def render(self, messages: Messages, add_generation_prompt: bool = False, add_bos: bool = True) -> RenderedChat:
        text = self.fmt.render_text(messages, add_generation_prompt=add_generation_prompt, add_bos=add_bos)
        enc = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        seg = self.segment(enc["input_ids"])
        shift = len(self.fmt.render_text(messages, add_generation_prompt=add_generation_prompt)) - len(text)  # a BOS
        ends = [e - shift for e in self.fmt.message_ends(messages)]
        starts = [int(i) for i in np.flatnonzero(np.diff(np.concatenate([[-1], seg.turns])) != 0) if seg.turns[i] >= 0]
        turns = np.full(len(seg), -1, np.int32)
        owner: dict[int, int] = {}
        for t in starts:
            char = enc["offset_mapping"][t][0]
            owner[int(seg.turns[t])] = next((i for i, e in enumerate(ends) if char < e), len(messages))
        for block, message in owner.items():
            later = [b for b, m in owner.items() if m == message and b > block]
            if later:
                continue  # an earlier block in the same message's part: one the template added
            if message < len(messages):
                want = ROLE_IDS[messages[message]["role"]]
                got = seg.roles[seg.turns == block][0]
                if got != want:
                    raise ValueError(f"{self.fmt.source}: message {message} ({messages[message]['role']}) was "
                                     f"rendered under another role's header")
            turns[seg.turns == block] = message
        keep = seg.turns >= 0
        roles = np.where(keep, seg.roles, NO_ROLE).astype(np.int8)
        return RenderedChat(tokens=seg.tokens, roles=roles, turns=turns, content=seg.content & keep)


def vision_chatml_tokenizer():
    """The bundled Llama-3 tokenizer given ChatML's and Qwen2-VL's special tokens (`VISION_SPECIAL_TOKENS`, appended
    after its vocabulary) and `VISION_CHATML_TEMPLATE`: what a random-init tiny vision-language model ships, since no
    Qwen tokenizer is at hand offline."""
    from sweet_jax.chat.llama3 import bundled_llama3_tokenizer_dir
    from sweet_jax.chat.tokenizers import load_tokenizer

    tok = load_tokenizer(bundled_llama3_tokenizer_dir())
    tok.add_special_tokens({"additional_special_tokens": list(VISION_SPECIAL_TOKENS)})
    tok.chat_template = VISION_CHATML_TEMPLATE
    return tok


def format_for(tokenizer, name: str | None = None, default: str | None = None) -> ChatFormat:
    """The chat format a job uses with `tokenizer`: the one named (`"template"`: the tokenizer's own template), else
    the tokenizer's own template when it has one (as vLLM and `apply_chat_template` do), else `default` (a model
    family's format, `models.families`)."""
    if name == "template" or (name is None and getattr(tokenizer, "chat_template", None)):
        return TemplateChatFormat.of(tokenizer)
    return get_format(name or default)


register_maker("chatml", lambda: TemplateChatFormat(CHATML_TEMPLATE, special_tokens=("<|im_start|>", "<|im_end|>"),
                                                    name="chatml", source="the ChatML chat format"))
