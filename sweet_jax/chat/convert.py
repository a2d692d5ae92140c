"""Prompts written in the Llama-3.1 chat format (the official ColBench trajectories are) rewritten in another chat
format: parsed into their messages, the Llama-3.1 date preamble dropped from the system message, and rendered with
the other format's generation prompt. Imports no JAX."""

from __future__ import annotations

from sweet_jax.chat import llama3
from sweet_jax.chat.formats import ChatFormat


def split_prefix(text: str) -> tuple[str, str]:
    """(prefix, prompt): the text before a Llama-3.1 prompt's begin-of-text token (the information prefix of an
    official pair file's input), and the prompt from that token on; ("", text) when there is no such token."""
    at = text.find(llama3.BOS)
    return (text[:at], text[at:]) if at > 0 else ("", text)


def in_format(prompt: str, fmt: ChatFormat) -> str:
    """`prompt` in `fmt`: unchanged when it is not in the Llama-3.1 format or when `fmt` is a Llama-3 format (the
    official renderer, or Meta's own template, which read it as it is)."""
    if fmt.eot == llama3.EOT or llama3.START_HEADER not in prompt:
        return prompt
    messages = llama3.parse_text(prompt)
    preamble = llama3.date_preamble()
    if messages and messages[0]["role"] == "system" and messages[0]["content"].startswith(preamble):
        rest = messages[0]["content"][len(preamble):]
        messages = ([{"role": "system", "content": rest}] if rest else []) + messages[1:]
    return fmt.render_text(messages, add_generation_prompt=True)
