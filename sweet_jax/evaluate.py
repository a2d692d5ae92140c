"""Score ColBench answers: `python -m sweet_jax.evaluate --task-type backend|frontend --input IN.jsonl --output OUT.jsonl`.

Backend: each output record is the input record with `reward` (fraction of tests passed), `success`, per-test
outcomes (`tests`) and `vetoed` added. Model code runs in a bubblewrap sandbox (see `sweet_jax.colbench.sandbox`).
Prints % tests passed, success rate, and best-of-k when records repeat a task.

Frontend: `reward` is the similarity of the answer's screenshot to the target page, rendered offline
(`sweet_jax.colbench.render`): the CLIP cosine with `--clip DIR` (an HF `openai/clip-vit-base-patch32` directory),
else the offline pixel metric (`sweet_jax.colbench.similarity`). `--baseline SCORED.jsonl` adds the win rate.

A killed run resumes from `OUT.jsonl.partial`.
"""

from __future__ import annotations

import argparse
import json
import sys


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m sweet_jax.evaluate", description=__doc__.split("\n\n")[0])
    p.add_argument("--task-type", choices=("backend", "frontend"), required=True)
    p.add_argument("--input", required=True, help="JSONL records with `task` and `answer` (trajectory layout)")
    p.add_argument("--output", required=True, help="scored JSONL, written atomically when complete")
    p.add_argument("--semantics", choices=("reference", "clean"), default="reference",
                   help="reference: the official exec/eval namespace behaviour (default); clean: an ordinary module")
    p.add_argument("--workers", type=int, default=None, help="parallel sandboxes (default: CPU count)")
    p.add_argument("--clip", default=None, help="frontend: an HF CLIP checkpoint directory (the official metric)")
    p.add_argument("--baseline", default=None, help="frontend: a scored output of the baseline run, for the win rate")
    p.add_argument("--render-dir", default=None, help="frontend: where target screenshots go (default: OUT.renders)")
    args = p.parse_args(argv)
    if args.task_type == "frontend":
        return _frontend(args)

    from sweet_jax.colbench.backend_eval import evaluate_file
    from sweet_jax.colbench.sandbox import SandboxUnavailable
    from sweet_jax.data.trajectories import DataError
    try:
        summary = evaluate_file(args.input, args.output, semantics=args.semantics, workers=args.workers)
    except (DataError, SandboxUnavailable) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"records: {summary['records']}")
    if summary["records"]:
        print(f"% tests passed: {100 * summary['tests_passed']:.2f}")
        print(f"success rate:   {100 * summary['success_rate']:.2f}")
        if "k" in summary:
            print(f"best-of-{summary['k']} over {summary['tasks']} tasks: % tests passed "
                  f"{100 * summary['best_of_k_tests_passed']:.2f}, success rate "
                  f"{100 * summary['best_of_k_success_rate']:.2f}")
    print(json.dumps(summary))
    return 0


def _frontend(args) -> int:
    from sweet_jax.colbench.frontend_eval import evaluate_file
    from sweet_jax.colbench.render import Renderer, RendererUnavailable
    from sweet_jax.colbench.similarity import Similarity
    from sweet_jax.data.trajectories import DataError

    try:
        if args.clip:
            from sweet_jax.models.clip import image_embedder

            similarity = Similarity("clip", image_embedder(args.clip))
        else:
            similarity = Similarity("pixel")
        with Renderer() as renderer:
            summary = evaluate_file(args.input, args.output, similarity=similarity, renderer=renderer,
                                    render_dir=args.render_dir or args.output + ".renders",
                                    baseline_path=args.baseline)
    except (DataError, RendererUnavailable, FileNotFoundError, KeyError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"records: {summary['records']} (metric: {similarity.metric})")
    if summary["records"]:
        print(f"mean similarity: {100 * summary['mean_similarity']:.2f}")
        if "k" in summary:
            print(f"best-of-{summary['k']} over {summary['tasks']} tasks: {100 * summary['best_of_k_similarity']:.2f}")
        if "win_rate" in summary:
            print(f"win rate vs baseline over {summary['win_rate_tasks']} tasks: {100 * summary['win_rate']:.1f}")
        if summary["answers_missing"]:
            print(f"answers without an image (scored as black): {summary['answers_missing']}")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
