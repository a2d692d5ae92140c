"""Which trajectories (or candidates) form training pairs. Tokenisation happens later, in `examples`.

- `preference_pairs`: SWEET-RL step 1 (backend). Per task with k rollouts whose best reward reaches
  `min_best_reward`: chosen = the best rollout (first on ties), rejected = every rollout with a lower reward. The
  critic uses these pairs with the information prefix; multi-turn DPO uses the same pairs without it.
- `gap_pairs`: step 1 for the frontend, the rule of the official `evaluate_html.py`: every two rollouts of a task
  whose rewards (CLIP cosines) differ by at least `min_gap` (0.1).
- `pair_file_record` / `read_pair_file`: the official pair-file layout, one `{"chosen": {"input", "output"},
  "rejected": {...}}` object per line, each side the last turn of a trajectory. The critic's file prefixes every
  input with the information ("In light that the final answer is: <ground truth>."); multi-turn DPO's has no prefix.
- `rft_set`: successful trajectories for rejection fine-tuning.
- `ranked_candidate_pairs`: SWEET-RL step 5. For each state of a ranked file, draw `num_pairs` times (with
  replacement) one candidate from the lower-scoring half and one from the upper half; the higher judge score is
  chosen, a tie goes to the upper-half draw.
"""

from __future__ import annotations

import dataclasses
import os
import random
from collections import OrderedDict
from typing import Iterable, Sequence

from sweet_jax.data.examples import INFO_TEMPLATE
from sweet_jax.data.trajectories import Trajectory
from sweet_jax.files.errors import DataError
from sweet_jax.files.jsonl import parse_object


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


def gap_pairs(trajectories: Iterable[Trajectory], min_gap: float = 0.1) -> list[TrajectoryPair]:
    """Every two rollouts j < j2 of a task (in file order) whose rewards differ by at least `min_gap`, as the
    official frontend code forms them: a pair with `abs(r_j - r_j2) < min_gap` in plain float arithmetic is left out
    (so 0.7 and 0.6, 0.0999... apart, are), the higher reward is chosen, and on equal rewards (possible only with
    `min_gap` 0) the later rollout. Pairs come task by task, then by (j, j2)."""
    pairs = []
    for rollouts in group_rollouts(trajectories).values():
        for j, a in enumerate(rollouts):
            for b in rollouts[j + 1:]:
                if abs(a.reward - b.reward) < min_gap:
                    continue
                pairs.append(TrajectoryPair(a, b) if a.reward > b.reward else TrajectoryPair(b, a))
    return pairs


def pair_file_record(pair: TrajectoryPair, info_key: str | None = "ground_truth") -> dict:
    """One line of the official pair file: each side the last turn's `input` and `output`, the input prefixed with
    the chosen rollout's task information `info_key` (None: no prefix, multi-turn DPO's file). `json.dumps` of it
    (`files.jsonl.write_jsonl`) is the official line byte for byte."""
    prefix = "" if info_key is None else INFO_TEMPLATE.format(info=pair.chosen.task[info_key])

    def side(t: Trajectory) -> dict:
        return {"input": prefix + t.last_turn["input"], "output": t.last_turn["output"]}

    return {"chosen": side(pair.chosen), "rejected": side(pair.rejected)}


@dataclasses.dataclass(frozen=True)
class FilePair:
    """A pair of the official pair-file layout: each side its own prompt (`input`) and response (`output`)."""

    chosen: tuple[str, str]
    rejected: tuple[str, str]
    source: str


def read_pair_file(path: str | os.PathLike) -> list[FilePair]:
    """Every pair of an official pair file; a bad line is a DataError naming file:line and the field."""
    records, sources = read_ranked_file(path)
    out = []
    for rec, where in zip(records, sources):
        sides = []
        for side in ("chosen", "rejected"):
            value = rec.get(side)
            if not isinstance(value, dict):
                raise DataError(f"{where}: field '{side}': expected an object with 'input' and 'output'")
            for key in ("input", "output"):
                if not isinstance(value.get(key), str):
                    raise DataError(f"{where}: field '{side}.{key}': missing or not a string")
            sides.append((value["input"], value["output"]))
        out.append(FilePair(sides[0], sides[1], where))
    return out


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
    """A ranked (or pair) JSONL file: records and their file:line sources."""
    path = os.fspath(path)
    records, sources = [], []
    if not os.path.exists(path):
        raise DataError(f"{path}: no such file")
    with open(path) as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            records.append(parse_object(line, f"{path}:{lineno}"))
            sources.append(f"{path}:{lineno}")
    return records, sources
