"""ColBench rollout collection: `python -m sweet_jax.collect --config configs/collect_backend.py [--config.x=y ...]`.

Resumable: rerun the same command after a crash or kill and it continues where it stopped (see
`sweet_jax.colbench.collect`). Exit status: 0 when every conversation is in, 1 when some failed after all retries
(rerun to retry them), 2 for bad input.
"""

from __future__ import annotations

import json
import sys

from absl import app, flags
from ml_collections import config_flags

from sweet_jax.cli import parse_flags, setup_logging

config_flags.DEFINE_config_file("config", None, "A collection config file under configs/.", lock_config=True)
FLAGS = flags.FLAGS


def main(argv):
    del argv
    setup_logging()
    from sweet_jax.colbench.collect import collect
    from sweet_jax.data.trajectories import DataError

    if FLAGS.config is None:
        raise app.UsageError("--config is required, e.g. --config configs/collect_backend.py")
    try:
        embed = None
        if FLAGS.config.task_type == "frontend" and FLAGS.config.clip:
            from sweet_jax.models.clip import image_embedder  # JAX: the colbench package itself imports none

            embed = image_embedder(FLAGS.config.clip)
        summary = collect(FLAGS.config, embed=embed)
    except (DataError, ValueError, FileNotFoundError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(summary))
    if summary["failed"]:
        print(f"error: {summary['failed']} conversations failed after every retry (first: "
              f"{summary['first_failure']}); rerun the same command to retry them", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
