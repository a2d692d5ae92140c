"""Scoring ColBench answers (`python -m sweet_jax.evaluate`): the backend in the bubblewrap sandbox
(`colbench.backend_eval`), the frontend by rendering and image similarity (`colbench.frontend_eval`), with the
official CLIP metric from `models.clip` or the offline pixel metric. `EvaluateSettings` is the command's flags."""

from __future__ import annotations

import dataclasses

from sweet_jax.cli.app import flag


@dataclasses.dataclass(frozen=True)
class EvaluateSettings:
    task_type: str = flag(help="which ColBench task the answers are for", choices=("backend", "frontend"),
                          required=True)
    input: str = flag(help="JSONL records with `task` and `answer` (trajectory layout)", required=True)
    output: str = flag(help="scored JSONL, written atomically when complete", required=True)
    semantics: str = flag("reference", choices=("reference", "clean"),
                          help="reference: the official exec/eval namespace behaviour (default); clean: an ordinary "
                               "module")
    workers: int | None = flag(None, help="parallel sandboxes (default: CPU count)")
    clip: str | None = flag(None, help="frontend: an HF CLIP checkpoint directory (the official metric)")
    baseline: str | None = flag(None, help="frontend: a scored output of the baseline run, for the win rate")
    render_dir: str | None = flag(None, help="frontend: where target screenshots go (default: OUT.renders)")


def evaluate(s: EvaluateSettings) -> dict:
    """Score the file; returns the summary (`colbench.backend_eval.summarize` / `colbench.frontend_eval.summarize`)
    with "metric" added for the frontend."""
    if s.task_type == "backend":
        from sweet_jax.colbench.backend_eval import evaluate_file

        return evaluate_file(s.input, s.output, semantics=s.semantics, workers=s.workers)
    from sweet_jax.colbench.frontend_eval import evaluate_file, read_records
    from sweet_jax.colbench.render import Renderer
    from sweet_jax.colbench.similarity import Similarity

    read_records(s.input)  # bad input is reported before Chromium or CLIP start
    if s.clip:
        from sweet_jax.models.clip import image_embedder

        similarity = Similarity("clip", image_embedder(s.clip))
    else:
        similarity = Similarity("pixel")
    with Renderer() as renderer:
        summary = evaluate_file(s.input, s.output, similarity=similarity, renderer=renderer,
                                render_dir=s.render_dir or s.output + ".renders", baseline_path=s.baseline)
    return {**summary, "metric": similarity.metric}
