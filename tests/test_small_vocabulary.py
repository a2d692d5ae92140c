"""The Llama-3 tokenizer cut down to 8k entries (`bundled:llama3-8k`, `chat.tokenizers.cut_vocabulary`), which the
toy-scale configs use, checked against the full tokenizer it is cut from; the cache directory it is written to once."""

import json
import os
import threading

import numpy as np
import pytest

from sweet_jax.chat import get_format, load_tokenizer, special_token_id, tokenizer_dir
from sweet_jax.chat.tokenizers import SMALL_VOCABULARIES, cut_vocabulary
from sweet_jax.colbench.synthetic import make_dataset
from sweet_jax.files.atomic import directory_once

TEXTS = ["def solve(x):\n    return x * 17\n", "  leading spaces, \u00e9t\u00e9, \u4e2d\u6587, emoji \U0001f600",
         "Which number should it use? I WANT TO ANSWER:\n```python\ndef adjust(x):\n    return x - 43\n```",
         "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|><|reserved_special_token_7|>", "", "\n\n\t \r\n"]


@pytest.fixture(scope="module")
def tokenizers():
    return load_tokenizer(tokenizer_dir("bundled:llama3")), load_tokenizer(tokenizer_dir("bundled:llama3-8k"))


def test_the_cut_tokenizer_has_8k_entries_and_every_special_token_in_its_order(tokenizers):
    full, small = tokenizers
    assert len(small) == SMALL_VOCABULARIES["llama3-8k"][1] == 8192
    specials = sorted(full.added_tokens_decoder.items())
    assert len(specials) == 257  # the 256 of Llama-3 and the 3.2 tokenizer's <|image|>
    assert [(i, t.content) for i, t in sorted(small.added_tokens_decoder.items())] == \
        [(8192 - 257 + k, t.content) for k, (_, t) in enumerate(specials)]
    assert small.convert_tokens_to_ids("<|begin_of_text|>") == 7935 and small.bos_token == full.bos_token
    assert (small.eos_token, small.pad_token) == (full.eos_token, full.pad_token)
    # the ordinary tokens are the full tokenizer's first 7,935, with their ids
    ordinary = small.convert_ids_to_tokens(list(range(7935)))
    assert ordinary == full.convert_ids_to_tokens(list(range(7935)))


def test_every_text_encodes_to_tokens_of_the_full_vocabulary_and_decodes_to_itself(tokenizers):
    full, small = tokenizers
    records = make_dataset(20, rollouts=1, seed=3, compact=True)
    texts = TEXTS + [m["content"] for r in records for m in r["dialogue_history"]]
    for text in texts:
        ids = small.encode(text, add_special_tokens=False)
        assert small.decode(ids) == text == full.decode(full.encode(text, add_special_tokens=False))
        specials = {i for i in ids if i >= 7935}
        pieces = small.convert_ids_to_tokens(ids)
        # ordinary pieces are full-vocabulary tokens with the same id; special ones the full tokenizer's specials
        assert all(full.convert_tokens_to_ids(p) == i for p, i in zip(pieces, ids) if i not in specials)
        assert all(full.convert_tokens_to_ids(p) == 128000 + i - 7935 for p, i in zip(pieces, ids) if i in specials)
        # where the full tokenizer's encoding uses only kept tokens, the cut one's is the same
        reference = full.encode(text, add_special_tokens=False)
        if all(i < 7935 for i in reference):
            assert ids == reference
    # the cut tokenizer is coarser only where the full one used a rarer token: ~20% more tokens on this data
    n_small = sum(len(small.encode(t)) for t in texts)
    n_full = sum(len(full.encode(t)) for t in texts)
    assert n_full < n_small < 1.5 * n_full


def test_the_llama3_chat_format_renders_and_segments_with_the_cut_tokenizer(tokenizers):
    _, small = tokenizers
    messages = [{"role": "system", "content": "Ask, then answer."}, {"role": "user", "content": "Multiply it by?"},
                {"role": "assistant", "content": "Which number should it use?"}, {"role": "user", "content": "17"}]
    fmt = get_format("llama3").tokenized(small)
    rendered = fmt.render(messages, add_generation_prompt=True)
    text = get_format("llama3").render_text(messages, add_generation_prompt=True)
    assert rendered.tokens.tolist() == small.encode(text, add_special_tokens=False)
    segmented = fmt.segment(rendered.tokens)
    assert np.array_equal(segmented.roles, rendered.roles) and np.array_equal(segmented.turns, rendered.turns)
    assert fmt.eot_id == small.convert_tokens_to_ids("<|eot_id|>") == 7935 + 9
    assert max(fmt.stop_ids) < 8192 and fmt.pad_id == 7935 + 4  # <|finetune_right_pad_id|>


