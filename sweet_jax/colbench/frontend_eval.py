"""The frontend evaluator. Imports no JAX.

For each record (a trajectory, or any JSON object with `task.ground_truth` HTML and an `answer`: the path of a PNG
screenshot of the agent's last page, or "No answer"):

1. the target page is rendered afresh (`colbench.render`, offline), once per distinct HTML (`colbench.render_cache`,
   so a resumed run renders none again);
2. `reward` = similarity(answer screenshot, target screenshot) (`colbench.similarity`: CLIP cosine, or the offline
   pixel default). A missing answer is the official black 224 x 224 image.

Output records are the input records with `reward` added, plus `answer_missing` when the answer names no existing
image. The run resumes from `OUT.partial` after a kill, and OUT is written atomically, in input order, at the end.
The summary gives the mean similarity, best-of-k when tasks repeat, and, with a scored `baseline` file, the win rate
(ties count 1/2) over the tasks both files share.
"""

from __future__ import annotations

import os

from sweet_jax.colbench.render_cache import RenderCache
from sweet_jax.colbench.similarity import Similarity, win_rate
from sweet_jax.data.trajectories import task_key
from sweet_jax.files.errors import DataError
from sweet_jax.files.jsonl import parse_object
from sweet_jax.files.partial import PartialFile


def parse_record(line: str, where: str) -> dict:
    rec = parse_object(line, where)
    task = rec.get("task")
    if not isinstance(task, dict) or not isinstance(task.get("ground_truth"), str):
        raise DataError(f"{where}: field 'task.ground_truth': missing or not an HTML string")
    if not isinstance(rec.get("answer"), str):
        raise DataError(f"{where}: field 'answer': missing or not a string (a PNG path or \"No answer\")")
    return rec


def read_records(path: str) -> dict[int, dict]:
    """{line number: record} of an input file, every record checked (DataError naming the line and field)."""
    if not os.path.exists(path):
        raise DataError(f"{path}: no such file")
    with open(path) as fh:
        return {n: parse_record(ln, f"{path}:{n}") for n, ln in enumerate(fh, 1) if ln.strip()}


def _per_task(records) -> dict[str, float]:
    groups: dict[str, list[float]] = {}
    for r in records:
        groups.setdefault(task_key(r["task"]), []).append(r["reward"])
    return {k: sum(v) / len(v) for k, v in groups.items()}


def summarize(records: list[dict], baseline: list[dict] | None = None) -> dict:
    if not records:
        return {"records": 0}
    out = {"records": len(records), "mean_similarity": sum(r["reward"] for r in records) / len(records),
           "answers_missing": sum(bool(r.get("answer_missing")) for r in records)}
    groups: dict[str, list[float]] = {}
    for r in records:
        groups.setdefault(task_key(r["task"]), []).append(r["reward"])
    k = max(len(g) for g in groups.values())
    if k > 1:
        out.update(tasks=len(groups), k=k, best_of_k_similarity=sum(max(g) for g in groups.values()) / len(groups))
    if baseline is not None:
        ours, theirs = _per_task(records), _per_task(baseline)
        shared = sorted(set(ours) & set(theirs))
        if not shared:
            raise DataError("the baseline file shares no task with the input")
        out.update(win_rate=win_rate([ours[t] for t in shared], [theirs[t] for t in shared]),
                   win_rate_tasks=len(shared))
    return out


def evaluate_file(input_path: str, output_path: str, *, similarity: Similarity, renderer, render_dir: str,
                  baseline_path: str | None = None, progress: bool = True) -> dict:
    """Score `input_path` into `output_path` (resumable); returns the summary."""
    from tqdm.auto import tqdm

    records = read_records(input_path)
    baseline = None
    if baseline_path:
        baseline = list(read_records(baseline_path).values())
        missing = [i for i, r in enumerate(baseline, 1) if not isinstance(r.get("reward"), (int, float))]
        if missing:
            raise DataError(f"{baseline_path}: record {missing[0]} has no numeric 'reward': give a file this "
                            f"evaluator has scored")
    part = PartialFile(output_path, key=lambda item: item["line"])
    done = {n: item["record"] for n, item in part.done.items()}
    targets = RenderCache(render_dir, workers=1, renderer_factory=lambda: renderer)  # the caller closes `renderer`
    bar = tqdm(total=len(records), initial=len(done), desc=f"frontend eval ({similarity.metric})",
               disable=not progress or None)
    with part:
        for n, rec in records.items():
            if n in done:
                continue
            html = rec["task"]["ground_truth"]
            target = targets.screenshot(html)
            if targets.failed(html):
                target = None
            answer = rec["answer"]
            missing = answer == "No answer" or not os.path.exists(answer)
            scored = {**rec, "reward": similarity(None if missing else answer, target) if target else 0.0}
            if missing:
                scored["answer_missing"] = True
            if target is None:
                scored["target_render_failed"] = True
            part.append({"line": n, "record": scored})
            done[n] = scored
            bar.update(1)
            bar.set_postfix(similarity=f"{sum(r['reward'] for r in done.values()) / len(done):.4f}")
    bar.close()
    final = [done[n] for n in sorted(done)]
    part.finish(final)
    return summarize(final, baseline)
