"""The one command-line stack (`sweet_jax.cli.app`): typed settings become flags and come back unchanged, the pipeline's
child commands are built from the same settings, and every command answers a misspelt flag with the same one-line
error."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import budget
import pytest
from absl import flags

from sweet_jax.cli.app import command_line, define_settings, settings_from_flags
from sweet_jax.colbench.task_writer import TaskGenerationSettings
from sweet_jax.inference.server import ServeSettings
from sweet_jax.models.random_weights import RandomInitSettings
from sweet_jax.ranking.candidates import PairsSettings, RankSettings, SampleSettings
from sweet_jax.ranking.evaluation import EvaluateSettings
from sweet_jax.reporting.run_report import ReportSettings
from sweet_jax.ranking.selection import SelectionSettings, judge_spec, parse_judges

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

EXAMPLES = [
    SampleSettings(model="/m", input="/i.jsonl", output="/o.jsonl", data_fraction=0.25, n=4, temperature=0.7,
                   max_tokens=12, tokenizer="/tok", dtype="bfloat16"),
    RankSettings(critic="/c", input="/s.jsonl", output="/r.jsonl", kind="head", reference="model",
                 reference_model="/ref", no_info=True, use_sum=True, no_header=True),
    PairsSettings(input="/r.jsonl", output="/p.jsonl", num_pairs=2, seed=7, no_prompt=True),
    SelectionSettings(policy="/p", simulator="/s", tasks="/t.jsonl", output="/o.json", ns="1,4",
                      judge=["SWEET critic, sum=/c:sum", "value function=/v:value"], repeats=2, seed=3),
    ServeSettings(model="/m", port=9001, dtype="float32", mesh="data=2,tensor=4", max_batch=8),
    EvaluateSettings(task_type="frontend", input="/i.jsonl", output="/o.jsonl", clip="/clip", workers=3),
    TaskGenerationSettings(source="/x.jsonl", output="/t.jsonl", model="gen", limit=5, temperature=0.5),
    RandomInitSettings(output="/o", seed=3, std=0.1, overrides='{"hidden_size": 32}', head_from_embed=True),
    ReportSettings(run_dir=["/run0", "/run1"], output="/out"),
]


@pytest.mark.parametrize("settings", EXAMPLES, ids=lambda s: type(s).__name__)
def test_settings_survive_the_command_line_they_build(settings):
    argv = command_line("job", settings)[2:]  # after "-m sweet_jax.job"
    fv = flags.FlagValues()
    define_settings(type(settings), fv)
    rest = fv(["prog", *argv])
    assert settings_from_flags(type(settings), rest[1:], fv) == settings


def test_defaults_are_left_off_the_command_line_and_required_flags_are_not():
    s = PairsSettings(input="/r", output="/p")
    assert command_line("best_of_n", s, subcommand="pairs") == ["-m", "sweet_jax.best_of_n", "pairs", "--input=/r",
                                                                "--output=/p"]
    assert command_line("train", config="configs/critic_tiny.py", overrides={"optim.lr": 0.001}) == [
        "-m", "sweet_jax.train", "--config=configs/critic_tiny.py", "--config.optim.lr=0.001"]
    assert "--noreference_model" not in command_line("x", RankSettings(critic="c", input="i", output="o"))
    assert command_line("x", dataclasses.replace(s, no_prompt=True))[-1] == "--no_prompt"


def test_judge_specs_round_trip():
    specs = [judge_spec("a", "/m"), judge_spec("b", "/h", "head", "no-info"), judge_spec("c", "/c", "critic", "sum")]
    got = parse_judges(specs)
    assert got["a"] == dict(model="/m", kind="critic", no_info=False, use_sum=False, no_header=False)
    assert got["b"]["kind"] == "head" and got["b"]["no_info"] and got["c"]["use_sum"]
    with pytest.raises(ValueError):
        judge_spec("d", "/m", "critic", "fast")


COMMANDS = [["train", "--config", "configs/critic_tiny.py"], ["plan", "--config", "configs/critic_tiny.py"],
            ["collect", "--config", "configs/collect_backend.py"],
            ["pipeline", "--config", "configs/sweet_backend_tiny.py"], ["best_of_n", "pairs"],
            ["tasks", "generate"], ["evaluate"], ["serve"], ["report", "/nowhere"], ["random_init"]]


def test_every_command_gives_the_same_error_for_a_misspelt_flag():
    done = budget.run_side_by_side([[sys.executable, "-m", f"sweet_jax.{cmd[0]}", *cmd[1:], "--no-such-flag=1"]
                                    for cmd in COMMANDS], cwd=ROOT)
    for cmd, proc in zip(COMMANDS, done):
        err = proc.stderr
        assert proc.returncode == 2, (cmd, err[-2000:])
        assert err.strip().splitlines()[-1] == "error: bad command line: Unknown command line flag 'no_such_flag'", \
            (cmd, err[-2000:])


def test_every_config_command_names_a_misspelt_field_and_the_closest_known_ones():
    cases = [(["train", "--config", "configs/critic_tiny.py", "--config.run_dir=/tmp/x"],
              "unknown config field 'run_dir' (--config.run_dir) in configs/critic_tiny.py; "
              "the closest known fields: train.output_dir"),
             (["plan", "--config=configs/critic_8b.py", "--config.optim.lrr=1"],
              "unknown config field 'optim.lrr' (--config.optim.lrr) in configs/critic_8b.py; "
              "the closest known fields: optim.lr,"),
             (["collect", "--config", "configs/collect_backend.py", "--config.agent.modle=x"],
              "unknown config field 'agent.modle' (--config.agent.modle) in configs/collect_backend.py; "
              "the closest known fields: agent.model,"),
             (["pipeline", "--config", "configs/sweet_backend_tiny.py", "--config.trian.overrides=()"],
              "unknown config field 'trian.overrides' (--config.trian.overrides) in configs/sweet_backend_tiny.py; "
              "the closest known fields: ")]
    done = budget.run_side_by_side([[sys.executable, "-m", f"sweet_jax.{args[0]}", *args[1:]] for args, _ in cases],
                                   cwd=ROOT)
    for (args, msg), proc in zip(cases, done):
        err = proc.stderr
        assert proc.returncode == 2, (args, err[-2000:])
        assert err.strip().splitlines()[-1].startswith("error: bad command line: " + msg), (args, err[-2000:])


def test_a_missing_subcommand_or_required_flag_is_a_one_line_error():
    for args, msg in ((["best_of_n"], "unknown or missing subcommand: expected one of sample, rank, rank_vision, pairs, evaluate"),
                      (["best_of_n", "pairs", "--input", "x"], "--output"),
                      (["train"], "--config is required")):
        proc = subprocess.run([sys.executable, "-m", f"sweet_jax.{args[0]}", *args[1:]], cwd=ROOT,
                              capture_output=True, text=True, timeout=budget.time_left())
        assert proc.returncode == 2 and "error: bad command line:" in proc.stderr and msg in proc.stderr, \
            (args, proc.stderr[-2000:])


def test_flags_spelt_with_dashes_run_a_real_subcommand(tmp_path):
    import json

    from sweet_jax.colbench import synthetic
    from sweet_jax.files.jsonl import write_jsonl

    ranked = write_jsonl(tmp_path / "ranked.jsonl", synthetic.make_ranked_records(3, seed=0))
    proc = subprocess.run([sys.executable, "-m", "sweet_jax.best_of_n", "pairs", "--input", ranked, "--output",
                           str(tmp_path / "pairs.jsonl"), "--num-pairs", "2", "--no-prompt"], cwd=ROOT,
                          capture_output=True, text=True, timeout=budget.time_left())
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"states": 3, "pairs": 6}
    rows = [json.loads(line) for line in open(tmp_path / "pairs.jsonl")]
    assert len(rows) == 6 and all(set(r) == {"chosen", "rejected"} for r in rows)  # --no-prompt took effect
