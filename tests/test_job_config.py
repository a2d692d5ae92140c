"""The training job's schema (`training.job_config`): every setting declared once with its meaning; a misspelt field,
a wrong type, a bad enum and a broken cross-field rule each refused when the config loads, naming the file, the line,
the field and the rule, before any data is read; `python -m sweet_jax.config show` and the generated reference."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import ml_collections
import pytest

from sweet_jax.cli.schema import SchemaError, field_names
from sweet_jax.training.job_config import JobConfig
from sweet_jax.training.objective_registry import REGISTRY

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config_file(tmp_path, body: str) -> str:
    """A config file on the tiny critic recipe with `body` (lines over `c`) applied."""
    path = tmp_path / "job.py"
    path.write_text(textwrap.dedent('''\
        import ml_collections
        from sweet_jax.training.defaults import recipe_tiny


        def get_config():
            c = recipe_tiny("critic", "x")
        ''') + textwrap.indent(textwrap.dedent(body), "    ") + "    return c\n")
    return str(path)


def _load(path: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location("job", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return JobConfig.load(module.get_config(), source=path)


def _line(path: str, text: str) -> int:
    return next(i for i, line in enumerate(open(path), 1) if text in line)


def test_every_setting_has_a_meaning_and_the_defaults_load():
    defaults = JobConfig()
    assert JobConfig.load(defaults.to_config_dict()) == defaults
    missing = [name for name in field_names(JobConfig) if not _meaning(name)]
    assert not missing, f"settings without a one-line meaning: {missing}"
    assert len(field_names(JobConfig)) > 60


def _meaning(dotted: str) -> str:
    cls, parts = JobConfig, dotted.split(".")
    for part in parts[:-1]:
        cls = cls.model_fields[part].annotation
    return cls.model_fields[parts[-1]].description


def test_a_misspelt_field_is_refused_with_the_file_line_and_the_nearest(tmp_path):
    path = _config_file(tmp_path, "c.optim.lrr = 1e-4\n")
    with pytest.raises(SchemaError) as e:
        _load(path)
    assert str(e.value) == (f"{path}:{_line(path, 'c.optim.lrr')}: field 'optim.lrr': unknown field; the closest known "
                            f"fields: optim.lr, optim.clip, optim.b1")


def test_a_wrong_type_is_refused(tmp_path):
    path = _config_file(tmp_path, "c.optim = ml_collections.ConfigDict(dict(c.optim.to_dict(), lr='fast'))\n")
    with pytest.raises(SchemaError, match=rf"job.py:{_line(path, 'fast')}: field 'optim.lr': input should be a valid "
                                          r"number, got 'fast' \(str\)"):
        _load(path)
    with pytest.raises(SchemaError, match="field 'train.tensorboard': input should be a valid boolean, got 1 \\(int\\)"):
        JobConfig.load({"train": {"tensorboard": 1}})


def test_a_bad_enum_is_refused_with_the_choices(tmp_path):
    path = _config_file(tmp_path, "c.loss.reduction = 'mean'\n")
    with pytest.raises(SchemaError) as e:
        _load(path)
    assert str(e.value) == (f"{path}:{_line(path, 'reduction')}: field 'loss.reduction': input should be "
                            f"'trajectory_mean', 'turn_mean_sum' or 'sum', got 'mean' (str)")
    with pytest.raises(SchemaError, match="field 'objective': input should be 'critic', 'dpo', 'sft', 'reward' or "
                                          "'value', got 'ppo'"):
        JobConfig.load({"objective": "ppo"})


@pytest.mark.parametrize("body, rule", [
    ("c.optim.batch_size = 12\n", "optim.batch_size=12 must be a multiple of optim.micro_batch_size=8"),
    ("c.objective = 'value'\n", "objective 'value' trains on examples of data.kind 'turn_values', but "
                                "data.kind='trajectory_pairs' gives pairs"),
    ("c.objective = 'sft'\n", "objective 'sft' trains on examples of data.kind 'rft' or 'turn_values'"),
    ("c.objective = 'reward'\nc.lora.rank = 4\n", "LoRA (lora.rank=4) trains the log-prob objectives; objective "
                                                  "'reward' trains a new score head: set lora.rank=0"),
    ("c.objective = 'sft'\nc.data.kind = 'rft'\nc.data.pack_length = 1024\n",
     "data.pack_length=1024 is over data.max_len=512"),
    ("c.mesh.data = -1\n", "mesh sizes must be >= 1, one of them may be -1 (inferred)"),
    ("c.lora.rank = 4\nc.lora.targets = 'q_proj,attn'\n", "lora.targets must be distinct names among q_proj"),
    ("c.train.log_every = 0\n", "train.log_every must be >= 1, got 0"),
])
def test_a_broken_cross_field_rule_is_refused(tmp_path, body, rule):
    path = _config_file(tmp_path, body)
    with pytest.raises(SchemaError) as e:
        _load(path)
    assert str(e.value).startswith(f"{path}: ") and rule in str(e.value)


def test_every_objective_trains_on_the_data_it_declares():
    """The registry's data kinds agree with the schema's, and pairs come from pair kinds only."""
    kinds = set(JobConfig.model_fields["data"].annotation.model_fields["kind"].annotation.__args__)
    for o in REGISTRY.values():
        assert o.data_kinds and set(o.data_kinds) <= kinds
        assert all((k in ("rft", "turn_values")) != o.paired for k in o.data_kinds), o.name
        JobConfig.load({"objective": o.name, "data": {"kind": o.data_kinds[0]}})


def _python(*args, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, env=env, timeout=300,
                          **kw)


def test_train_refuses_a_bad_config_before_reading_data_or_making_the_run(tmp_path):
    """A bad enum in a job whose data file does not exist: the schema's error (exit 2, one line, no traceback), not
    the data's, and no run directory."""
    out = tmp_path / "run"
    path = _config_file(tmp_path, f"c.data.path = {str(tmp_path / 'missing.jsonl')!r}\n"
                                  f"c.train.output_dir = {str(out)!r}\nc.data.mask_style = 'loose'\n")
    proc = _python("-m", "sweet_jax.train", f"--config={path}")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert (f"error: {path}:{_line(path, 'mask_style')}: field 'data.mask_style': input should be 'content' or "
            f"'official', got 'loose' (str)") in proc.stderr
    assert "missing.jsonl" not in proc.stderr and not out.exists()
    # an override on the command line goes through the same schema
    proc = _python("-m", "sweet_jax.train", "--config=configs/critic_tiny.py", "--config.optim.batch_size=12",
                   f"--config.train.output_dir={out}")
    assert proc.returncode == 2 and "must be a multiple of optim.micro_batch_size=8" in proc.stderr
    assert not out.exists()


