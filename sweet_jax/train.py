"""Offline training: `python -m sweet_jax.train --config configs/critic_tiny.py [--config.a.b=value ...]`.

Trains the SWEET critic, the SWEET actor (DPO), multi-turn DPO or RFT, as the config's `objective` says (see
`sweet_jax.training.trainer`). Rerunning the same command after a crash or kill resumes from the last checkpoint.
Prints the final held-out metrics as JSON; exit 2 for bad input.
"""

import json

from absl import flags
from ml_collections import config_flags

from sweet_jax.cli.app import require_config, run

FLAGS = flags.FLAGS


def main(argv) -> int:
    from sweet_jax.parallel import distributed
    from sweet_jax.training.job_config import JobConfig
    from sweet_jax.training.trainer import run as train

    cfg = require_config(FLAGS.config, "configs/critic_tiny.py", JobConfig)
    distributed.initialize()  # multi-host: join the other processes before any device is used
    result = train(cfg)
    if distributed.is_leader():
        print(json.dumps({"held_out": result["held_out"], "steps": result["steps"], "truncated": result["truncated"],
                          "seconds": round(result["seconds"], 1)}))
    return 0


if __name__ == "__main__":
    from sweet_jax.files.errors import DataError
    from sweet_jax.models import CheckpointError, ConfigError
    from sweet_jax.parallel.distributed import DistributedError
    from sweet_jax.training.trainer import SetupError

    config_flags.DEFINE_config_file("config", None, "A job config file under configs/.", lock_config=True)
    run(main, errors=(DataError, SetupError, ConfigError, CheckpointError, DistributedError))
