"""The offline trainer end to end, through `python -m sweet_jax.train` (tiny model, synthetic data)."""

import glob
import json
import os
import subprocess
import sys

import budget
import numpy as np
import pytest
import safetensors.numpy
from multidevice import device_flags, run_processes
from system import train_then_kill

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A few-second critic job: 40 synthetic tasks, accumulation over 2 micro-batches, a checkpoint every 2 steps.
SMALL = [
    "--config.data.synthetic.num_tasks=40", "--config.data.eval_fraction=0.2", "--config.train.epochs=2",
    "--config.optim.batch_size=4", "--config.optim.micro_batch_size=2", "--config.train.checkpoint_every=2",
    "--config.train.eval_every=0", "--config.train.log_every=1", "--config.train.export_dtype=float32",
    "--config.model.preset_overrides.num_layers=1",
]


def _cmd(config, out, *extra):
    return [sys.executable, "-m", "sweet_jax.train", "--config", os.path.join(ROOT, "configs", config),
            f"--config.train.output_dir={out}", *SMALL, *extra]


def _run(config, out, *extra):
    return subprocess.run(_cmd(config, out, *extra), cwd=ROOT, capture_output=True, text=True,
                          timeout=budget.time_left())


def _hf_tensors(run_dir):
    return safetensors.numpy.load_file(os.path.join(run_dir, "hf", "model.safetensors"))


@pytest.mark.slow
def test_kill_9_then_resume_gives_identical_params(tmp_path):
    ref = _run("critic_tiny.py", tmp_path / "uninterrupted")
    assert ref.returncode == 0, ref.stderr[-3000:]
    total = json.loads((tmp_path / "uninterrupted" / "metrics.json").read_text())["steps"]
    assert total >= 10

    out = tmp_path / "killed"
    killed_at = train_then_kill(_cmd("critic_tiny.py", out), out, 4, budget.time_left())
    assert killed_at < total, "the job finished before it could be killed"
    assert not (out / "metrics.json").exists()

    resumed = _run("critic_tiny.py", out)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stderr
    a, b = _hf_tensors(tmp_path / "uninterrupted"), _hf_tensors(out)
    assert sorted(a) == sorted(b)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["steps"] == total


@pytest.mark.slow
@pytest.mark.parametrize("config, extra", [
    ("policy_tiny.py", ["--config.data.synthetic.num_tasks=12"]),
    ("critic_tiny.py", ["--config.data.kind=rft", "--config.objective=sft"]),
    ("critic_tiny.py", ["--config.loss.reference=recompute", "--config.loss.reduction=turn_mean_sum",
                        "--config.data.score_span=assistant", "--config.loss.nll_coef=0.01"]),
    ("critic_tiny.py", ["--config.objective=reward"]),
    ("critic_tiny.py", ["--config.objective=value", "--config.data.kind=turn_values"]),
])
def test_objectives_train_and_export(tmp_path, config, extra):
    proc = _run(config, tmp_path / "run", *extra)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["steps"] > 0 and all(np.isfinite(v) for v in result["held_out"].values())
    hf = json.loads((tmp_path / "run" / "hf" / "config.json").read_text())
    head = any(e in ("--config.objective=reward", "--config.objective=value") for e in extra)
    assert hf["architectures"] == ["LlamaForSequenceClassification" if head else "LlamaForCausalLM"]
    if head:  # both the run directory and its export load as a score-head model
        from sweet_jax.models.loading import load_model

        for path in (tmp_path / "run", tmp_path / "run" / "hf"):
            cfg, params, _ = load_model(str(path))
            assert cfg.score_head and params["score"].shape == (cfg.hidden_size,)
    assert (tmp_path / "run" / "hf" / "tokenizer.json").exists()
    # TensorBoard's file holds the held-out metrics at the last step, as the summary gives them
    from test_tensorboard import read_events

    [events_file] = glob.glob(str(tmp_path / "run" / "tb" / "events.out.tfevents.*"))
    last = {v.tag: v.simple_value for e in read_events(events_file) if e.step == result["steps"]
            for v in e.summary.value}
    for k, v in result["held_out"].items():
        assert last[f"eval/{k}"] == pytest.approx(v, rel=1e-5, abs=1e-6), k


def test_bad_data_fails_with_file_line_and_leaves_no_checkpoint(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"task": {}, "dialogue_history": [{"role": "user", "content": "hi"}], "reward": 1}\n')
    proc = _run("critic_tiny.py", tmp_path / "run", f"--config.data.path={bad}")
    assert proc.returncode == 2
    assert f"{bad}:1: field 'dialogue_history[0].role'" in proc.stderr
    assert not (tmp_path / "run" / "checkpoints").exists() and not (tmp_path / "run" / "metrics.json").exists()


