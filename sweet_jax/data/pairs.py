"""Which trajectories (or candidates) form training pairs. Tokenisation happens later, in `examples`.

- `preference_pairs`: SWEET-RL step 1. Per task with k rollouts whose best reward reaches `min_best_reward`:
  chosen = the best rollout (first on ties), rejected = every rollout with a lower reward. The critic uses these pairs
  with the information prefix; multi-turn DPO uses the same pairs without it.
- `rft_set`: successful trajectories for rejection fine-tuning.
- `ranked_candidate_pairs`: SWEET-RL step 5. For each state of a ranked file, draw `num_pairs` times (with
  replacement) one candidate from the lower-scoring half and one from the upper half; the higher judge score is
  chosen, a tie goes to the upper-half draw.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
from collections import OrderedDict
from typing import Iterable, Sequence

from sweet_jax.data.trajectories import Trajectory
from sweet_jax.files.errors import DataError


@dataclasses.dataclass(frozen=True)
class TrajectoryPair:
    chosen: Trajectory
    rejected: Trajectory


@dataclasses.dataclass(frozen=True)
class TextPair:
    """A ranked-candidate pair: the same templated prompt with two responses."""

    prompt: str
    chosen: str
    rejected: str
    source: str


def group_rollouts(trajectories: Iterable[Trajectory]) -> "OrderedDict[str, list[Trajectory]]":
    """Rollouts grouped by task, in first-seen order (works for the block layout and any other order)."""
    groups: OrderedDict[str, list[Trajectory]] = OrderedDict()
    for t in trajectories:
        groups.setdefault(t.task_key, []).append(t)
    return groups


def preference_pairs(trajectories: Iterable[Trajectory], min_best_reward: float = 1.0) -> list[TrajectoryPair]:
    pairs = []
    for rollouts in group_rollouts(trajectories).values():
        rewards = [t.reward for t in rollouts]
        best = max(rewards)
        if best < min_best_reward:
            continue
        top = rewards.index(best)
        pairs.extend(TrajectoryPair(rollouts[top], t) for t in rollouts if t.reward < best)
    return pairs


def rft_set(trajectories: Iterable[Trajectory], min_reward: float = 1.0) -> list[Trajectory]:
    return [t for t in trajectories if t.reward >= min_reward]


def ranked_candidate_pairs(records: Sequence[dict], num_pairs: int = 4, seed: int = 42,
                           sources: Sequence[str] | None = None) -> list[TextPair]:
    """records: the ranked layout (`input`, `additional_outputs`, `judge_result`)."""
    rng = random.Random(seed)
    pairs = []
    for i, rec in enumerate(records):
        where = sources[i] if sources else f"record {i}"
        outs, scores = rec.get("additional_outputs"), rec.get("judge_result")
        if not isinstance(rec.get("input"), str):
            raise DataError(f"{where}: field 'input': missing or not a string")
        if not isinstance(outs, list) or not isinstance(scores, list) or len(outs) != len(scores) or len(outs) < 2:
            raise DataError(f"{where}: field 'judge_result': needs as many scores as 'additional_outputs' (>= 2)")
        order = sorted(range(len(scores)), key=lambda j: scores[j])
        half = len(order) // 2
        low, high = order[:half], order[half:]
        for _ in range(num_pairs):
            lo, hi = rng.choice(low), rng.choice(high)
            chosen, rejected = (lo, hi) if scores[lo] > scores[hi] else (hi, lo)
            pairs.append(TextPair(rec["input"], outs[chosen], outs[rejected], where))
    rng.shuffle(pairs)
    return pairs


def read_ranked_file(path: str | os.PathLike) -> tuple[list[dict], list[str]]:
    """A ranked JSONL file: records and their file:line sources."""
    path = os.fspath(path)
    records, sources = [], []
    with open(path) as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{lineno}: malformed JSON ({e.msg} at column {e.colno})") from None
            sources.append(f"{path}:{lineno}")
    return records, sources
