"""Paired differences with a cluster bootstrap, and test-set sizing, against closed forms."""

import math
import random

import pytest

from sweet_jax.reporting.paired_stats import episodes_needed, paired_difference


def test_the_difference_is_the_mean_over_shared_episodes_and_identical_methods_give_zero():
    a = {(s, t, r): float((s + t + r) % 3 == 0) for s in range(5) for t in range(40) for r in range(2)}
    same = paired_difference(a, a, resamples=200)
    assert (same["difference"], same["low"], same["high"]) == (0.0, 0.0, 0.0)
    b = {k: v for k, v in a.items() if k[1] % 2 == 0}  # b played half the tasks: only shared keys are paired
    half = paired_difference(a, {k: 0.0 for k in b}, resamples=200)
    assert half["episodes"] == len(b) and half["difference"] == pytest.approx(sum(a[k] for k in b) / len(b))
    with pytest.raises(ValueError, match="share no episode"):
        paired_difference(a, {("x",): 1.0})


def test_one_cluster_gives_the_normal_interval_and_seed_noise_widens_it():
    rng = random.Random(0)
    n = 2000
    diffs = [rng.choice([-1.0, 0.0, 0.0, 1.0, 1.0]) for _ in range(n)]
    a = {(0, i): max(d, 0.0) for i, d in enumerate(diffs)}
    b = {(0, i): max(-d, 0.0) for i, d in enumerate(diffs)}
    r = paired_difference(a, b, resamples=4000)
    mean = sum(diffs) / n
    se = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1) / n)
    assert r["low"] == pytest.approx(mean - 1.96 * se, abs=0.15 * se)
    assert r["high"] == pytest.approx(mean + 1.96 * se, abs=0.15 * se)
    # the same episodes split over 5 seeds whose means differ: the interval must widen
    shifted = {(i % 5, i): a[(0, i)] + (0.2 if i % 5 == 0 else 0.0) for i in range(n)}
    plain = {(i % 5, i): a[(0, i)] for i in range(n)}
    wide = paired_difference(shifted, {(i % 5, i): b[(0, i)] for i in range(n)}, resamples=4000)
    narrow = paired_difference(plain, {(i % 5, i): b[(0, i)] for i in range(n)}, resamples=4000)
    assert wide["high"] - wide["low"] > 1.5 * (narrow["high"] - narrow["low"])


def test_episodes_needed_is_the_normal_approximation():
    z = 1.959963984540054 + 0.8416212335729143
    assert episodes_needed(0.06, 0.35) == math.ceil(z * z * 2 * 0.35 * 0.65 / 0.06 ** 2)
    assert episodes_needed(0.06, 0.35, correlation=0.5) < episodes_needed(0.06, 0.35)
