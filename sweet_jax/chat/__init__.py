"""Chat formats: the interface (`formats`), its implementations (`llama3`, the official Llama-3.1 renderer;
`templates`, any model's own Jinja chat template, and ChatML), Llama-3.1 prompts rewritten in another format
(`convert`), and tokenizer loading with its fallbacks and the bundled tokenizers, `bundled:llama3` and its 8k cut
`bundled:llama3-8k` (`tokenizers`).
Imports no JAX.

    from sweet_jax import chat
    fmt = chat.get_format()                       # the default ("llama3"), or chat.get_format("chatml")
    fmt = chat.format_for(tokenizer)              # the tokenizer's own template if it has one, else the default
    prompt = fmt.render_text(messages, add_generation_prompt=True)
    rendered = fmt.tokenized(tokenizer).render(messages)     # tokens, roles, turns, assistant mask
"""

from sweet_jax.chat import llama3  # noqa: F401  (registers the "llama3" format)
from sweet_jax.chat.templates import TemplateChatFormat, format_for, vision_chatml_tokenizer  # registers "chatml"
from sweet_jax.chat.formats import (ASSISTANT, DEFAULT_FORMAT, NO_ROLE, ROLE_IDS, ChatFormat, RenderedChat,
                                    SegmentedChat, TokenizedFormat, format_names, get_format, register)
from sweet_jax.chat.tokenizers import (BUNDLED, find_tokenizer, has_tokenizer, load_tokenizer, special_token_id,
                                       tokenizer_dir)

__all__ = ["ASSISTANT", "BUNDLED", "DEFAULT_FORMAT", "NO_ROLE", "ROLE_IDS", "ChatFormat", "RenderedChat", "SegmentedChat",
           "TemplateChatFormat", "TokenizedFormat", "find_tokenizer", "format_for", "format_names", "get_format",
           "has_tokenizer", "load_tokenizer", "register", "special_token_id", "tokenizer_dir", "vision_chatml_tokenizer"]
