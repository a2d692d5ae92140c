"""Judge diagnostics: each measure against hand-computed values and scipy, and on the testbed, a judge with known
scores: the true Q itself ranks perfectly, a shuffled copy at chance."""

import random

import pytest

from sweet_jax.colbench import testbed_diagnostics as td
from sweet_jax.colbench import testbed_domain as tb
from sweet_jax.ranking.credit_diagnostics import judge_diagnostics, pairwise, rank_correlation, top1_agreement


def test_measures_on_hand_computed_cases():
    truth = [0.0, 1.0, 1.0, 3.0]
    # ranks: truth 0, 1.5, 1.5, 3; scores 0, 1, 2, 3 -> covariance 4.5 over sqrt(4.5 * 5)
    assert rank_correlation(truth, [0.0, 1.0, 2.0, 3.0]) == pytest.approx(4.5 / (4.5 * 5) ** 0.5)
    assert rank_correlation(truth, [1.0, 1.0, 1.0, 1.0]) is None
    assert top1_agreement(truth, [0.0, 0.0, 0.0, 9.0]) == (1.0, 0.25)
    assert top1_agreement(truth, [5.0, 0.0, 0.0, 5.0]) == (0.5, 0.25)  # a tie for the judge's best: half right
    assert top1_agreement([1.0, 1.0], [0.0, 1.0]) is None
    # 5 pairs with different truth; the judge reverses (0, 1) and ties (2, 3)
    assert pairwise(truth, [2.0, 1.0, 5.0, 5.0]) == (3.5, 5)


def test_rank_correlation_equals_scipy():
    stats = pytest.importorskip("scipy.stats")
    rng = random.Random(0)
    for _ in range(20):
        truth = [rng.choice([0.0, 0.2, 0.5, 1.0]) for _ in range(16)]
        scores = [rng.gauss(0, 1) if rng.random() < 0.8 else 0.0 for _ in range(16)]
        assert rank_correlation(truth, scores) == pytest.approx(stats.spearmanr(truth, scores).statistic, abs=1e-12)


def test_the_true_q_ranks_perfectly_and_a_shuffled_copy_at_chance():
    s = tb.TestbedSettings()
    states = td.diagnostic_states(s, tb.make_tasks(s, 150, seed=7, prefix="held-out"), candidates=16, seed=1)
    assert {st["turn"] for st in states} == {0, 1, 2} and {k for st in states for k in st["kinds"]} == {
        "ask", "vague", "answer"}
    oracle = judge_diagnostics([{**st, "scores": st["truth"]} for st in states])
    assert (oracle["rank_correlation"], oracle["top1"], oracle["pairwise_accuracy"]) == (
        pytest.approx(1.0), 1.0, 1.0)
    assert all(v["top1"] in (None, 1.0) for v in oracle["by_turn"].values())
    assert all(v["pairwise_accuracy"] in (None, 1.0) for v in oracle["by_kind"].values())
    rng = random.Random(2)
    shuffled = judge_diagnostics([{**st, "scores": rng.sample(st["truth"], len(st["truth"]))} for st in states])
    assert abs(shuffled["rank_correlation"]) < 0.05, shuffled
    assert abs(shuffled["pairwise_accuracy"] - 0.5) < 0.03, shuffled
    assert abs(shuffled["top1"] - shuffled["top1_chance"]) < 0.06, shuffled
    # the collecting policy's own Q agrees with Q* on most orderings, but not all
    mu = judge_diagnostics([{**st, "scores": st["truth_collector"]} for st in states])
    assert 0.8 < mu["pairwise_accuracy"] < 1.0, mu
