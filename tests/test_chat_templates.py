"""Chat formats from a model's own Jinja template (`sweet_jax.chat.templates`), against transformers'
`apply_chat_template` on real templates and tokenizers: Meta's Llama-3.1 template (as TRL ships it) with the real
Llama-3 tokenizer, where the template path must also equal the official Llama-3.1 renderer in every per-token label;
SmolLM2's ChatML template with its real tokenizer; and Qwen2-VL's template (byte-identical to Qwen2.5-VL's, as TRL
ships it) with images."""

import copy
import importlib.resources

import numpy as np
import pytest
from system import smollm2_dir
from test_chat import COLBENCH_CHAT

from sweet_jax import chat
from sweet_jax.chat import ASSISTANT, ROLE_IDS, load_tokenizer
from sweet_jax.chat.llama3 import Llama31ChatFormat, bundled_llama3_tokenizer_dir
from sweet_jax.chat.templates import TemplateChatFormat

NO_SYSTEM = COLBENCH_CHAT[1:]


def _trl_template(name: str) -> str:
    return (importlib.resources.files("trl") / "chat_templates" / name).read_text()


def _with_template(tok, template: str):
    tok = copy.deepcopy(tok)
    tok.chat_template = template
    return tok


@pytest.fixture(scope="module")
def llama():
    return _with_template(load_tokenizer(bundled_llama3_tokenizer_dir()), _trl_template("llama3_1.jinja"))


@pytest.fixture(scope="module")
def smol():
    return load_tokenizer(smollm2_dir())


@pytest.fixture(scope="module")
def qwen2_vl(smol):
    tok = copy.deepcopy(smol)
    tok.add_special_tokens({"additional_special_tokens": ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>"]})
    tok.chat_template = _trl_template("qwen2_5_vl.jinja")
    return tok


def _reference(tok, messages, gen):
    return tok.apply_chat_template(messages, add_generation_prompt=gen, tokenize=True)["input_ids"]


def _assistant_texts(tok, rendered):
    """The decoded text of each assistant turn's masked tokens."""
    mask = rendered.assistant_mask
    return [tok.decode(rendered.tokens[mask & (rendered.turns == t)]) for t in np.unique(rendered.turns[mask])]


def _is_content(decoded: str, content: str, eot: str) -> bool:
    """decoded == content + eot, but for the header's newline where the tokenizer merged it into a token with the
    content's leading whitespace (a token with any content character is content, as in HF's assistant masks)."""
    return decoded.endswith(content + eot) and decoded[:-len(content + eot)] in ("", "\n")


@pytest.mark.parametrize("messages", [COLBENCH_CHAT, NO_SYSTEM], ids=["system", "no_system"])
@pytest.mark.parametrize("gen", [False, True])
def test_meta_llama31_template_equals_apply_chat_template_and_the_official_renderer(llama, messages, gen):
    fmt = chat.format_for(llama)
    assert isinstance(fmt, TemplateChatFormat) and fmt.eot == "<|eot_id|>"
    ours = fmt.tokenized(llama).render(messages, add_generation_prompt=gen)
    assert ours.tokens.tolist() == _reference(llama, messages, gen)
    official = Llama31ChatFormat(llama).render(messages, add_generation_prompt=gen)
    for field in ("tokens", "roles", "turns", "content"):
        np.testing.assert_array_equal(getattr(ours, field), getattr(official, field), err_msg=field)
    assert fmt.render_text(messages, add_generation_prompt=gen) == \
        Llama31ChatFormat(llama).render_text(messages, add_generation_prompt=gen)
    # segmenting the token stream gives the official segmentation, separators included
    seg, want = fmt.tokenized(llama).segment(ours.tokens), Llama31ChatFormat(llama).segment(ours.tokens)
    for field in ("roles", "turns", "content", "separator"):
        np.testing.assert_array_equal(getattr(seg, field), getattr(want, field), err_msg=field)


@pytest.mark.parametrize("messages", [COLBENCH_CHAT, NO_SYSTEM], ids=["system", "no_system"])
@pytest.mark.parametrize("gen", [False, True])
def test_chatml_template_of_smollm2_equals_apply_chat_template(smol, messages, gen):
    fmt = chat.format_for(smol)
    assert fmt.eot == "<|im_end|>" and fmt.assistant_header == "<|im_start|>assistant\n"
    rendered = fmt.tokenized(smol).render(messages, add_generation_prompt=gen)
    assert rendered.tokens.tolist() == _reference(smol, messages, gen)
    # each assistant turn's mask is its content and its <|im_end|>, nothing else (ChatML keeps content untrimmed)
    replies = [m["content"] for m in messages if m["role"] == "assistant"]
    texts = _assistant_texts(smol, rendered)
    assert len(texts) == len(replies) and all(_is_content(t, r, "<|im_end|>") for t, r in zip(texts, replies))
    # roles and message indices: every message's content tokens decode to its content
    for i, m in enumerate(messages):
        sel = (rendered.turns == i) & rendered.content
        assert (rendered.roles[rendered.turns == i] == ROLE_IDS[m["role"]]).all()
        assert _is_content(smol.decode(rendered.tokens[sel]), m["content"], "<|im_end|>")
        header = smol.decode(rendered.tokens[(rendered.turns == i) & ~rendered.content])
        assert header.startswith(f"<|im_start|>{m['role']}") and header.strip() == f"<|im_start|>{m['role']}"
    if messages[0]["role"] != "system":  # SmolLM2's default system message belongs to no message
        assert (rendered.roles[rendered.turns == -1] != ASSISTANT).all()
        assert "SmolLM" in smol.decode(rendered.tokens[(rendered.turns == -1) & rendered.content])
    if gen:
        assert smol.decode(rendered.tokens[rendered.turns == len(messages)]) == "<|im_start|>assistant\n"
    # the text round trip
    parsed = fmt.parse_text(fmt.render_text(messages, add_generation_prompt=gen))
    assert parsed[-len(messages):] == [{"role": m["role"], "content": m["content"]} for m in messages]


def test_the_registered_chatml_format_renders_like_the_template_given_a_system_message(smol):
    ours = chat.get_format("chatml").tokenized(smol).render(COLBENCH_CHAT, add_generation_prompt=True)
    assert ours.tokens.tolist() == _reference(smol, COLBENCH_CHAT, True)


def test_qwen2_vl_template_with_two_images(qwen2_vl):
    messages = [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "This is my design."},
                                     {"type": "image"}, {"type": "text", "text": "How close is yours?"}]},
        {"role": "assistant", "content": "The header is too dark."},
        {"role": "user", "content": [{"type": "text", "text": "Fix it."}]},
        {"role": "assistant", "content": "<html>fixed</html>"},
    ]
    fmt = chat.format_for(qwen2_vl)
    for gen in (False, True):
        rendered = fmt.tokenized(qwen2_vl).render(messages[:3] if gen else messages, add_generation_prompt=gen)
        assert rendered.tokens.tolist() == _reference(qwen2_vl, messages[:3] if gen else messages, gen)
    rendered = fmt.tokenized(qwen2_vl).render(messages)
    pad = qwen2_vl.convert_tokens_to_ids("<|image_pad|>")
    at = rendered.tokens == pad
    assert at.sum() == 2 and (rendered.turns[at] == 0).all() and (rendered.roles[at] == ROLE_IDS["user"]).all()
    assert _assistant_texts(qwen2_vl, rendered) == ["The header is too dark.<|im_end|>", "<html>fixed</html><|im_end|>"]
    assert "You are a helpful assistant." in qwen2_vl.decode(rendered.tokens[rendered.turns == -1])


