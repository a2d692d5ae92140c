"""Evaluate a model on ColBench in one command:
`python -m sweet_jax.evaluate_model --task_type backend --model RUN_DIR|HF_DIR|HUB_ID --tasks TEST.jsonl
--output OUT [--limit N] [--rollouts K] [--simulator MODEL] [--backend sweet_jax|vllm|endpoint]`.

Serves the model (and the simulated human), rolls it out on the test set, scores every answer, and writes
OUT/metrics.json (the success rate and % tests passed, or the mean similarity, each with its 95% interval),
OUT/trajectories.jsonl (the official trajectory layout, what `python -m sweet_jax.evaluate` scores) and
OUT/hal_agent_output.json (what the HAL harness's ColBench benchmark scores); see
`sweet_jax.pipelines.model_evaluation`. A kill loses nothing: the same command resumes. SIGTERM, SIGHUP or Ctrl-C
stops the servers it started. Exit 1 when conversations still failed after every retry (rerun to retry them), 2 for
bad input.
"""

import json
import sys

from sweet_jax.cli.app import run
from sweet_jax.cli.processes import claim_children, stop_on_signals
from sweet_jax.colbench.render import RendererUnavailable
from sweet_jax.colbench.sandbox import SandboxUnavailable
from sweet_jax.files.errors import DataError
from sweet_jax.inference.backends import ManagedServer, ServerError
from sweet_jax.pipelines.model_evaluation import EvaluationError, ModelEvalSettings, evaluate_model


def main(s: ModelEvalSettings) -> int:
    stop_on_signals(claim_children("evaluate_model"), before=ManagedServer.unwatch_all, what="the evaluation")
    try:
        result = evaluate_model(s)
    except (EvaluationError, ServerError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if s.task_type == "backend":
        for name in ("success_rate", "tests_passed"):
            m = result[name]
            print(f"{name.replace('_', ' ')}: {100 * m['mean']:.2f}  (95% interval {100 * m['ci95'][0]:.2f}-"
                  f"{100 * m['ci95'][1]:.2f}, {result['tasks']} tasks x {result['rollouts']} rollouts)")
    else:
        m = result["similarity"]
        print(f"similarity: {100 * m['mean']:.2f}  (95% interval {100 * m['ci95'][0]:.2f}-{100 * m['ci95'][1]:.2f}, "
              f"{result['tasks']} tasks x {result['rollouts']} rollouts)")
    print(json.dumps({k: v for k, v in result.items() if k not in ("settings", "hal")}))
    return 0


if __name__ == "__main__":
    run(main, ModelEvalSettings, errors=(DataError, SandboxUnavailable, RendererUnavailable, FileNotFoundError,
                                         ValueError))
