"""Score ColBench answers: `python -m sweet_jax.evaluate --task-type backend --input IN.jsonl --output OUT.jsonl`.

Each output record is the input record with `reward` (fraction of tests passed), `success`, per-test outcomes
(`tests`) and `vetoed` added. Model code runs in a bubblewrap sandbox (see `sweet_jax.colbench.sandbox`). A killed run
resumes from `OUT.jsonl.partial`. Prints a summary: % tests passed, success rate, and best-of-k when records repeat
a task.
"""

from __future__ import annotations

import argparse
import json
import sys


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m sweet_jax.evaluate", description=__doc__.split("\n\n")[0])
    p.add_argument("--task-type", choices=("backend",), required=True,
                   help="backend (frontend scoring is not built yet)")
    p.add_argument("--input", required=True, help="JSONL records with `task` and `answer` (trajectory layout)")
    p.add_argument("--output", required=True, help="scored JSONL, written atomically when complete")
    p.add_argument("--semantics", choices=("reference", "clean"), default="reference",
                   help="reference: the official exec/eval namespace behaviour (default); clean: an ordinary module")
    p.add_argument("--workers", type=int, default=None, help="parallel sandboxes (default: CPU count)")
    args = p.parse_args(argv)

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


if __name__ == "__main__":
    sys.exit(main())
