"""Score ColBench answers:
`python -m sweet_jax.evaluate --task-type backend|frontend --input IN.jsonl --output OUT.jsonl`.

Backend: each output record is the input record with `reward` (fraction of tests passed), `success`, per-test
outcomes (`tests`) and `vetoed` added. Model code runs in a bubblewrap sandbox (see `sweet_jax.colbench.sandbox`).
Prints % tests passed, success rate, and best-of-k when records repeat a task.

Frontend: `reward` is the similarity of the answer's screenshot to the target page, rendered offline
(`sweet_jax.colbench.render`): the CLIP cosine with `--clip DIR` (an HF `openai/clip-vit-base-patch32` directory),
else the offline pixel metric (`sweet_jax.colbench.similarity`). `--baseline SCORED.jsonl` adds the win rate.

A killed run resumes from `OUT.jsonl.partial`.
"""

import json

from sweet_jax.cli.app import run
from sweet_jax.colbench.render import RendererUnavailable
from sweet_jax.colbench.sandbox import SandboxUnavailable
from sweet_jax.files.errors import DataError
from sweet_jax.ranking.evaluation import EvaluateSettings, evaluate


def main(s: EvaluateSettings) -> int:
    summary = evaluate(s)
    if s.task_type == "backend":
        print(f"records: {summary['records']}")
        if summary["records"]:
            print(f"% tests passed: {100 * summary['tests_passed']:.2f}")
            print(f"success rate:   {100 * summary['success_rate']:.2f}")
            if "k" in summary:
                print(f"best-of-{summary['k']} over {summary['tasks']} tasks: % tests passed "
                      f"{100 * summary['best_of_k_tests_passed']:.2f}, success rate "
                      f"{100 * summary['best_of_k_success_rate']:.2f}")
    else:
        print(f"records: {summary['records']} (metric: {summary.pop('metric')})")
        if summary["records"]:
            print(f"mean similarity: {100 * summary['mean_similarity']:.2f}")
            if "k" in summary:
                print(f"best-of-{summary['k']} over {summary['tasks']} tasks: "
                      f"{100 * summary['best_of_k_similarity']:.2f}")
            if "win_rate" in summary:
                print(f"win rate vs baseline over {summary['win_rate_tasks']} tasks: {100 * summary['win_rate']:.1f}")
            if summary["answers_missing"]:
                print(f"answers without an image (scored as black): {summary['answers_missing']}")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    run(main, EvaluateSettings, errors=(DataError, SandboxUnavailable, RendererUnavailable, FileNotFoundError,
                                        KeyError, ValueError))
