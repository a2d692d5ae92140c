"""Configs and their schema.

    python -m sweet_jax.config show configs/critic_tiny.py [--config.optim.lr=1e-4 ...]
        the resolved config, every setting with its default filled in and its meaning, after validating it
    python -m sweet_jax.config docs [--check]
        writes docs/settings.md, the settings reference generated from the schemas (--check: exit 1 if it differs)

Exit 2 for a config that breaks its schema (the file, line, field and rule are named).
"""

import os
import sys

from absl import flags
from ml_collections import config_flags

from sweet_jax.cli.app import require_config, run

FLAGS = flags.FLAGS
DOCS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "settings.md")


def _schemas() -> dict:
    """{the key that marks such a config: its loader}: every typed config kind."""
    from sweet_jax.colbench.collect_config import CollectConfig
    from sweet_jax.colbench.testbed_config import TestbedConfig
    from sweet_jax.runs.pipeline_config import load_pipeline_config
    from sweet_jax.training.job_config import JobConfig

    return {"objective": JobConfig, "agent": CollectConfig, "episodes": TestbedConfig,
            "run_dir": load_pipeline_config}


def reference() -> str:
    from sweet_jax.cli.schema import reference_markdown
    from sweet_jax.runs.pipeline_config import SCHEMAS, PipelineConfig
    from sweet_jax.training.job_config import JobConfig

    parts = ["# Settings", "", "Generated from the schemas by `python -m sweet_jax.config docs`; do not edit by hand. "
             "How to add a setting: [CONTRIBUTING.md](../CONTRIBUTING.md#adding-a-setting).", "",
             "## Training jobs (`python -m sweet_jax.train`, `python -m sweet_jax.plan`)", "",
             "`sweet_jax.training.job_config.JobConfig`", "", reference_markdown(JobConfig), "",
             "## Pipelines (`python -m sweet_jax.pipeline`)", "",
             "`sweet_jax.runs.pipeline_config`: `task_type` picks the track's schema. Every track has the backend's "
             "settings; the frontend and testbed tracks add their own.", ""]
    for track, schema in SCHEMAS.items():
        parent = schema.__mro__[1]
        added = tuple(n for n in schema.model_fields if n not in parent.model_fields)
        if schema is PipelineConfig:
            parts += [f"### {track} (`{schema.__name__}`)", "", reference_markdown(schema), ""]
        else:
            parts += [f"### {track} (`{schema.__name__}`): the settings of `{parent.__name__}`"
                      + (", and" if added else ""), ""]
            parts += [reference_markdown(schema, only=added), ""] if added else []
    from sweet_jax.colbench.collect_config import CollectConfig
    from sweet_jax.colbench.testbed_config import TestbedConfig

    parts += ["## Collection jobs (`python -m sweet_jax.collect`)", "",
              "`sweet_jax.colbench.collect_config.CollectConfig`", "", reference_markdown(CollectConfig), "",
              "## The testbed command (`python -m sweet_jax.testbed`)", "",
              "`sweet_jax.colbench.testbed_config.TestbedConfig`", "", reference_markdown(TestbedConfig), ""]
    return "\n".join(parts)


def main(argv) -> int:
    from sweet_jax.cli.schema import show

    command = argv[1] if len(argv) > 1 else ""
    if command == "docs":
        text = reference()
        if FLAGS.check:
            same = os.path.exists(DOCS) and open(DOCS).read() == text
            print(f"{DOCS} is {'up to date' if same else 'out of date: run python -m sweet_jax.config docs'}")
            return 0 if same else 1
        from sweet_jax.files.atomic import write_text

        write_text(DOCS, text)
        print(DOCS)
        return 0
    if command != "show" or len(argv) > 2:
        print("error: bad command line: expected `show CONFIG [--config.a.b=value ...]` or `docs [--check]`",
              file=sys.stderr)
        return 2
    config = require_config(FLAGS.config, "configs/critic_tiny.py")
    for marker, schema in _schemas().items():
        if marker in config:
            print(show(require_config(config, "", schema)))
            return 0
    print(f"error: {config_flags.get_config_filename(FLAGS['config'])}: no typed schema for this kind of config yet "
          f"(typed: training jobs, pipelines, collection jobs and the testbed command)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    # `show PATH` is `show --config=PATH`, so that --config.a.b=value overrides apply to it
    if len(sys.argv) > 2 and sys.argv[1] == "show" and not sys.argv[2].startswith("-"):
        sys.argv[2] = f"--config={sys.argv[2]}"
    config_flags.DEFINE_config_file("config", None, "A config file under configs/.", lock_config=True)
    flags.DEFINE_boolean("check", False, "docs: check docs/settings.md instead of writing it.")
    run(main)