def test_a_score_head_critic_on_the_cut_tokenizer_pads_with_its_finetune_pad_token():
    from sweet_jax.training.defaults import recipe_tiny
    from sweet_jax.training.job_config import JobConfig
    from sweet_jax.training.job_setup import job_model

    c = recipe_tiny("reward", "x")
    cfg = job_model(JobConfig.load(c))
    assert cfg.score_head and cfg.pad_token_id == 7935 + 4 == special_token_id(
        tokenizer_dir(c.tokenizer_path), "<|finetune_right_pad_id|>")
    c.tokenizer_path, c.model.preset_overrides.vocab_size = "", 128256  # the full bundled tokenizer
    assert job_model(JobConfig.load(c)).pad_token_id == 128004


def test_a_size_without_room_for_the_byte_tokens_and_a_tokenizer_that_is_not_a_byte_level_bpe_are_refused(tmp_path):
    src = tokenizer_dir("bundled:llama3")
    with pytest.raises(ValueError, match="do not hold its 257 special tokens and the 256 byte tokens"):
        cut_vocabulary(src, str(tmp_path), 257 + 200)
    spec = json.load(open(os.path.join(src, "tokenizer.json")))
    spec["model"]["type"] = "WordPiece"
    (tmp_path / "wp").mkdir()
    (tmp_path / "wp" / "tokenizer.json").write_text(json.dumps(spec))
    with pytest.raises(ValueError, match="only a byte-level BPE tokenizer can be cut down"):
        cut_vocabulary(str(tmp_path / "wp"), str(tmp_path), 8192)
    with pytest.raises(FileNotFoundError, match="bundled:llama3-8k"):
        tokenizer_dir("bundled:llama3-4k")


def test_a_cache_directory_is_made_once_by_the_first_of_racing_writers_and_never_replaced(tmp_path):
    target = tmp_path / "entry"
    start = threading.Barrier(4)
    errors = []

    def writer(k):
        start.wait()
        try:
            with directory_once(target) as tmp:
                if tmp:
                    for part in range(20):
                        with open(os.path.join(tmp, f"part{part}"), "w") as f:
                            f.write(str(k))
        except Exception as e:  # noqa: BLE001 (any error of a writer fails the test)
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    written = {p.name: p.read_text() for p in target.iterdir()}
    assert len(written) == 20 and len(set(written.values())) == 1  # one writer's whole content
    assert sorted(p.name for p in tmp_path.iterdir()) == ["entry"]  # no temporary directory left
    with directory_once(target) as tmp:
        assert tmp is None
    with pytest.raises(RuntimeError):
        with directory_once(tmp_path / "failed") as tmp:
            raise RuntimeError("killed half way")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["entry"]


def test_a_tokenizer_that_does_not_belong_to_the_model_is_one_clear_error(tmp_path):
    """The full Llama-3 tokenizer with the tiny configs' 8k model, and the 8k Llama-3 tokenizer with a ChatML model:
    each is refused before training, naming the settings to change."""
    import subprocess
    import sys

    import budget

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def train(*extra):
        cmd = [sys.executable, "-m", "sweet_jax.train", "--config", os.path.join(root, "configs", "critic_tiny.py"),
               f"--config.train.output_dir={tmp_path / 'run'}", "--config.data.synthetic.num_tasks=12", *extra]
        return subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=budget.time_left())

    full = train("--config.tokenizer_path=bundled:llama3")
    assert full.returncode == 2 and "Traceback" not in full.stderr, full.stderr[-2000:]
    assert "but the model's vocabulary has 8192 entries: the tokenizer (bundled:llama3) does not belong to the " \
           "model (settings tokenizer_path, model.hf_path, model.preset_overrides.vocab_size)" in full.stderr
    chatml = train("--config.model.preset=qwen2-tiny")
    assert chatml.returncode == 2 and "Traceback" not in chatml.stderr, chatml.stderr[-2000:]
    assert "lacks the end-of-turn token '<|im_end|>' of the ChatML chat format: the tokenizer does not fit the " \
           "model (settings tokenizer_path, model.hf_path)" in chatml.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()
