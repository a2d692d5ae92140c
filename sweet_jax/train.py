"""Offline training: `python -m sweet_jax.train --config configs/critic_tiny.py [--config.a.b=value ...]`."""

from __future__ import annotations

import json
import sys

from absl import app, flags
from ml_collections import config_flags

from sweet_jax.cli import parse_flags, setup_logging

config_flags.DEFINE_config_file("config", None, "A job config file under configs/.", lock_config=True)
FLAGS = flags.FLAGS


def main(argv):
    del argv
    setup_logging()
    from sweet_jax import distributed
    from sweet_jax.data.trajectories import DataError
    from sweet_jax.models import CheckpointError, ConfigError
    from sweet_jax.training.trainer import SetupError, run

    if FLAGS.config is None:
        raise app.UsageError("--config is required, e.g. --config configs/critic_tiny.py")
    try:
        distributed.initialize()  # multi-host: join the other processes before any device is used
        result = run(FLAGS.config)
    except (DataError, SetupError, ConfigError, CheckpointError, distributed.DistributedError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not distributed.is_leader():
        return 0
    print(json.dumps({"held_out": result["held_out"], "steps": result["steps"], "truncated": result["truncated"],
                      "seconds": round(result["seconds"], 1)}))
    return 0


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
