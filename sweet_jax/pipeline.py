"""SWEET-RL end to end: `python -m sweet_jax.pipeline --config configs/sweet_backend_tiny.py [--config.x=y ...]`.

    --stage NAME   run one stage, or several: --stage sample,rank (in pipeline order; their inputs must exist)
    --from NAME    start at a stage;  --until NAME  stop after one
    --force        rerun the selected stages even when they finished (the jobs still resume from their partial files)

Every stage writes into `run_dir`, is skipped once its marker RUN/stages/NAME.json exists, and runs as a child
process with its log in RUN/logs/NAME.log, so a kill at any point followed by the same command redoes nothing that
had finished. SIGTERM, SIGHUP or SIGINT to the driver stops every job and server it started before it exits. The
stages and what they do: `sweet_jax.pipelines.backend_stages`, `frontend_stages` and `testbed_stages` (the run's
`task_type` picks one). The config is checked against its track's schema (`sweet_jax.runs.pipeline_config`) before
any stage runs, and so is the training job of every stage it keeps (its config file with the stage's overrides,
against the training schema). Prints each stage's summary as JSON; exit 1 when a stage fails (the message names its
log), 2 for a bad command line or config.
"""

import json
import sys

from absl import flags
from ml_collections import config_flags

from sweet_jax.cli.app import require_config, run
from sweet_jax.cli.processes import claim_children, stop_on_signals
from sweet_jax.files.errors import DataError
from sweet_jax.inference.backends import ManagedServer
from sweet_jax.runs.pipeline_config import load_pipeline_config
from sweet_jax.pipelines.stages import NAMES, StageError, run_pipeline

FLAGS = flags.FLAGS


def main(argv) -> int:
    cfg = require_config(FLAGS.config, "configs/sweet_backend_tiny.py", load_pipeline_config)  # before any stage
    # SIGTERM, SIGHUP or Ctrl-C: every job and server the run started is stopped too, then the driver dies of the
    # signal; the jobs resume from their partial files when the same command runs again
    stop_on_signals(claim_children("pipeline"), before=ManagedServer.unwatch_all, what="the pipeline")
    try:
        records = run_pipeline(cfg, only=FLAGS.stage, start=FLAGS["from"].value, until=FLAGS.until,
                               force=FLAGS.force)
    except (StageError, DataError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(json.dumps({name: rec["summary"] for name, rec in records.items()}))
    return 0


if __name__ == "__main__":
    config_flags.DEFINE_config_file("config", None, "A pipeline config under configs/.", lock_config=True)
    flags.DEFINE_string("stage", None, f"run only this stage, or these, comma-separated ({', '.join(NAMES)})")
    flags.DEFINE_string("from", None, "start at this stage")
    flags.DEFINE_string("until", None, "stop after this stage")
    flags.DEFINE_bool("force", False, "rerun the selected stages even if they finished (e.g. --from sample --force "
                                      "after changing the sampler; the jobs still resume from their partial files)")
    run(main)