def test_a_template_that_rewrites_earlier_turns_is_refused(smol):
    last_only = "{% for m in messages %}{% if loop.last %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}" \
                "<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    with pytest.raises(ValueError, match="prefix-preserving"):
        chat.format_for(_with_template(smol, last_only))


def test_a_tokenizer_without_a_template_gets_the_family_format():
    tok = load_tokenizer(bundled_llama3_tokenizer_dir())
    assert chat.format_for(tok, default="llama3") is chat.get_format("llama3")
    with pytest.raises(ValueError, match="no chat template"):
        chat.format_for(tok, "template")


def test_llama31_trajectories_are_re_rendered_in_the_models_own_format(smol):
    """A prompt in the Llama-3.1 format (the official trajectories) becomes the ChatML of the model's template; the
    response mask is the reply and its <|im_end|>."""
    from sweet_jax.chat.llama3 import render_text
    from sweet_jax.data.examples import ExampleBuilder

    prompt = render_text(COLBENCH_CHAT[:-1], add_generation_prompt=True)
    builder = ExampleBuilder(smol, 4096, chat_format=chat.format_for(smol), score_span="response")
    ex = builder.from_text(prompt, "def f(x):\n    return x", "test")
    want = smol.apply_chat_template([{"role": m["role"], "content": m["content"].strip()} for m in COLBENCH_CHAT[:-1]],
                                    add_generation_prompt=True, tokenize=True)["input_ids"]
    assert ex.tokens[:len(want)].tolist() == want
    assert smol.decode(ex.tokens[ex.response_mask]) == "def f(x):\n    return x<|im_end|>"
    assert "<|start_header_id|>" not in smol.decode(ex.tokens) and "Cutting Knowledge" not in smol.decode(ex.tokens)


def test_add_bos_false_drops_only_a_bos_the_template_writes(llama, smol):
    meta = chat.format_for(llama)
    assert meta.render_text(NO_SYSTEM, add_bos=False) == meta.render_text(NO_SYSTEM)[len("<|begin_of_text|>"):]
    chatml = chat.format_for(smol)  # its bos_token is <|im_start|>, which its template never writes as a BOS
    assert chatml.render_text(NO_SYSTEM, add_bos=False) == chatml.render_text(NO_SYSTEM)
