"""How well a judge ranks a turn's candidates against their true values: rank correlation, top-1 agreement and
pairwise accuracy, over held-out states, overall, by turn index and by action type. Imports no JAX.

A state is a mapping with `truth` (each candidate's true value, e.g. Q* from `colbench.testbed_domain`), `scores`
(the judge's score per candidate: a critic's advantage, a value, an LLM judge's grade), `turn` (the turn index) and
`kinds` (each candidate's action type, e.g. "ask", "vague", "answer").

- rank correlation: Spearman's, with tied values given their mean rank; a state whose truth or scores are all equal
  has none and is left out of the mean;
- top-1 agreement: whether the judge's best candidate is one of the truly best (a tie for the judge's best counts
  the fraction of the tied candidates that are truly best); states whose candidates are all equally good are left
  out. `top1_chance` is what a judge picking at random would get on the same states;
- pairwise accuracy: over every pair of candidates in a state with different true values, the fraction the judge
  orders the same way (a tie in scores counts one half), pooled over states.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable, Mapping

EPS = 1e-12


def _ranks(xs: list[float]) -> list[float]:
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    ranks = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and abs(xs[order[j + 1]] - xs[order[i]]) <= EPS:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2
        i = j + 1
    return ranks


def rank_correlation(truth: list[float], scores: list[float]) -> float | None:
    """Spearman's rank correlation; None when either side is constant."""
    a, b = _ranks(list(truth)), _ranks(list(scores))
    ma, mb = sum(a) / len(a), sum(b) / len(b)
    va = sum((x - ma) ** 2 for x in a)
    vb = sum((y - mb) ** 2 for y in b)
    if va <= EPS or vb <= EPS:
        return None
    return sum((x - ma) * (y - mb) for x, y in zip(a, b)) / (va * vb) ** 0.5


def top1_agreement(truth: list[float], scores: list[float]) -> tuple[float, float] | None:
    """(agreement, chance) for one state; None when every candidate is equally good."""
    best_truth = max(truth)
    if min(truth) >= best_truth - EPS:
        return None
    good = [t >= best_truth - EPS for t in truth]
    best_score = max(scores)
    picked = [i for i, s in enumerate(scores) if s >= best_score - EPS]
    return sum(good[i] for i in picked) / len(picked), sum(good) / len(good)


def pairwise(truth: list[float], scores: list[float]) -> tuple[float, int]:
    """(pairs the judge orders as the truth does, ties counting one half; pairs with different true values)."""
    right, pairs = 0.0, 0
    for i in range(len(truth)):
        for j in range(i + 1, len(truth)):
            dt = truth[i] - truth[j]
            if abs(dt) <= EPS:
                continue
            pairs += 1
            ds = scores[i] - scores[j]
            right += 0.5 if abs(ds) <= EPS else float((ds > 0) == (dt > 0))
    return right, pairs


def _summary(groups: Iterable[tuple[list[float], list[float]]]) -> dict:
    rhos, tops, chances, right, pairs, states = [], [], [], 0.0, 0, 0
    for truth, scores in groups:
        if len(truth) < 2:
            continue
        states += 1
        rho = rank_correlation(truth, scores)
        if rho is not None:
            rhos.append(rho)
        top = top1_agreement(truth, scores)
        if top is not None:
            tops.append(top[0])
            chances.append(top[1])
        r, p = pairwise(truth, scores)
        right, pairs = right + r, pairs + p
    mean = lambda xs: sum(xs) / len(xs) if xs else None  # noqa: E731
    return {"states": states, "rank_correlation": mean(rhos), "top1": mean(tops), "top1_chance": mean(chances),
            "pairwise_accuracy": right / pairs if pairs else None, "pairs": pairs}


def judge_diagnostics(states: list[Mapping]) -> dict:
    """The three measures over all states, then `by_turn` (states grouped by turn index) and `by_kind` (each state's
    candidates of one action type ranked among themselves)."""
    by_turn, by_kind = defaultdict(list), defaultdict(list)
    for st in states:
        truth, scores = list(st["truth"]), list(st["scores"])
        if len(truth) != len(scores):
            raise ValueError(f"a state has {len(truth)} true values but {len(scores)} scores")
        by_turn[int(st.get("turn", 0))].append((truth, scores))
        kinds = st.get("kinds") or ["all"] * len(truth)
        for kind in sorted(set(kinds)):
            idx = [i for i, k in enumerate(kinds) if k == kind]
            by_kind[kind].append(([truth[i] for i in idx], [scores[i] for i in idx]))
    out = _summary((list(s["truth"]), list(s["scores"])) for s in states)
    out["by_turn"] = {t: _summary(g) for t, g in sorted(by_turn.items())}
    out["by_kind"] = {k: _summary(g) for k, g in sorted(by_kind.items())}
    return out
