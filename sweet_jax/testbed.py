"""The SYNTHETIC credit-assignment testbed (`sweet_jax.colbench.testbed_domain`):
`python -m sweet_jax.testbed oracle|random|collector --config configs/testbed_tiny.py [--seed S] [--episodes N]`.

Plays a scripted policy (optimal, uniform random over the domain's actions, or the data-collecting policy) through
the real backend episodes against the scripted human, scores every answer with the sandboxed evaluator, and prints
the measured success beside the success the domain's dynamics give exactly (the mean of V over the episodes' tasks):

    oracle: measured 0.512 computed 0.497

then the details (standard error, the expectation over the whole task distribution) as JSON. `--out FILE` keeps the
scored trajectories (JSONL, written atomically).

Two more commands measure models against the ground truth (`ranking.testbed_judges`), on the tasks of `--tasks`
(JSONL) and writing JSON to `--out`:

    python -m sweet_jax.testbed gate --config configs/testbed_tiny.py --model DIR --tasks FILE --out FILE
    python -m sweet_jax.testbed judges --config configs/testbed_tiny.py --model DIR --critic NAME=DIR ... \
        [--no_info NAME ...] --tasks FILE --out FILE

`gate`: the base's skills (its answers copy what it was told; as a judge, the information prefix makes the right
answer more likely). `judges`: each critic's ranking of the initial policy's candidates against Q*, under both
ranking references. The config's `testbed` block, or `--settings` (the block as JSON), sets the domain.
"""

import dataclasses
import json
import sys

from absl import flags
from ml_collections import config_flags

from sweet_jax.cli.app import require_config, run
from sweet_jax.colbench.sandbox import SandboxUnavailable
from sweet_jax.files.errors import DataError

FLAGS = flags.FLAGS
POLICIES = {"oracle": "optimal", "random": "random", "collector": "collector"}
MEASURES = ("gate", "judges")


def _measure_models(command: str, settings, seed: int) -> int:
    """`gate` or `judges`: the figures as JSON on stdout and, atomically, in --out."""
    from sweet_jax.files.atomic import write_json
    from sweet_jax.files.jsonl import read_jsonl
    from sweet_jax.ranking import testbed_judges

    missing = [f"--{f}" for f in ("model", "tasks", "out") if not getattr(FLAGS, f)]
    if missing:
        print(f"error: bad command line: `{command}` needs {', '.join(missing)}", file=sys.stderr)
        return 2
    tasks = read_jsonl(FLAGS.tasks, ("problem_description", "ground_truth", "testbed"))
    if command == "gate":
        result = testbed_judges.gate(FLAGS.model, settings, tasks, seed=seed)
    else:
        critics = {}
        for spec in FLAGS.critic or ():
            name, sep, path = spec.partition("=")
            if not sep or not name or not path:
                print(f"error: bad command line: --critic {spec!r}: expected NAME=DIR", file=sys.stderr)
                return 2
            critics[name] = path
        result = testbed_judges.judges(FLAGS.model, critics, settings, tasks, no_info=tuple(FLAGS.no_info or ()),
                                       seed=seed)
    write_json(FLAGS.out, result)
    print(json.dumps(result))
    return 0


def main(argv) -> int:
    from sweet_jax.colbench.testbed_config import TestbedConfig
    from sweet_jax.colbench.testbed_diagnostics import measure
    from sweet_jax.colbench.testbed_domain import TestbedSettings

    if len(argv) != 2 or argv[1] not in (*POLICIES, *MEASURES):
        print(f"error: bad command line: expected one of {', '.join((*POLICIES, *MEASURES))}, e.g. `python -m "
              f"sweet_jax.testbed oracle --config configs/testbed_tiny.py`", file=sys.stderr)
        return 2
    cfg = require_config(FLAGS.config, "configs/testbed_tiny.py", TestbedConfig)
    settings = TestbedSettings.from_config(json.loads(FLAGS.settings)) if FLAGS.settings else (
        cfg.testbed.domain_settings())
    if FLAGS.budget is not None:
        settings = dataclasses.replace(settings, budget=FLAGS.budget)
    seed = cfg.seed if FLAGS.seed is None else FLAGS.seed
    if argv[1] in MEASURES:
        return _measure_models(argv[1], settings, seed)
    episodes = cfg.episodes if FLAGS.episodes is None else FLAGS.episodes
    result = measure(settings, POLICIES[argv[1]], seed=seed, episodes=episodes, out=FLAGS.out)
    print(f"{argv[1]}: measured {result['measured']:.3f} computed {result['computed']:.3f}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    config_flags.DEFINE_config_file("config", None, "A testbed config file under configs/.", lock_config=True)
    flags.DEFINE_integer("seed", None, "task and policy seed (default: the config's)")
    flags.DEFINE_integer("episodes", None, "episodes to play (default: the config's)")
    flags.DEFINE_string("out", None, "also write the scored trajectories here (JSONL); gate, judges: the figures "
                                     "(JSON)")
    flags.DEFINE_string("settings", None, "the domain's settings as JSON, in place of the config's `testbed` block")
    flags.DEFINE_integer("budget", None, "the questions before the answer (default: the settings')")
    flags.DEFINE_string("model", None, "gate: the base model; judges: the initial policy (an HF directory)")
    flags.DEFINE_string("tasks", None, "gate, judges: the held-out tasks (JSONL)")
    flags.DEFINE_multi_string("critic", None, "judges: a critic, NAME=DIR (repeat for several)")
    flags.DEFINE_multi_string("no_info", None, "judges: the name of a critic that reads no information")
    run(main, errors=(SandboxUnavailable, ValueError, DataError))
