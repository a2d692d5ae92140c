"""`python -m sweet_jax.evaluate_model` on 20 real ColBench backend test tasks (skipped without ../shared/colbench/):
a tiny training run's Orbax checkpoint served by the project's engine against itself; a scripted agent and simulator
behind endpoints, whose answers pass on half the tasks, killed with SIGKILL mid-way and resumed with no finished task
asked again; SmolLM2-135M-Instruct served by vLLM's CPU build. Every time, the metrics equal what
`python -m sweet_jax.evaluate` makes of the same transcripts, and the HAL harness's file holds each task's answer."""

import json
import os
import signal
import subprocess
import sys
import time

import budget
import pytest
from fake_openai import FakeOpenAI
from system import colbench_file, needs_bwrap, smollm2_dir

from sweet_jax.colbench import synthetic
from sweet_jax.files.jsonl import read_jsonl

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VLLM_PYTHON = os.environ.get("SWEET_JAX_VLLM_PYTHON", "")
TASKS = 20


def _command(tasks: str, out, *args: str) -> list[str]:
    return [sys.executable, "-m", "sweet_jax.evaluate_model", "--task_type", "backend", "--tasks", tasks,
            "--limit", str(TASKS), "--output", str(out), *args]


def _check_against_evaluate(out, tmp_path) -> dict:
    """The evaluation's metrics, checked against `sweet_jax.evaluate` on its transcripts and its HAL file."""
    metrics = json.loads((out / "metrics.json").read_text())
    records = read_jsonl(out / "trajectories.jsonl")
    assert metrics["tasks"] == TASKS and metrics["records"] == len(records) == TASKS
    scored = tmp_path / "rescored.jsonl"
    proc = subprocess.run([sys.executable, "-m", "sweet_jax.evaluate", "--task-type", "backend", "--input",
                           str(out / "trajectories.jsonl"), "--output", str(scored)], cwd=ROOT, capture_output=True,
                          text=True, timeout=budget.time_left())
    assert proc.returncode == 0, proc.stderr[-3000:]
    again = json.loads(proc.stdout.strip().splitlines()[-1])
    assert metrics["tests_passed"]["mean"] == pytest.approx(again["tests_passed"], abs=1e-12)
    assert metrics["success_rate"]["mean"] == pytest.approx(again["success_rate"], abs=1e-12)
    assert [r["reward"] for r in records] == [r["reward"] for r in read_jsonl(scored)]
    lo, hi = metrics["success_rate"]["ci95"]
    assert lo <= metrics["success_rate"]["mean"] <= hi
    hal = json.loads((out / "hal_agent_output.json").read_text())
    assert sorted(hal, key=int) == [str(i) for i in range(TASKS)]
    assert all(hal[str(r["task_id"])]["answer"] == r["answer"] for r in records)
    assert metrics["hal"]["accuracy"] == metrics["success_rate"]["mean"]
    return metrics


@needs_bwrap
@pytest.mark.slow
def test_a_training_runs_checkpoint_against_itself_on_real_tasks(tmp_path):
    tasks = colbench_file("backend_test.jsonl")
    run = tmp_path / "critic"
    train = [sys.executable, "-m", "sweet_jax.train", "--config", os.path.join(ROOT, "configs", "critic_tiny.py"),
             f"--config.train.output_dir={run}", "--config.data.synthetic.num_tasks=16",
             "--config.data.eval_fraction=0.25", "--config.train.epochs=1", "--config.optim.batch_size=4",
             "--config.optim.micro_batch_size=4", "--config.train.eval_every=0", "--config.train.export_hf=False"]
    proc = subprocess.run(train, cwd=ROOT, capture_output=True, text=True, timeout=budget.time_left())
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = tmp_path / "eval"
    proc = subprocess.run(_command(tasks, out, "--model", str(run), "--max_steps", "2", "--agent_max_tokens", "24",
                                   "--simulator_max_tokens", "12", "--max_model_len", "2048"),
                          cwd=ROOT, capture_output=True, text=True, timeout=budget.time_left())
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "success rate:" in proc.stdout and "tests passed:" in proc.stdout
    metrics = _check_against_evaluate(out, tmp_path)
    assert metrics["model"] == str(run)
    assert "sweet_jax.serve" in (out / "logs" / "agent.serve.log").read_text()


