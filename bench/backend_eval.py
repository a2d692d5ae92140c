"""Backend evaluator throughput: the real ColBench test tasks x 10 tests, each answered with its own ground truth,
scored (a) by this project's sandboxed evaluator (two bubblewrap processes per task, all tests) and (b) by the
official-style in-process scoring (`colbench.scoring.score_answer`: exec/eval in the evaluating process, no sandbox),
side by side in the same run. Prints both times, the ratio, and whether the per-record rewards agree.

    python bench/backend_eval.py [--tasks 1000] [--workers 2]

Target (ColBench issue): the sandboxed run of 1000 tasks finishes in <= 3 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from sweet_jax.colbench.backend_eval import evaluate_file  # noqa: E402
from sweet_jax.colbench.scoring import score_answer  # noqa: E402

DEFAULT_TASKS = os.path.join(ROOT, "..", "shared", "colbench", "backend_test.jsonl")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tasks-file", default=DEFAULT_TASKS)
    p.add_argument("--tasks", type=int, default=1000)
    p.add_argument("--workers", type=int, default=os.cpu_count())
    args = p.parse_args()
    with open(args.tasks_file) as fh:
        tasks = [json.loads(ln) for ln, _ in zip(fh, range(args.tasks))]
    records = [{"task": t, "answer": f"```python\n{t['ground_truth']}\n```"} for t in tasks]
    n_tests = sum(len(t["test_cases"]) for t in tasks)

    with tempfile.TemporaryDirectory() as tmp:
        inp, out = os.path.join(tmp, "in.jsonl"), os.path.join(tmp, "out.jsonl")
        with open(inp, "w") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in records)
        t0 = time.perf_counter()
        summary = evaluate_file(inp, out, workers=args.workers, progress=False)
        sandboxed = time.perf_counter() - t0
        with open(out) as fh:
            ours = [json.loads(ln)["reward"] for ln in fh]

        stdout, devnull, cwd = sys.stdout, open(os.devnull, "w"), os.getcwd()
        sys.stdout = devnull  # some ground truths print, and some write files (sqlite dbs) into the working directory
        os.chdir(tmp)
        try:
            t0 = time.perf_counter()
            official = [score_answer(r["answer"], r["task"]["ground_truth"], r["task"]["test_cases"]).reward
                        for r in records]
            in_process = time.perf_counter() - t0
        finally:
            sys.stdout = stdout
            os.chdir(cwd)
    differ = [i for i, (a, b) in enumerate(zip(ours, official)) if a != b]
    print(f"tasks: {len(records)}, tests: {n_tests}, workers: {args.workers}")
    print(f"sandboxed evaluator: {sandboxed:.1f} s (success rate {summary['success_rate']:.3f}, "
          f"% tests passed {100 * summary['tests_passed']:.2f})")
    print(f"official-style in-process scoring (no sandbox): {in_process:.1f} s")
    print(f"ratio sandboxed / in-process: {sandboxed / in_process:.2f}x")
    print(f"records whose reward differs: {differ} (task 264 uses `random` and may differ)")
    target = 180 * len(records) / 1000
    print(f"target <= {target:.0f} s for {len(records)} tasks: {'PASS' if sandboxed <= target else 'FAIL'}")


if __name__ == "__main__":
    main()
