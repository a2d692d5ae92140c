"""The pipeline's schema (`runs.pipeline_config`): every shipped pipeline config loads into its track's schema; a
misspelt field, a wrong type, a bad enum and a broken rule of the track are refused when the config loads, naming the
file, line, field and rule, before any stage runs."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

from sweet_jax.cli.schema import SchemaError, field_names
from sweet_jax.runs import pipeline_config as pc
from sweet_jax.runs.pipeline_config import SCHEMAS, load_pipeline_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHIPPED = {"sweet_backend_tiny.py": pc.PipelineConfig, "sweet_backend_8b.py": pc.PipelineConfig,
           "sweet_backend_70b.py": pc.PipelineConfig, "sweet_frontend_tiny.py": pc.FrontendPipelineConfig,
           "sweet_frontend_8b.py": pc.FrontendPipelineConfig, "sweet_testbed_tiny.py": pc.TestbedPipelineConfig,
           "sweet_testbed_scripted_tiny.py": pc.TestbedPipelineConfig, "testbed_base_tiny.py": pc.TestbedBaseConfig}


def _file_config(path: str, *args):
    spec = importlib.util.spec_from_file_location("pipeline_cfg", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(*args)


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_every_shipped_pipeline_config_loads_into_its_tracks_schema(name):
    path = os.path.join(ROOT, "configs", name)
    cfg = load_pipeline_config(_file_config(path), source=path)
    assert type(cfg) is SHIPPED[name] and cfg.task_type == cfg.track
    assert load_pipeline_config(cfg.to_config_dict()) == cfg  # the run's config.json loads back the same


def test_every_pipeline_setting_has_a_meaning():
    for schema in SCHEMAS.values():
        for name in field_names(schema):
            cls, parts = schema, name.split(".")
            for part in parts[:-1]:
                cls = cls.model_fields[part].annotation
            assert cls.model_fields[parts[-1]].description, f"{schema.__name__}.{name} has no meaning"


def _custom(tmp_path, body: str) -> str:
    path = tmp_path / "pipe.py"
    path.write_text(textwrap.dedent(f'''\
        import ml_collections
        from sweet_jax.training.defaults import derived_from


        def get_config():
            c = derived_from({os.path.join(ROOT, "configs", "x.py")!r}, "sweet_backend_tiny.py")
        ''') + textwrap.indent(textwrap.dedent(body), "    ") + "    return c\n")
    return str(path)


def _line(path: str, text: str) -> int:
    return next(i for i, line in enumerate(open(path), 1) if text in line)


def test_a_misspelt_field_names_the_file_line_and_the_nearest(tmp_path):
    path = _custom(tmp_path, "c.serve.keeps = True\n")
    with pytest.raises(SchemaError) as e:
        load_pipeline_config(_file_config(path), source=path)
    assert str(e.value).startswith(f"{path}:{_line(path, 'keeps')}: field 'serve.keeps': unknown field; the closest "
                                   f"known fields: serve.keep")


def test_a_wrong_type_and_a_bad_enum_are_refused(tmp_path):
    path = _custom(tmp_path, "c.collect = ml_collections.ConfigDict(dict(c.collect.to_dict(), rollouts='three'))\n")
    with pytest.raises(SchemaError, match=r"field 'collect.rollouts': input should be a valid integer, got 'three'"):
        load_pipeline_config(_file_config(path), source=path)
    path = _custom(tmp_path, "c.inference.backend = 'vlm'\n")
    with pytest.raises(SchemaError, match=rf"pipe.py:{_line(path, 'vlm')}: field 'inference.backend': input should "
                                          r"be 'sweet_jax', 'vllm', 'describer' or 'endpoint', got 'vlm'"):
        load_pipeline_config(_file_config(path), source=path)
    with pytest.raises(SchemaError, match="field 'task_type': input should be one of 'backend', 'frontend', "
                                          "'testbed', 'testbed_base', got 'backnd'"):
        load_pipeline_config({"task_type": "backnd"})


@pytest.mark.parametrize("body, rule", [
    ("c.tasks.kind = 'design'\n", "tasks.kind='design': a backend run generates the ask domain"),
    ("c.inference.roles.rank = 'vlm'\n", "inference.roles.rank='vlm': expected one of sweet_jax, vllm, describer, "
                                         "endpoint"),
    ("c.jobs = 0\n", "jobs must be >= 1, got 0"),
    ("c.task_type = 'frontend'\n", "tasks.kind='ask': a frontend run generates the design domain"),
])
def test_a_broken_rule_of_the_track_is_refused(tmp_path, body, rule):
    path = _custom(tmp_path, body)
    with pytest.raises(SchemaError) as e:
        load_pipeline_config(_file_config(path), source=path)
    assert rule in str(e.value)


def test_a_testbed_setting_out_of_the_domains_range_is_refused():
    with pytest.raises(SchemaError, match="field 'testbed': testbed settings out of range: budget=-1"):
        load_pipeline_config({"task_type": "testbed", "tasks": {"kind": "testbed"}, "testbed": {"budget": -1}})


def test_the_pipeline_refuses_a_bad_config_before_any_stage(tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "sweet_jax.pipeline", "--config=configs/sweet_backend_tiny.py",
                           f"--config.run_dir={run_dir}", "--config.tasks.kind=design"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "error: configs/sweet_backend_tiny.py: tasks.kind='design': a backend run generates" in proc.stderr
    assert not run_dir.exists()


@pytest.mark.parametrize("section, overrides, rule", [
    # a misspelt field of the critic's job, named with the nearest
    ("critic", ("train.epoch=1",), "unknown config field 'train.epoch' (--config.train.epoch) in "),
    # a value that is not its field's type
    ("rft", ("train.epochs=two",), "flag --config.train.epochs=two: invalid literal for int()"),
    # a bad enum of the multi-turn DPO job
    ("mtdpo", ("loss.reduction=loose",),
     "field 'loss.reduction': input should be 'trajectory_mean', 'turn_mean_sum' or 'sum', got 'loose'"),
    # a broken cross-field rule: an ablation's data against the objective of the critic's recipe
    ("critic_no_info", ("data.kind=rft",), "objective 'critic' trains on pairs of data.kind"),
])
def test_each_stages_training_job_is_checked_before_any_stage(tmp_path, monkeypatch, section, overrides, rule):
    """A stage's training job is its config file with the stage's overrides: a bad one is refused when the pipeline
    starts (`shared_stages.check_jobs`), naming the stage, not when that stage's turn comes, hours in."""
    from sweet_jax.pipelines import stages
    from sweet_jax.pipelines.stages import run_pipeline

    def no_stage(*args, **kwargs):
        raise AssertionError("a stage ran: the bad training job was not refused first")

    monkeypatch.setattr(stages, "run_stages", no_stage)

    cfg = _file_config(os.path.join(ROOT, "configs", "sweet_backend_tiny.py"))
    cfg[section].overrides = overrides
    cfg.run_dir = str(tmp_path / "run")
    with pytest.raises(SchemaError) as e:
        run_pipeline(cfg)
    assert str(e.value).startswith(f"stage '{section}', its training job: "), str(e.value)
    assert rule in str(e.value), str(e.value)
    assert not (tmp_path / "run").exists()  # refused before the run directory, the tasks or any data