@needs_bwrap
@pytest.mark.slow
def test_scripted_endpoints_score_as_evaluate_does_and_a_kill_9_loses_no_finished_task(tmp_path):
    tasks_file = colbench_file("backend_test.jsonl")
    tasks = read_jsonl(tasks_file)[:TASKS]
    out = tmp_path / "eval"
    with FakeOpenAI(tasks, delay_s=0.3) as fake:
        cmd = _command(tasks_file, out, "--model", "scripted-agent", "--backend", "endpoint", "--agent_url",
                       fake.url, "--simulator_backend", "endpoint", "--simulator_url", fake.url,
                       "--concurrency", "2")
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        partial = out / "trajectories.jsonl.partial"
        deadline = time.time() + budget.time_left() - 60
        while time.time() < deadline and proc.poll() is None:
            if partial.exists() and partial.read_text().count("\n") >= 6:
                break
            time.sleep(0.1)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert not (out / "metrics.json").exists(), "the evaluation finished before it could be killed"
        done = {r["task_id"] for r in read_jsonl(partial)} if partial.read_text().strip() else set()
        assert len(done) >= 6
        asked_before = dict(fake.asked)
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=budget.time_left())
        assert proc.returncode == 0, proc.stderr[-3000:]
        asked_again = {i: n - asked_before.get(i, 0) for i, n in fake.asked.items() if n > asked_before.get(i, 0)}
    assert not set(asked_again) & done, f"finished tasks asked again: {sorted(set(asked_again) & done)}"
    metrics = _check_against_evaluate(out, tmp_path)
    # the script answers the even tasks with their ground truth and the odd ones wrongly
    assert 0.3 <= metrics["success_rate"]["mean"] <= 0.5, metrics["success_rate"]
    # a finished evaluation is read back, with nothing served or asked
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=budget.time_left())
    assert proc.returncode == 0 and json.loads((out / "metrics.json").read_text())["records"] == TASKS


@needs_bwrap
@pytest.mark.slow
@pytest.mark.skipif(not (VLLM_PYTHON and os.path.exists(VLLM_PYTHON)),
                    reason="no vLLM environment (SWEET_JAX_VLLM_PYTHON; `bash launch/setup_vllm.sh`)")
def test_smollm2_served_by_vllm_on_real_tasks(tmp_path):
    tasks = colbench_file("backend_test.jsonl")
    out = tmp_path / "eval"
    proc = subprocess.run(_command(tasks, out, "--model", smollm2_dir(), "--backend", "vllm", "--agent_api", "chat",
                                   "--max_steps", "2", "--agent_max_tokens", "32", "--simulator_max_tokens", "8",
                                   "--max_model_len", "4096", "--dtype", "float32", "--memory_fraction", "0.15",
                                   "--server_args=--enforce-eager"),
                          cwd=ROOT, capture_output=True, text=True, timeout=budget.time_left())
    assert proc.returncode == 0, proc.stderr[-3000:]
    _check_against_evaluate(out, tmp_path)
    assert "vllm.entrypoints.openai.api_server" in (out / "logs" / "agent.serve.log").read_text()


@pytest.mark.slow
def test_an_adapter_on_its_base_plays_as_the_merged_model(tmp_path):
    """`--model BASE --adapter PEFT_DIR` rolls out exactly what the merged model rolls out (the same seeded turns);
    the adapter's weights are far from zero, so a server that ignored it would say something else."""
    import jax

    from sweet_jax import chat, models
    from sweet_jax.models import lora
    from sweet_jax.training.defaults import TINY_MODEL, TINY_TOKENIZER

    cfg = models.LlamaConfig.preset("tiny", **{**TINY_MODEL, "num_layers": 1})
    settings = models.model_configs.LoraSettings(rank=4, alpha=8.0, targets=("q_proj", "v_proj", "down_proj"))
    base = models.init_params(cfg, jax.random.key(0), std=0.1)
    adapters = jax.tree.map(lambda x: x + 0.3, lora.init_adapters(cfg, settings, jax.random.key(3)))
    models.save_hf_params(base, cfg, tmp_path / "base")
    models.save_hf_params(lora.merge(base, adapters, settings), cfg, tmp_path / "merged")
    lora.save_peft_adapter(tmp_path / "adapter", adapters, cfg, settings)
    for d in ("base", "merged"):
        chat.find_tokenizer(TINY_TOKENIZER).save_pretrained(str(tmp_path / d))
    tasks = tmp_path / "tasks.jsonl"
    synthetic.write_dataset(tmp_path / "traj.jsonl", num_tasks=3, rollouts=1, seed=0)
    tasks.write_text("".join(json.dumps(json.loads(line)["task"]) + "\n" for line in open(tmp_path / "traj.jsonl")))
    turns = {}
    with FakeOpenAI(read_jsonl(tasks)) as simulator:
        for name, model in (("adapter", ["--model", str(tmp_path / "base"), "--adapter", str(tmp_path / "adapter")]),
                            ("merged", ["--model", str(tmp_path / "merged")])):
            out = tmp_path / name
            cmd = [sys.executable, "-m", "sweet_jax.evaluate_model", "--task_type", "backend", "--tasks", str(tasks),
                   "--output", str(out), *model, "--simulator_backend", "endpoint", "--simulator_url", simulator.url,
                   "--max_steps", "2", "--agent_max_tokens", "8", "--max_model_len", "1024"]
            proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=budget.time_left())
            assert proc.returncode == 0, proc.stderr[-3000:]
            turns[name] = [[t["content"] for t in r["dialogue_history"] if t["role"] == "assistant"]
                           for r in read_jsonl(out / "trajectories.jsonl")]
    assert turns["adapter"] == turns["merged"] and len(turns["adapter"]) == 3