@pytest.mark.slow
def test_resuming_into_a_checkpoint_of_another_training_state_is_a_clear_error(tmp_path):
    out = tmp_path / "run"
    first = _run("critic_tiny.py", out, "--config.train.epochs=1")
    assert first.returncode == 0, first.stderr[-3000:]
    again = _run("critic_tiny.py", out, "--config.train.epochs=1", "--config.optim.freeze=")
    assert again.returncode == 2 and "Traceback" not in again.stderr
    assert f"{out / 'checkpoints'}: the checkpoint at step" in again.stderr and "optim.freeze" in again.stderr


def test_missing_model_says_what_to_download(tmp_path):
    cmd = [sys.executable, "-m", "sweet_jax.train", "--config", os.path.join(ROOT, "configs", "critic_8b.py"),
           f"--config.train.output_dir={tmp_path / 'run'}", f"--config.model.hf_path={tmp_path / 'nope'}"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=budget.time_left())
    assert proc.returncode == 2
    assert "meta-llama/Llama-3.1-8B-Instruct" in proc.stderr and "--config.model.hf_path" in proc.stderr


def test_misspelt_override_is_one_clear_line(tmp_path):
    proc = _run("critic_tiny.py", tmp_path / "run", "--config.optim.lrr=1e-6")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert ("error: bad command line: unknown config field 'optim.lrr' (--config.optim.lrr) in "
            f"{os.path.join(ROOT, 'configs', 'critic_tiny.py')}; the closest known fields: optim.lr,") in proc.stderr
    assert not (tmp_path / "run").exists()


def _assert_same_training(run_a, run_b, held_out_keys) -> dict:
    """Two runs took the same number of steps and agree (1e-4) on these held-out metrics and on every exported
    weight. Returns run_a's metrics."""
    a = json.loads((run_a / "metrics.json").read_text())
    b = json.loads((run_b / "metrics.json").read_text())
    assert a["steps"] == b["steps"] > 0
    for k in held_out_keys:
        assert abs(a["held_out"][k] - b["held_out"][k]) <= 1e-4, (k, a["held_out"][k], b["held_out"][k])
    ta, tb = _hf_tensors(run_a), _hf_tensors(run_b)
    assert max(float(np.abs(ta[k] - tb[k]).max()) for k in ta) <= 1e-4
    return a


@pytest.mark.slow
def test_packed_pairs_train_like_plain_pairs(tmp_path):
    """The critic job on prefix-shared rows (the default) and on plain rows: same held-out metrics and weights."""
    packed = _run("critic_tiny.py", tmp_path / "packed", "--config.optim.lr=1e-4")
    plain = _run("critic_tiny.py", tmp_path / "plain", "--config.optim.lr=1e-4", "--config.data.pack_pairs=False")
    assert packed.returncode == 0 and plain.returncode == 0, (packed.stderr + plain.stderr)[-3000:]
    assert "one prefix-shared row per pair" in packed.stderr and "prefix-shared" not in plain.stderr
    _assert_same_training(tmp_path / "packed", tmp_path / "plain", ("loss", "accuracy", "margin", "chosen_reward"))


@pytest.mark.slow
def test_packed_examples_train_like_plain_examples(tmp_path):
    """Rejection fine-tuning on rows of several examples (the default) and on one example per row: the same held-out
    metrics and weights."""
    # the synthetic examples are 130-171 tokens (plain rows: 192): rows of 512 hold 3 of them, 11% fewer tokens in
    # batches of 12 (in batches of 8, the 3 rows of 512 are as many tokens as 8 of 192)
    args = ("--config.optim.lr=1e-4", "--config.optim.batch_size=12", "--config.optim.micro_batch_size=12",
            "--config.data.pack_length=512")
    packed = _run("rft_tiny.py", tmp_path / "packed", *args)
    plain = _run("rft_tiny.py", tmp_path / "plain", *args, "--config.data.pack_examples=False")
    assert packed.returncode == 0 and plain.returncode == 0, (packed.stderr + plain.stderr)[-3000:]
    assert "fewer padded tokens: packed rows" in packed.stderr and "fewer padded tokens" not in plain.stderr
    a = _assert_same_training(tmp_path / "packed", tmp_path / "plain", ("loss", "tokens"))
    b = json.loads((tmp_path / "plain" / "metrics.json").read_text())
    assert abs(a["last_train"]["loss"] - b["last_train"]["loss"]) <= 1e-4


