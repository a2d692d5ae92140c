"""Paired comparisons of two methods that played the same test episodes (the same tasks, the same simulator seeds),
pooled over training seeds. Imports no JAX.

`paired_difference` takes each method's outcome per episode key, for example (seed, task, rollout) -> success, and
returns the mean of the differences over the keys both played, with a percentile bootstrap interval. The bootstrap
resamples the clusters (training seeds) and then the episodes within each chosen cluster, so the interval carries
both the test-set noise and the seed-to-seed noise of training. `episodes_needed` sizes a test set for a difference
to be detected.
"""

from __future__ import annotations

from statistics import NormalDist
from typing import Callable, Hashable, Mapping

import numpy as np


def paired_difference(a: Mapping[Hashable, float], b: Mapping[Hashable, float], *,
                      cluster: Callable[[Hashable], Hashable] = lambda key: key[0], resamples: int = 10_000,
                      level: float = 0.95, seed: int = 0) -> dict:
    """mean(a[k] - b[k]) over the shared keys, and its bootstrap interval (see the module docstring). `cluster` maps a
    key to its training seed (by default the key's first item)."""
    keys = sorted(set(a) & set(b), key=repr)
    if not keys:
        raise ValueError("the two methods share no episode: pair them by the same (seed, task, rollout) keys")
    groups: dict = {}
    for k in keys:
        groups.setdefault(cluster(k), []).append(float(a[k]) - float(b[k]))
    diffs = [np.asarray(v) for v in groups.values()]
    rng = np.random.default_rng(seed)
    means = np.empty(resamples)
    for r in range(resamples):
        chosen = rng.integers(0, len(diffs), len(diffs)) if len(diffs) > 1 else np.zeros(1, int)
        total = count = 0.0
        for c in chosen:
            d = diffs[c]
            total += d[rng.integers(0, len(d), len(d))].sum()
            count += len(d)
        means[r] = total / count
    lo, hi = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    all_diffs = np.concatenate(diffs)
    return {"difference": float(all_diffs.mean()), "low": float(lo), "high": float(hi), "level": level,
            "episodes": int(all_diffs.size), "clusters": len(diffs),
            "a": float(np.mean([a[k] for k in keys])), "b": float(np.mean([b[k] for k in keys]))}


def episodes_needed(difference: float, rate: float, *, correlation: float = 0.0, power: float = 0.8,
                    level: float = 0.95) -> int:
    """Paired episodes for a two-sided test at `level` to detect `difference` in success with probability `power`,
    both methods near `rate`, their outcomes on a shared episode correlated by `correlation` (0: conservative)."""
    z = NormalDist().inv_cdf((1 + level) / 2) + NormalDist().inv_cdf(power)
    variance = 2 * rate * (1 - rate) * (1 - correlation)
    return int(np.ceil(z * z * variance / difference ** 2))
