"""The testbed's judges of judges (`ranking.testbed_judges`): the base's gate and the critics under both ranking
references, on tiny random models, against a plain forward pass and the identities the two references obey."""

import functools

import jax
import numpy as np
import pytest

from sweet_jax import models
from sweet_jax.colbench import testbed_domain as tb
from sweet_jax.colbench.env import BackendEpisode
from sweet_jax.colbench.testbed_diagnostics import diagnostic_states
from sweet_jax.data.examples import INFO_TEMPLATE
from sweet_jax.objectives import token_logprobs
from sweet_jax.ranking import testbed_judges as tj
from sweet_jax.ranking.credit_diagnostics import judge_diagnostics

CFG = models.LlamaConfig.preset("tiny", hidden_size=32, intermediate_size=64, num_layers=1, num_heads=4,
                                num_kv_heads=2)
S = tb.TestbedSettings()


@pytest.fixture(scope="module")
def lms(tmp_path_factory):
    d = tmp_path_factory.mktemp("testbed_judges")
    for i, name in enumerate(("base", "critic", "plain")):
        models.save_hf_params(models.init_params(CFG, jax.random.key(i), std=0.3), CFG, d / name)
    return {name: str(d / name) for name in ("base", "critic", "plain")}


@functools.lru_cache(maxsize=None)
def _loaded(model: str):
    loaded = models.load_model(model)
    return loaded, loaded.tokenizer(), jax.jit(lambda p, t: token_logprobs(p, loaded.cfg, t))


def _mean_logprob(model: str, text_prefix: str, prompt: str, candidate: str) -> float:
    """A plain forward pass over the whole sequence (right-padded to one length: one compilation): the mean log-prob
    of the candidate's tokens."""
    loaded, tok, logprobs = _loaded(model)
    ids = tok.encode(text_prefix + prompt, add_special_tokens=False)
    cand = tok.encode(candidate, add_special_tokens=False)
    tokens = np.zeros((1, 640), np.int32)
    tokens[0, :len(ids) + len(cand)] = ids + cand
    lp = np.asarray(logprobs(loaded.params, tokens))
    return float(np.mean(lp[0, len(ids):len(ids) + len(cand)]))


@pytest.mark.slow  # 50 s alone, 150 s beside a pipeline on 2 cores: over the unmarked tier's 240 s limit's margin
def test_the_critics_under_both_references_and_the_base_judge(lms):
    tasks = tb.make_tasks(S, 2, 5)
    out = tj.judges(lms["base"], {"critic": lms["critic"], "plain": lms["plain"], "same": lms["base"]}, S, tasks,
                    no_info=("plain",), seed=2, candidates=4, sampled=False)
    j = out["judges"]
    assert set(j) == {"base (sampler)", "critic (sampler)", "critic (model)", "plain (sampler)", "plain (model)",
                      "same (sampler)", "same (model)"}
    states = diagnostic_states(S, tasks, candidates=4, seed=2)
    assert out["states"] == len(states)
    # a critic without the information: both references are the base without it
    assert j["plain (sampler)"] == j["plain (model)"]
    # the base as its own critic: the frozen reference cancels it; the sampler's leaves the base judge
    assert j["same (sampler)"] == j["base (sampler)"]
    assert j["same (model)"]["optimal"]["rank_correlation"] is None
    assert j["same (model)"]["optimal"]["pairwise_accuracy"] == 0.5
    # the information critic's scores under both references, from plain forward passes (the first states)
    for st, rec in list(zip(states, out["scored"]))[:2]:
        assert rec["candidates"] == st["candidates"] and rec["truth"] == st["truth"]
        ep = BackendEpisode(st["task"], max_steps=S.max_steps)
        ep.history = [dict(m) for m in st["history"]]
        info = INFO_TEMPLATE.format(info=st["task"]["ground_truth"])
        for ref in ("sampler", "model"):
            want = [_mean_logprob(lms["critic"], info, ep.agent_prompt(), c)
                    - _mean_logprob(lms["base"], info if ref == "model" else "", ep.agent_prompt(), c)
                    for c in st["candidates"]]
            assert rec["scores"][f"critic ({ref})"] == pytest.approx(want, abs=2e-4)
    # the diagnostics are those of the scores kept
    kept = [{**st, "kinds": r["kinds"], "scores": r["scores"]["critic (model)"]} for st, r in zip(states, out["scored"])]
    assert j["critic (model)"]["optimal"] == judge_diagnostics(kept)
    assert j["critic (model)"]["optimal"]["pairs"] > 0
    # the initial policy's own candidates: as many per state, from the same states
    own = tj.judges(lms["base"], {"critic": lms["critic"]}, S, tasks[:1], seed=2, candidates=3, max_tokens=4)
    assert own["sampled"] and own["states"] == len(diagnostic_states(S, tasks[:1], candidates=3, seed=2))


def test_the_outcome_is_the_answer_right_for_the_hidden_code():
    task = tb.make_tasks(S, 1, 0)[0]
    right = tb.answer_message(task["testbed"]["coefficients"])
    wrong = tb.answer_message([c + 1 for c in task["testbed"]["coefficients"]])
    assert tj.outcomes(S, task, [right, wrong, tb.question(0), "garbage"]) == [1.0, 0.0, 0.0, 0.0]
