"""The offline training job shared by the critic, DPO and RFT jobs, in three parts: set-up (`job_setup.set_up`: the
validated config, data, mesh, layout, reference scores and state), the loop (`train_loop.run_loop`: steps,
metrics through one sink, checkpoints, held-out evaluation) and the export (`export.export_run`: HF safetensors under
`hf/`, a LoRA run's PEFT adapter under `adapter/`). `run` calls the three and writes `metrics.json`.

A killed job rerun with the same config resumes from its last checkpoint and ends with the same params as an
uninterrupted one.
"""

from __future__ import annotations

import os
import time

from sweet_jax.files.atomic import write_json
from sweet_jax.training.export import export_run
from sweet_jax.training.job_setup import SetupError, set_up
from sweet_jax.training.train_loop import run_loop

__all__ = ["SetupError", "run"]


def run(cfg) -> dict:
    """Train according to `cfg` (a `job_config.JobConfig`, or a config file's ConfigDict, validated first). Returns
    the final metrics, also written to the run's metrics.json."""
    t_start = time.time()
    job = set_up(cfg)
    loop = run_loop(job)
    export_run(job, loop.state["params"])
    stats = job.stats
    result = {
        "objective": job.cfg.objective, "steps": job.total_steps, "updates": job.total_steps // job.accumulation,
        "train_items": len(job.train.items), "held_out_items": len(job.held_out.items),
        "records": stats.records, "skipped_records": stats.skipped_records,
        "skipped_examples": stats.skipped_examples, "truncated": stats.truncated,
        "held_out": loop.final, "history": loop.history, "last_train": loop.last_train,
        "seconds": time.time() - t_start,
    }
    if job.leader:
        write_json(os.path.join(job.run_dir, "metrics.json"), result, indent=2, default=float)
    job.manager.close()
    return result
