"""The SYNTHETIC credit-assignment testbed (`sweet_jax.colbench.testbed_domain`):
`python -m sweet_jax.testbed oracle|random|collector --config configs/testbed_tiny.py [--seed S] [--episodes N]`.

Plays a scripted policy (optimal, uniform random over the domain's actions, or the data-collecting policy) through
the real backend episodes against the scripted human, scores every answer with the sandboxed evaluator, and prints
the measured success beside the success the domain's dynamics give exactly (the mean of V over the episodes' tasks):

    oracle: measured 0.512 computed 0.497

then the details (standard error, the expectation over the whole task distribution) as JSON. `--out FILE` keeps the
scored trajectories (JSONL, written atomically).
"""

import json
import sys

from absl import flags
from ml_collections import config_flags

from sweet_jax.cli.app import require_config, run
from sweet_jax.colbench.sandbox import SandboxUnavailable

FLAGS = flags.FLAGS
POLICIES = {"oracle": "optimal", "random": "random", "collector": "collector"}


def main(argv) -> int:
    from sweet_jax.colbench.testbed_diagnostics import measure
    from sweet_jax.colbench.testbed_domain import TestbedSettings

    if len(argv) != 2 or argv[1] not in POLICIES:
        print(f"error: bad command line: expected one of {', '.join(POLICIES)}, e.g. `python -m sweet_jax.testbed "
              f"oracle --config configs/testbed_tiny.py`", file=sys.stderr)
        return 2
    cfg = require_config(FLAGS.config, "configs/testbed_tiny.py")
    settings = TestbedSettings.from_config(cfg.testbed)
    seed = cfg.seed if FLAGS.seed is None else FLAGS.seed
    episodes = cfg.episodes if FLAGS.episodes is None else FLAGS.episodes
    result = measure(settings, POLICIES[argv[1]], seed=seed, episodes=episodes, out=FLAGS.out)
    print(f"{argv[1]}: measured {result['measured']:.3f} computed {result['computed']:.3f}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    config_flags.DEFINE_config_file("config", None, "A testbed config file under configs/.", lock_config=True)
    flags.DEFINE_integer("seed", None, "task and policy seed (default: the config's)")
    flags.DEFINE_integer("episodes", None, "episodes to play (default: the config's)")
    flags.DEFINE_string("out", None, "also write the scored trajectories here (JSONL)")
    run(main, errors=(SandboxUnavailable, ValueError))