def test_config_show_prints_the_resolved_config_with_defaults_and_meanings():
    proc = _python("-m", "sweet_jax.config", "show", "configs/critic_tiny.py", "--config.optim.lr=1e-4")
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = {line.split(" = ", 1)[0]: line for line in proc.stdout.splitlines()}
    assert set(lines) == set(field_names(JobConfig))
    assert lines["optim.lr"].startswith("optim.lr = 0.0001 ") and "# the peak learning rate" in lines["optim.lr"]
    assert json.loads(lines["loss.reference"].split(" = ", 1)[1].split("  #")[0]) == "cached"  # a default
    bad = _python("-m", "sweet_jax.config", "show", "configs/critic_tiny.py", "--config.loss.reference=never")
    assert bad.returncode == 2 and "field 'loss.reference'" in bad.stderr


def test_the_settings_reference_is_generated_from_the_schema():
    sys.path.insert(0, ROOT)
    from sweet_jax.config import DOCS, reference

    with open(DOCS) as fh:
        assert fh.read() == reference(), "docs/settings.md is out of date: run python -m sweet_jax.config docs"
    for name in field_names(JobConfig):
        assert f"| `{name}` |" in reference()


def test_every_job_config_round_trips_to_the_same_json():
    """A run's config.json is the loaded config's JSON: the same bytes as each config file's ConfigDict gives (its
    fields in the order they were set)."""
    import glob
    import importlib.util

    jobs = 0
    for path in sorted(glob.glob(os.path.join(ROOT, "configs", "*.py"))):
        spec = importlib.util.spec_from_file_location("c", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        c = module.get_config()
        if "objective" not in c:  # pipeline, collection and testbed configs
            continue
        loaded = JobConfig.load(c, source=path)
        assert isinstance(loaded.to_config_dict(), ml_collections.ConfigDict)
        assert loaded.to_config_dict().to_json_best_effort(indent=2) == c.to_json_best_effort(indent=2), path
        jobs += 1
    assert jobs >= 20
