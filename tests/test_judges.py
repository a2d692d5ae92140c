"""The judges of `sweet_jax.ranking.judges` against full-sequence references: each scores, on the shared-prefix cache,
exactly what its model sees when the whole text is tokenised and run at once (for the score heads, the text their
training examples have)."""

import random

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sweet_jax import models, objectives
from sweet_jax.chat import load_tokenizer
from sweet_jax.chat.llama3 import bundled_llama3_tokenizer_dir, render_text
from sweet_jax.colbench import synthetic
from sweet_jax.colbench.env import BackendEpisode
from sweet_jax.data.examples import ExampleBuilder
from sweet_jax.files.errors import DataError
from sweet_jax.ranking.judges import CANDIDATE_SLOT, LLM_JUDGE_INFO, LLM_JUDGE_PROMPT, Judge

CFG = models.LlamaConfig.preset("tiny", hidden_size=32, intermediate_size=64, num_layers=1, num_heads=4,
                                num_kv_heads=2)
CANDIDATES = ["Which number should it use?", "I WANT TO ANSWER:\ndef solve(x):\n    return x + 3  ", "ok"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("judges")
    head = CFG.replace(score_head=True)
    models.save_hf_params(models.init_params(head, jax.random.key(0), std=0.3), head, d / "head")
    models.save_hf_params(models.init_params(CFG, jax.random.key(1), std=0.3), CFG, d / "lm")
    task = synthetic.make_ask_task(random.Random(0), task_id="t0")
    ep = BackendEpisode(task, max_steps=3)
    ep.step("Could you tell me more?")
    ep.add_reply("I do not know.")
    return d, task, ep.agent_prompt(), load_tokenizer(bundled_llama3_tokenizer_dir())


@pytest.mark.parametrize("kind", ["head", "value"])
@pytest.mark.parametrize("no_info", [False, True])
def test_score_head_judges_score_the_training_text(setup, kind, no_info):
    d, task, prompt, tok = setup
    judge = Judge(str(d / "head"), kind=kind, no_info=no_info)
    got = judge(prompt, task["ground_truth"], CANDIDATES, [0.0] * 3, [0.0] * 3)
    builder = ExampleBuilder(tok, 4096, with_info=not no_info, score_span="response")
    params = models.load_hf_params(d / "head")
    for cand, score in zip(CANDIDATES, got):
        info = "" if no_info else builder.info_prefix(task, "test")
        ex = builder.from_text(prompt, cand, "test", info_prefix=info)  # what the trainer tokenises
        v = np.asarray(models.token_values(params, judge.cfg, jnp.asarray(ex.tokens[None])))[0]
        want = v[-1] if kind == "value" else v.mean()
        assert score == pytest.approx(float(want), abs=1e-5)


def test_llm_judge_is_the_yes_minus_no_log_odds_of_the_whole_prompt(setup):
    d, task, prompt, tok = setup
    judge = Judge(str(d / "lm"), kind="llm")
    got = judge(prompt, task["ground_truth"], CANDIDATES, [0.0] * 3, [0.0] * 3)
    params = models.load_hf_params(d / "lm")
    dialogue = prompt.split("<|eot_id|>", 1)[1]  # past the system message
    assert task["problem_description"].strip() in dialogue
    yes, no = tok.convert_tokens_to_ids("Yes"), tok.convert_tokens_to_ids("No")
    for cand, score in zip(CANDIDATES, got):
        messages = [{"role": "user", "content": task["problem_description"]},
                    {"role": "assistant", "content": "Could you tell me more?"},
                    {"role": "user", "content": "I do not know."}]
        question = LLM_JUDGE_PROMPT.format(
            info=LLM_JUDGE_INFO.format(ground_truth=task["ground_truth"].strip()),
            dialogue="\n\n\n\n".join(f"{m['role']}:{m['content'].strip()}" for m in messages), candidate=cand.strip())
        assert CANDIDATE_SLOT not in question
        ids = tok.encode(render_text([{"role": "user", "content": question}], add_generation_prompt=True),
                         add_special_tokens=False)
        logits = models.forward(params, CFG, jnp.asarray([ids]))[0, -1]
        lp = jax.nn.log_softmax(logits)
        assert score == pytest.approx(float(lp[yes] - lp[no]), abs=1e-4)


def test_llm_judge_with_a_tokenizer_that_splits_yes_scores_the_log_odds_of_the_whole_answers(setup):
    """The toy configs' 8k tokenizer writes "Yes" as two tokens ("Y", "es"): the score is log p(Y, es) - log p(No),
    each answer's tokens after the whole prompt."""
    d, task, prompt, _ = setup
    from sweet_jax.chat import load_tokenizer, tokenizer_dir

    tok = load_tokenizer(tokenizer_dir("bundled:llama3-8k"))
    yes, no = (tok.encode(a, add_special_tokens=False) for a in ("Yes", "No"))
    assert len(yes) == 2 and len(no) == 1
    cfg = CFG.replace(vocab_size=8192)
    params = models.init_params(cfg, jax.random.key(2), std=0.3)
    models.save_hf_params(params, cfg, d / "lm8k")
    judge = Judge(str(d / "lm8k"), kind="llm", tokenizer="bundled:llama3-8k")
    got = judge(prompt, task["ground_truth"], CANDIDATES, [0.0] * 3, [0.0] * 3)
    messages = [m for m in judge.chat.parse_text(prompt) if m["role"] != "system"]
    for cand, score in zip(CANDIDATES, got):
        question = LLM_JUDGE_PROMPT.format(
            info=LLM_JUDGE_INFO.format(ground_truth=task["ground_truth"].strip()),
            dialogue="\n\n\n\n".join(f"{m['role']}:{m['content'].strip()}" for m in messages), candidate=cand.strip())
        ids = tok.encode(render_text([{"role": "user", "content": question}], add_generation_prompt=True),
                         add_special_tokens=False)

        def answer_logprob(answer):
            lp = objectives.token_logprobs(params, cfg, jnp.asarray([ids + answer]))[0]
            return float(lp[-len(answer):].sum())

        assert score == pytest.approx(answer_logprob(yes) - answer_logprob(no), abs=1e-4)


def test_a_judge_of_the_wrong_kind_for_its_model_is_refused(setup):
    d, *_ = setup
    with pytest.raises(DataError, match="score-head model"):
        Judge(str(d / "lm"), kind="value")
    with pytest.raises(DataError, match="causal LM"):
        Judge(str(d / "head"), kind="critic")


def test_judge_specs_parse_kinds_and_options():
    from sweet_jax.ranking.selection import parse_judges

    got = parse_judges(["a=/m", "b=/h:head:no-info", "c=/v:value", "d=/p:llm", "e=/c:sum:no-header"])
    assert {k: v["kind"] for k, v in got.items()} == {"a": "critic", "b": "head", "c": "value", "d": "llm",
                                                      "e": "critic"}
    assert got["b"]["no_info"] and got["e"]["use_sum"] and got["e"]["no_header"]
    for bad, msg in (("x=/m:head:value", "more than one kind"), ("x=/m:fast", "unknown options"),
                     ("random=/m", "taken")):
        with pytest.raises(DataError, match=msg):
            parse_judges([bad])


def test_reduction_helpers_agree_with_the_judges_pooling():
    v = jnp.asarray([[1.0, 2.0, 3.0, 0.0], [4.0, 5.0, 0.0, 0.0]])
    seg = jnp.asarray([[1, 1, 1, 0], [1, 1, 0, 0]])
    np.testing.assert_allclose(np.asarray(objectives.last_value(v, seg)), [3.0, 5.0])
    np.testing.assert_allclose(np.asarray(objectives.masked_mean(v, seg > 0)), [2.0, 4.5])