@pytest.mark.slow
def test_training_on_an_8_device_mesh_matches_one_device(tmp_path):
    # 3-pair eval batches: padded to the 4 batch shards; one epoch (its steps are enough to compare, and each of the
    # three runs costs more on 8 simulated devices than on one)
    mesh_args = ["--config.optim.batch_size=4", "--config.optim.micro_batch_size=4", "--config.train.eval_batch_size=3",
                 "--config.optim.lr=1e-4", "--config.train.epochs=1"]
    one = _run("critic_tiny.py", tmp_path / "one", *mesh_args)
    assert one.returncode == 0, one.stderr[-3000:]
    env = dict(os.environ, XLA_FLAGS=device_flags(8), JAX_PLATFORMS="cpu")
    eight = subprocess.run(_cmd("critic_tiny.py", tmp_path / "eight", *mesh_args, "--config.mesh.data=2",
                                "--config.mesh.fsdp=2", "--config.mesh.tensor=2"),
                           cwd=ROOT, capture_output=True, text=True, timeout=budget.time_left(), env=env)
    assert eight.returncode == 0, eight.stderr[-3000:]
    assert "mesh {'data': 2, 'fsdp': 2, 'tensor': 2} on 8 cpu device(s)" in eight.stderr
    a = json.loads((tmp_path / "one" / "metrics.json").read_text())
    b = json.loads((tmp_path / "eight" / "metrics.json").read_text())
    assert a["steps"] == b["steps"] > 0
    for k in ("loss", "accuracy", "margin", "chosen_reward"):
        assert abs(a["held_out"][k] - b["held_out"][k]) <= 1e-4, (k, a["held_out"][k], b["held_out"][k])
    ta, tb = _hf_tensors(tmp_path / "one"), _hf_tensors(tmp_path / "eight")
    assert max(float(np.abs(ta[k] - tb[k]).max()) for k in ta) <= 1e-4

    # The same mesh over two processes of 4 devices each (a multi-host job): each collates its half of every batch;
    # process 0 writes the run files, the HF export gathers every tensor across both.
    two = run_processes(_cmd("critic_tiny.py", tmp_path / "two", *mesh_args, "--config.mesh.data=2",
                             "--config.mesh.fsdp=2", "--config.mesh.tensor=2"), cwd=ROOT)
    for p in two:
        assert p.returncode == 0, p.stderr[-3000:]
    assert "on 8 cpu device(s), 2 process(es)" in two[0].stderr
    results = [[line for line in p.stdout.splitlines() if line.startswith("{")] for p in two]  # (gloo logs too)
    assert json.loads(results[0][-1])["steps"] == a["steps"] and not results[1]  # one summary, from process 0
    c = json.loads((tmp_path / "two" / "metrics.json").read_text())
    for k in ("loss", "accuracy", "margin", "chosen_reward"):
        assert abs(a["held_out"][k] - c["held_out"][k]) <= 1e-4, (k, a["held_out"][k], c["held_out"][k])
    tc = _hf_tensors(tmp_path / "two")
    assert max(float(np.abs(ta[k] - tc[k]).max()) for k in ta) <= 1e-4

    bad = subprocess.run(_cmd("critic_tiny.py", tmp_path / "bad", "--config.optim.micro_batch_size=2"), cwd=ROOT,
                         capture_output=True, text=True, timeout=budget.time_left(), env=env)  # fsdp=-1: 8 batch shards
    assert bad.returncode == 2 and "optim.micro_batch_size=2 must be a multiple of 8, so that its 2 sequences split over the mesh's batch shards (data x fsdp = 8)" \
        in bad.stderr, bad.stderr[-2000:]  # packed pairs: one row each
    plain = subprocess.run(_cmd("critic_tiny.py", tmp_path / "bad", "--config.optim.micro_batch_size=2",
                                "--config.data.pack_pairs=False"), cwd=ROOT, capture_output=True, text=True,
                           timeout=budget.time_left(), env=env)
    assert plain.returncode == 2 and "optim.micro_batch_size=2 must be a multiple of 4, so that its 2 x 2 sequences split over the mesh's batch shards (data x fsdp = 8)" \
        in plain.stderr, plain.stderr[-2000:]
    few = _run("critic_tiny.py", tmp_path / "few", "--config.mesh.fsdp=4")
    assert few.returncode == 2 and "mesh {'data': 1, 'fsdp': 4, 'tensor': 1} needs 4 devices, have 1" in few.stderr
