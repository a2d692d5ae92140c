"""ColBench rollout collection: `python -m sweet_jax.collect --config configs/collect_backend.py [--config.x=y ...]`.

Resumable: rerun the same command after a crash or kill and it continues where it stopped (see
`sweet_jax.colbench.collection`). Exit status: 0 when every conversation is in, 1 when some failed after all retries
(rerun to retry them), 2 for bad input.
"""

import json
import sys

from absl import flags
from ml_collections import config_flags

from sweet_jax.cli.app import require_config, run
from sweet_jax.files.errors import DataError

FLAGS = flags.FLAGS


def main(argv) -> int:
    from sweet_jax.colbench.collection import collect

    from sweet_jax.colbench.collect_config import CollectConfig

    cfg = require_config(FLAGS.config, "configs/collect_backend.py", CollectConfig)
    embed = None
    if cfg.task_type == "frontend" and cfg.clip:
        from sweet_jax.models.clip import image_embedder  # JAX: the colbench package itself imports none

        embed = image_embedder(cfg.clip)
    summary = collect(cfg, embed=embed)
    print(json.dumps(summary))
    if summary["failed"]:
        print(f"error: {summary['failed']} conversations failed after every retry (first: "
              f"{summary['first_failure']}); rerun the same command to retry them", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    config_flags.DEFINE_config_file("config", None, "A collection config file under configs/.", lock_config=True)
    run(main, errors=(DataError, ValueError, FileNotFoundError, KeyError))
