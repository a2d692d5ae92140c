"""SWEET-RL end to end: the tracks of `python -m sweet_jax.pipeline`, and `run_pipeline`, which runs a run's track.

A run's `task_type` picks its track: "backend" (`backend_stages`: the ask domain, or any backend tasks), "frontend"
(`frontend_stages`: the design domain, or any frontend tasks), "testbed" (`testbed_stages`: the SYNTHETIC
credit-assignment testbed, with its ground truth) or "testbed_base" (the testbed's shared base model and its gate).
Each track lists its stages in order, the ones every track shares among them (`shared_stages`); `stage_runner` runs
them (markers, resumption, `--stage`, `--from`, `--until`, `--force`, `jobs`). A new track is a module with its STAGES, added to TRACKS.
"""

from __future__ import annotations

import sys

from sweet_jax.pipelines import backend_stages, frontend_stages, testbed_stages
from sweet_jax.runs.pipeline_config import load_pipeline_config
from sweet_jax.pipelines.shared_stages import ABLATIONS, check_jobs
from sweet_jax.pipelines.stage_runner import Run, Stage, StageError
from sweet_jax.pipelines.stage_runner import run_pipeline as run_stages

TRACKS = {"backend": backend_stages.STAGES, "frontend": frontend_stages.STAGES, "testbed": testbed_stages.STAGES,
          "testbed_base": testbed_stages.BASE_STAGES}
# every stage name of every track, in pipeline order (the command's help)
NAMES = tuple(dict.fromkeys(s.name for stages in TRACKS.values() for s in stages))

__all__ = ["ABLATIONS", "NAMES", "TRACKS", "Run", "Stage", "StageError", "run_pipeline", "track_stages"]


def track_stages(cfg) -> tuple[Stage, ...]:
    """The stages of the run's track (`task_type`)."""
    return TRACKS[load_pipeline_config(cfg).task_type]


def run_pipeline(cfg, *, only: str | None = None, start: str | None = None, until: str | None = None,
                 force: bool = False, python: str = sys.executable) -> dict:
    """Run the selected stages of the run's track (see `stage_runner.run_pipeline`); returns {stage: marker}. `cfg`
    is a `pipeline_config.PipelineConfig`, or a config file's ConfigDict (validated first, and with it the training
    job of every stage it keeps: `shared_stages.check_jobs`)."""
    cfg = load_pipeline_config(cfg)
    check_jobs(Run(cfg, python), track_stages(cfg))
    return run_stages(cfg, track_stages(cfg), only=only, start=start, until=until, force=force, python=python)
